"""The lease heartbeat's thread belongs to its runtime: started by the first
lap, stopped by ``Runtime.close()`` (no process-wide table of threads that
never stop). Both dialects: the renewals are the store's, fenced in SQL."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import pytest

from agent_worker import InProcessWorker
from agent_worker.core.errors import LeaseLost
from agent_worker.core.messages import Message
from agent_worker.engine.heartbeat import Heartbeat
from agent_worker.store.base import NewRun
from agent_worker.store.sql import SqlStore
from tests.store_helpers import delete_run


def test_close_stops_the_runtimes_heartbeat_thread(dialect_url: str) -> None:
    w = InProcessWorker(dialect_url)
    with Heartbeat(w.rt, "no-such-run", 1, "me"):
        beater = w.rt.heartbeat
        assert beater is not None and beater.thread.is_alive()  # type: ignore[attr-defined]
    other = InProcessWorker(dialect_url)
    with Heartbeat(other.rt, "no-such-run", 1, "me"):
        assert other.rt.heartbeat is not beater
    w.close()
    other.close()
    assert w.rt.heartbeat is None and not beater.thread.is_alive()  # type: ignore[attr-defined]


def test_a_lap_past_the_time_limit_is_not_renewed(dialect_url: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The threads pool has no Celery time limit: past ``lap_time_limit_seconds``
    the heartbeat stops renewing, so the lease expires and the sweeper moves the
    run on; the lap itself stops at its next ``check()``."""
    w = InProcessWorker(dialect_url)
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


def test_one_pass_renews_every_due_lap_in_one_batch(dialect_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A threads worker's laps run past the interval together: the beater
    renews them all with one ``renew_leases`` per pass, each fenced on its
    own (the held one stays ``ok``, the ones whose run is not theirs are lost).
    The run ids are the test's own (the Postgres database is the session's)."""
    w = InProcessWorker(dialect_url)
    w.rt.settings = w.rt.settings.model_copy(update={"heartbeat_interval_seconds": 0.3})
    now = w.rt.clock.now()
    uid = uuid.uuid4().hex[:8]
    w.rt.store.create_run(NewRun(
        id=f"held-{uid}", tenant="t1", agent_name="a", agent_version="1", input={}, limits={},
        retention="full", checkpoint={"schema_version": 2, "message_count": 1},
        schema_version=2, messages=[Message(role="user", content="hi")], now=now))
    assert w.rt.store.claim(f"held-{uid}", 1, owner="me", now=now, lease_seconds=30,
                            window_messages=10)
    calls: list[int] = []
    real = w.rt.store.renew_leases

    def spy(leases: Sequence[tuple[str, int, str]], **kw: Any) -> dict[str, Any]:
        calls.append(len(leases))
        return real(leases, **kw)

    monkeypatch.setattr(w.rt.store, "renew_leases", spy)
    with ExitStack() as stack:
        held = stack.enter_context(Heartbeat(w.rt, f"held-{uid}", 1, "me"))
        others = [stack.enter_context(Heartbeat(w.rt, f"gone-{uid}-{i}", 1, f"o{i}"))
                  for i in range(40)]
        deadline = time.monotonic() + 10
        def decided() -> bool:
            return held.renewed > held.started and all(hb.state == "lost" for hb in others)

        while not decided() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert decided()
        assert sum(calls) >= 41 and len(calls) <= 2  # one pass, two if we straddled one
        assert held.state == "ok"
        held.check()
        for hb in others:
            with pytest.raises(LeaseLost):
                hb.check()
    assert isinstance(w.rt.store, SqlStore)
    delete_run(w.rt.store, f"held-{uid}")  # no later sweep recovers its lease
    w.close()
