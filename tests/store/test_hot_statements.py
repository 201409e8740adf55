"""The lap's hot statements sent by psycopg itself (``store.hotsql``) do what
SQLAlchemy did with them: the same conversions of every value, the same rows
and bytes in the database, the same exceptions, the same recovery from a
disconnect; SQLAlchemy still sends them inside a tenant scope."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Json, Jsonb
from sqlalchemy import JSON, Boolean, Connection, PickleType, create_engine, event, text
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DataError, StatementError
from sqlalchemy.sql import Executable

from agent_worker.messages import Message, ToolCall
from agent_worker.store import hotconn, hotsql, lapcommit, statements, tenancy
from agent_worker.store.base import LapCommit, NewRun, RunUpdate
from agent_worker.store.models import UTCDateTime
from agent_worker.store.pgtypes import bind_converter, result_converter
from agent_worker.store.sql import SqlStore

NOW = datetime(2026, 12, 2, 9, 30, 15, 123456, tzinfo=UTC)

HOT: dict[str, Executable] = {
    "claim": statements.CLAIM, "claim known": statements.CLAIM_KNOWN,
    "claim served": statements.CLAIM_SERVED,
    "claim known served": statements.CLAIM_KNOWN_SERVED,
    "journal": statements.JOURNAL, "lap commit": lapcommit.ONE_STATEMENT,
}

_SAMPLES: list[Any] = [
    None, NOW, NOW.astimezone(timezone(timedelta(hours=-5))), {"a": [1, "é", None]}, [],
    "text", 0, 1, 2, True, False, 1.5, JSON.NULL,
]


def _pg() -> Dialect:
    return create_engine("postgresql+psycopg://nobody@127.0.0.1/none").dialect


def _outcome(fn: Any, value: Any) -> Any:
    """What ``fn`` makes of ``value``: a comparable value, or the error's type."""
    try:
        out = fn(value) if fn is not None else value
    except (AttributeError, TypeError, ValueError) as e:  # a value of another type
        return type(e)
    if isinstance(out, Json | Jsonb):
        return (type(out), out.obj)
    return out


@pytest.mark.parametrize("name", list(HOT))
def test_each_value_is_converted_as_sqlalchemys_types_convert_it(name: str) -> None:
    dialect = _pg()
    compiled = HOT[name].compile(dialect=dialect)  # type: ignore[attr-defined]
    for bind in compiled.bind_names:
        ours = bind_converter(bind.type, dialect)
        theirs = bind.type.dialect_impl(dialect).bind_processor(dialect)
        for value in [*_SAMPLES, NOW.replace(tzinfo=None)]:
            assert _outcome(ours, value) == _outcome(theirs, value), (bind.key, value)
    for column in HOT[name].exported_columns:  # type: ignore[attr-defined]
        ours = result_converter(column.type, dialect)
        theirs = column.type.dialect_impl(dialect).result_processor(dialect, None)
        for value in [*_SAMPLES, NOW.replace(tzinfo=None)]:
            assert _outcome(ours, value) == _outcome(theirs, value), (column.key, value)


def test_the_conversions_named_are_the_ones_that_matter() -> None:
    """Aware datetimes leave as naive UTC and a naive one is refused, as
    ``UTCDateTime`` does; JSON goes compact, ``None`` as the JSON ``null``
    (SQLAlchemy's ``JSON`` default); a type converting values that is not
    named is refused rather than passed through."""
    dialect = _pg()
    to_db = bind_converter(UTCDateTime(), dialect)
    assert to_db is not None
    assert to_db(NOW.astimezone(timezone(timedelta(hours=2)))) == NOW.replace(tzinfo=None)
    with pytest.raises(ValueError, match="naive"):
        to_db(NOW.replace(tzinfo=None))
    from_db = result_converter(UTCDateTime(), dialect)
    assert from_db is not None and from_db(NOW.replace(tzinfo=None)) == NOW
    as_json = bind_converter(JSON(), dialect)
    assert as_json is not None
    null, value = as_json(None), as_json({"a": 1, "b": [1, 2]})
    assert isinstance(null, Json) and null.obj is None
    assert value.dumps(value.obj) == '{"a":1,"b":[1,2]}'
    assert bind_converter(JSON(none_as_null=True), dialect)(None) is None  # type: ignore[misc]
    as_bool = bind_converter(Boolean(), dialect)
    assert as_bool is not None and as_bool(1) is True
    with pytest.raises(TypeError, match=r"store\.pgtypes"):
        bind_converter(PickleType(), dialect)
    with pytest.raises(TypeError, match=r"store\.pgtypes"):
        result_converter(PickleType(), dialect)


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
        # Less what differs between two runs: the id and the database's clock.
        run = replace(claim.run, id="", lease_expires_at=None, enqueued_at=None)
        out.append((replace(claim, run=run), journaled, committed))
    return out


