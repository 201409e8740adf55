"""The lease heartbeat's thread belongs to its runtime: started by the first
lap, stopped by ``Runtime.close()`` (no process-wide table of threads that
never stop)."""

from __future__ import annotations

from pathlib import Path

from agent_worker import InProcessWorker
from agent_worker.engine.heartbeat import Heartbeat


def test_close_stops_the_runtimes_heartbeat_thread(tmp_path: Path) -> None:
    w = InProcessWorker(f"sqlite:///{tmp_path / 'h.db'}")
    with Heartbeat(w.rt, "no-such-run", 1, "me"):
        beater = w.rt.heartbeat
        assert beater is not None and beater.thread.is_alive()  # type: ignore[attr-defined]
    other = InProcessWorker(f"sqlite:///{tmp_path / 'h2.db'}")
    with Heartbeat(other.rt, "no-such-run", 1, "me"):
        assert other.rt.heartbeat is not beater
    w.close()
    other.close()
    assert w.rt.heartbeat is None and not beater.thread.is_alive()  # type: ignore[attr-defined]
