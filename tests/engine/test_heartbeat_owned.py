"""The lease heartbeat's thread belongs to its runtime: started by the first
lap, stopped by ``Runtime.close()`` (no process-wide table of threads that
never stop)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from agent_worker import InProcessWorker
from agent_worker.engine.heartbeat import Heartbeat
from agent_worker.errors import LeaseLost


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


def test_a_lap_past_the_time_limit_is_not_renewed(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The threads pool has no Celery time limit: past ``lap_time_limit_seconds``
    the heartbeat stops renewing, so the lease expires and the sweeper moves the
    run on; the lap itself stops at its next ``check()``."""
    w = InProcessWorker(f"sqlite:///{tmp_path / 'h.db'}")
    w.rt.settings = w.rt.settings.model_copy(update={"heartbeat_interval_seconds": 0.08,
                                                     "lap_time_limit_seconds": 0.01})
    with caplog.at_level(logging.WARNING, "agent_worker.engine.heartbeat"), \
            Heartbeat(w.rt, "slow-run", 3, "me") as hb:
        deadline = time.monotonic() + 10
        while hb.state == "ok" and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(LeaseLost):
            hb.check()
    w.close()
    assert "lap 3 of slow-run ran past" in caplog.text
