"""The lap's hot statements on Postgres: one statement per step (claim,
window, journal, commit), each through SQLAlchemy, on one connection per
attempt, retried on a fresh connection after a disconnect."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

from agent_worker.core.messages import Message, ToolCall
from agent_worker.store import lapcommit, statements
from agent_worker.store.base import LapCommit, NewRun, RunUpdate
from agent_worker.store.sql import SqlStore

NOW = datetime(2026, 12, 2, 9, 30, 15, 123456, tzinfo=UTC)


def _uid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _new(run_id: str) -> NewRun:
    return NewRun(id=run_id, tenant="t1", agent_name="a", agent_version="1",
                  input={"task": "naïve ☃", "n": [1, 2.5, None]}, limits={"max_laps": 9},
                  retention="full", checkpoint={"schema_version": 2, "message_count": 1},
                  schema_version=2, messages=[Message(role="user", content="hi")], now=NOW)


def _laps(store: SqlStore, rid: str) -> list[Any]:
    """Two laps of ``rid`` through claim, journal and commit: what each returned."""
    out: list[Any] = []
    for lap in (1, 2):
        now = NOW + timedelta(seconds=lap)
        claim = store.claim(rid, lap, owner=f"w{lap}", now=now, lease_seconds=30,
                            window_messages=10, served=["a@1", "b@2"])
        assert claim is not None
        seq = int(claim.checkpoint["message_count"])
        said = Message(role="assistant", content=f"lap {lap} \u00e9\u2603 \"quoted\"",
                       tool_calls=[ToolCall(id=f"c{lap}", name="t", arguments={"k": [lap]})])
        journaled = store.journal_model_output(rid, lap, owner=f"w{lap}", seq=seq,
                                               message=said, now=now)
        result = Message(role="tool", content="ok", tool_call_id=f"c{lap}")
        committed = store.commit_lap(LapCommit(
            run_id=rid, lap=lap, owner=f"w{lap}", messages=[(seq, said), (seq + 1, result)],
            checkpoint={"schema_version": 2, "message_count": seq + 2, "facts": {"x": None}},
            schema_version=2, update=RunUpdate(status="queued", enqueue=True),
            usage=(lap, 10 * lap, 5 * lap, 7), event={"trace": [{"step": "commit"}]},
            now=now))
        out.append((claim, journaled, committed))
    return out


def test_each_step_of_a_lap_is_one_statement(pg_store: SqlStore) -> None:
    """Two laps: two claims (the second also serving the lap cache's window),
    one window read (the first lap's), two journals, two commits, and
    nothing else: the same statements whether the claim hits the cache or not."""
    rid = _uid("r")
    pg_store.create_run(_new(rid))
    sent: list[str] = []
    event.listen(pg_store._relaxed_engine(), "before_cursor_execute",
                 lambda *a: sent.append(a[2]))
    event.listen(pg_store.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    first, second = _laps(pg_store, rid)
    claim = str(statements.CLAIM.compile(dialect=pg_store.engine.dialect)).split()[0]
    commit = str(lapcommit.ONE_STATEMENT.compile(dialect=pg_store.engine.dialect))
    assert [s.split()[0] for s in sent] == [claim, "SELECT", "INSERT", "WITH",
                                            claim, "INSERT", "WITH"]
    assert sent[3] == sent[6] == commit
    assert [m.seq for m in first[0].window] == [0]
    assert [m.seq for m in second[0].window] == [0, 1, 2]
    assert first[2] and second[2]
    run = pg_store.get_run(rid)
    assert run is not None and run.next_lap == 3 and run.updated_at == NOW + timedelta(seconds=2)


def test_a_journal_already_written_and_a_lost_fence(pg_store: SqlStore) -> None:
    """The journal's conflict (an earlier attempt wrote first: its output is
    returned) and the commit's failed fence (zero rows: ``False``)."""
    rid = _uid("r")
    pg_store.create_run(_new(rid))
    assert pg_store.claim(rid, 1, owner="w", now=NOW, lease_seconds=30, window_messages=10)
    first = Message(role="assistant", content="first")
    assert pg_store.journal_model_output(rid, 1, owner="w", seq=1, message=first,
                                         now=NOW) == first
    again = pg_store.journal_model_output(rid, 1, owner="w", seq=1,
                                          message=Message(role="assistant", content="2nd"),
                                          now=NOW)
    assert again.content == "first"
    assert pg_store.commit_lap(LapCommit(
        run_id=rid, lap=1, owner="someone else", messages=[], checkpoint={},
        schema_version=2, update=RunUpdate(status="queued", enqueue=True),
        usage=(1, 0, 0, 0), event={}, now=NOW)) is False


def test_an_attempt_never_holds_two_connections_of_a_pool(pg_store: SqlStore) -> None:
    """A claim that cannot start from the lap cache and a journal that finds
    an earlier attempt's output read on, on the very connection their
    statement used: a threads worker's laps cannot drain the pool by each
    holding one while waiting for a second."""
    rid = _uid("r")
    pg_store.create_run(_new(rid))
    relaxed = pg_store._relaxed_engine()
    most = [0]

    def checked_out(*_: Any) -> None:
        most[0] = max(most[0], relaxed.pool.checkedout())  # type: ignore[attr-defined]

    event.listen(relaxed.pool, "checkout", checked_out)
    claim = pg_store.claim(rid, 1, owner="w", now=NOW, lease_seconds=30, window_messages=10)
    assert claim is not None and [m.seq for m in claim.window] == [0]
    said = Message(role="assistant", content="first")
    for _ in range(2):  # the second finds the first and reads it back
        assert pg_store.journal_model_output(rid, 1, owner="w", seq=1, message=said,
                                             now=NOW) == said
    assert most[0] == 1


def test_a_disconnect_is_retried_once_on_a_fresh_connection(
        pg_store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    """After a Postgres restart every pooled connection is dead: the first
    statement's failure invalidates the pool (SQLAlchemy's handling of a
    disconnect), so ``store.retry``'s second attempt gets a live connection."""
    rid = _uid("r")
    pg_store.create_run(_new(rid))
    relaxed = pg_store._relaxed_engine()
    with relaxed.connect() as a, relaxed.connect() as b:  # two connections pooled
        pids = [c.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
                for c in (a, b)]
    with psycopg.connect(pg_store.engine.url.render_as_string(hide_password=False)
                         .replace("+psycopg", ""), autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with caplog.at_level(logging.WARNING, logger="agent_worker.store.retry"):
        claim = pg_store.claim(rid, 1, owner="w", now=NOW, lease_seconds=30, window_messages=10)
    assert claim is not None
    retried = [r for r in caplog.records if "transient database error" in r.getMessage()]
    assert len(retried) == 1, [r.getMessage() for r in retried]