_STORED = {
    "runs": "SELECT input::text, result::text, limits::text, labels::text, "
            "(to_jsonb(r) - 'id' - 'lease_expires_at' - 'enqueued_at')::text "
            "FROM runs r WHERE id = :rid",
    "messages": "SELECT seq, lap, body::text, created_at FROM messages WHERE run_id = :rid "
                "ORDER BY seq",
    "checkpoints": "SELECT lap, schema_version, state::text, created_at FROM checkpoints "
                   "WHERE run_id = :rid ORDER BY lap",
    "events": "SELECT lap, kind, data::text, created_at FROM events WHERE run_id = :rid "
              "AND kind = 'lap_committed' ORDER BY id",
}


def _stored(store: SqlStore, rid: str) -> dict[str, list[Any]]:
    with store.engine.connect() as c:
        return {table: [tuple(row) for row in c.execute(text(sql), {"rid": rid})]
                for table, sql in _STORED.items()}


def test_the_hot_path_returns_and_stores_what_sqlalchemy_did(
        pg_store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte for byte: the same JSON text (compact, the JSON ``null`` of a
    continuing lap's result), the same timestamps, the same claims handed
    to the engine (aware datetimes), the first lap from the database and the
    second from the lap cache."""
    hot, through_sqlalchemy = _uid("hot"), _uid("sa")
    for rid in (hot, through_sqlalchemy):
        pg_store.create_run(_new(rid))
    sent: list[str] = []
    event.listen(pg_store._relaxed_engine(), "before_cursor_execute",
                 lambda *a: sent.append(a[2]))
    event.listen(pg_store.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    hot_laps = _laps(pg_store, hot)
    # Nothing through SQLAlchemy: the claims, the first lap's window read (the
    # lap cache has the second's), the journals and the commits all go
    # through psycopg itself.
    assert sent == []
    with monkeypatch.context() as m:
        m.setattr(hotsql, "applies", lambda engine: False)
        sa_laps = _laps(pg_store, through_sqlalchemy)
    # Through SQLAlchemy: two claims, one window read, two journals, two commits.
    assert len(sent) == 7 and sum("CAST(messages.body AS TEXT) AS body" in s for s in sent) == 1
    assert hot_laps == sa_laps
    assert _stored(pg_store, hot) == _stored(pg_store, through_sqlalchemy)
    run = pg_store.get_run(hot)
    assert run is not None and run.next_lap == 3 and run.updated_at == NOW + timedelta(seconds=2)


def test_a_journal_already_written_and_a_lost_fence_read_the_same(pg_store: SqlStore) -> None:
    """The journal's conflict (an earlier attempt wrote first: nothing
    returned) and the commit's failed fence (zero rows) through psycopg."""
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


def test_driver_errors_are_raised_as_sqlalchemy_raises_them(pg_store: SqlStore) -> None:
    params = {"run_id": "r", "seq": "not a number", "lap": 1, "owner": "w", "now": NOW,
              "body": {}}
    journal = statements.JOURNAL
    with hotconn.pooled(pg_store.engine) as hot, pytest.raises(DataError) as raised:
        hot.first(journal, params)
    assert "not a number" not in str(raised.value).split("[SQL:")[-1]  # parameters hidden
    with hotconn.pooled(pg_store.engine) as hot, pytest.raises(StatementError, match="naive"):
        hot.first(journal, {**params, "seq": 1, "now": NOW.replace(tzinfo=None)})
    # Each connection went back to the pool out of autocommit, as SQLAlchemy expects.
    with pg_store.engine.connect() as conn:
        assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]


def test_an_attempt_never_holds_two_connections_of_a_pool(pg_store: SqlStore) -> None:
    """A claim that cannot start from the lap cache and a journal that finds
    an earlier attempt's output read on through SQLAlchemy, on the very
    connection psycopg used: a threads worker's laps cannot drain the pool
    by each holding one while waiting for a second."""
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
    statement's failure invalidates the pool, as SQLAlchemy's own handling
    does, so ``store.retry``'s second attempt already gets a live connection."""
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


def test_inside_a_tenant_scope_sqlalchemy_sends_the_statement(pg_store: SqlStore) -> None:
    """A principal's scope goes through SQLAlchemy's ``begin`` hook
    (``store.tenancy``: it narrows a transaction, or refuses it on a
    connection bypassing row-level security): the hot path steps aside."""
    seen: list[str] = []

    def record(conn: Connection, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    def claim() -> None:
        assert pg_store.claim("nobody", 1, owner="w", now=NOW, lease_seconds=1,
                              window_messages=10) is None

    event.listen(pg_store._relaxed_engine(), "before_cursor_execute", record)
    claim()
    assert seen == []
    with tenancy.scope("t1"):
        claim()
    (claimed,) = seen
    assert claimed.startswith("UPDATE runs")
