"""One conformance suite for every Store implementation: SQLite (in-process
mode) and Postgres (production). Pure store behaviour, no workers."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_worker.errors import IdempotencyConflictError, LeaseLost
from agent_worker.messages import Message
from store.base import EffectIntent, LapCommit, NewRun, RunUpdate
from store.migrate import upgrade
from store.sql import SqlStore

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("database_url")
    s = SqlStore(url)
    yield s
    s.dispose()


@pytest.fixture
def travel(store: SqlStore, request: pytest.FixtureRequest) -> Callable[[float], datetime]:
    """Let ``seconds`` more pass on the store's clock; returns the caller's
    ``now`` then. SQLite's clock is the caller's (store.dbtime); Postgres keeps its own,
    which the test database lets us move."""
    passed = [0.0]

    def go(seconds: float) -> datetime:
        if store.engine.dialect.name == "postgresql":
            request.getfixturevalue("db_clock").advance(seconds=seconds)
        passed[0] += seconds
        return NOW + timedelta(seconds=passed[0])

    return go


def _new(run_id: str, now: datetime = NOW) -> NewRun:
    return NewRun(id=run_id, tenant="t1", agent_name="a", agent_version="1", input={"x": 1},
                  limits={}, retention="full",
                  checkpoint={"schema_version": 2, "message_count": 1}, schema_version=2,
                  messages=[Message(role="user", content="hi")], now=now)


def _commit(store: SqlStore, run_id: str, lap: int, owner: str, seq: int,
            enqueue: bool = True) -> bool:
    return store.commit_lap(LapCommit(
        run_id=run_id, lap=lap, owner=owner,
        messages=[(seq, Message(role="assistant", content=f"lap {lap}"))],
        checkpoint={"schema_version": 2, "message_count": seq + 1}, schema_version=2,
        update=RunUpdate(status="queued", enqueue=enqueue), usage=(lap, 0, 0, 0),
        event={}, now=NOW))


def _uid(name: str) -> str:
    import uuid

    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_create_run_is_idempotent_on_id(store: SqlStore) -> None:
    rid = _uid("r")
    first, created = store.create_run(_new(rid))
    again, created_again = store.create_run(_new(rid))
    assert created and not created_again
    assert first.id == again.id and first.created_at == again.created_at
    assert [c[0] for c in store.list_checkpoints(rid)] == [0]


def test_claim_is_exclusive_while_lease_lives(store: SqlStore) -> None:
    rid = _uid("r")
    store.create_run(_new(rid))
    a = store.claim(rid, 1, owner="a", now=NOW, lease_seconds=10, window_messages=10)
    b = store.claim(rid, 1, owner="b", now=NOW + timedelta(seconds=5), lease_seconds=10,
                    window_messages=10)
    assert a is not None and b is None
    assert [m.message.content for m in a.window] == ["hi"]


def test_stale_owner_cannot_commit_after_lease_is_taken(
        store: SqlStore, travel: Callable[[float], datetime]) -> None:
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 1, owner="a", now=NOW, lease_seconds=1, window_messages=10)
    later = travel(5)
    assert store.claim(rid, 1, owner="b", now=later, lease_seconds=10, window_messages=10)
    assert _commit(store, rid, 1, "a", 1) is False
    assert _commit(store, rid, 1, "b", 1) is True
    assert _commit(store, rid, 1, "b", 1) is False  # the lap moved on
    assert [c[0] for c in store.list_checkpoints(rid)] == [0, 1]
    assert len(store.list_messages(rid)) == 2


def test_wrong_lap_is_not_claimed(store: SqlStore) -> None:
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 2, owner="a", now=NOW, lease_seconds=10, window_messages=10) is None


def test_concurrent_claims_one_winner_on_postgres(database_url: str) -> None:
    """A real race needs a server (SQLite serialises writers)."""
    store = SqlStore(database_url)
    rid = _uid("r")
    store.create_run(_new(rid))
    wins: list[str] = []
    barrier = threading.Barrier(8)

    def claim(owner: str) -> None:
        barrier.wait()
        if store.claim(rid, 1, owner=owner, now=NOW, lease_seconds=10, window_messages=10):
            wins.append(owner)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.dispose()
    assert len(wins) == 1


def test_effect_intent_refuses_other_arguments(store: SqlStore) -> None:
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 1, owner="a", now=NOW, lease_seconds=10, window_messages=10)
    intent = EffectIntent(key=f"{rid}:1:0", run_id=rid, lap=1, call_index=0, tool_name="pay",
                          tool_version="1", kind="idempotent", args_hash="h1", args={"a": 1})
    row, created = store.begin_effect(intent, owner="a", now=NOW)
    assert created and row.status == "pending"
    again, created = store.begin_effect(intent, owner="a", now=NOW)
    assert not created and again.attempts == 1
    with pytest.raises(IdempotencyConflictError):
        store.begin_effect(EffectIntent(**{**intent.__dict__, "args_hash": "h2"}), owner="a",
                           now=NOW)
    with pytest.raises(LeaseLost):
        store.begin_effect(EffectIntent(**{**intent.__dict__, "key": f"{rid}:1:1"}),
                           owner="intruder", now=NOW)
    store.finish_effect(intent.key, status="applied", result={"ok": True}, error=None, now=NOW)
    store.finish_effect(intent.key, status="failed", result=None, error="late", now=NOW)
    [effect] = store.list_effects(rid)
    assert effect.status == "applied" and effect.result == {"ok": True}


def test_sweeper_recovers_expired_lease_and_overdue_queue(
        store: SqlStore, travel: Callable[[float], datetime]) -> None:
    rid, rid2 = _uid("dead"), _uid("lost")
    store.create_run(_new(rid))
    store.create_run(_new(rid2))
    assert store.claim(rid, 1, owner="dead", now=NOW, lease_seconds=1, window_messages=10)
    later = travel(120)
    store.heartbeat("w1", [("a", "1")], now=later)
    due = {d.run_id for d in store.sweep(now=later, handoff_seconds=10, resend_max_seconds=60)}
    assert {rid, rid2} <= due
    run = store.get_run(rid)
    assert run is not None and run.status == "queued" and run.recoveries == 1
    # A second sweep right after finds nothing new: sent laps are marked sent.
    again = store.sweep(now=later, handoff_seconds=10, resend_max_seconds=60)
    assert not {rid, rid2} & {d.run_id for d in again}


def test_lap_commit_restores_a_journal_lost_in_a_crash(store: SqlStore) -> None:
    """The journal is committed without waiting for fsync; the lap commit
    carries the journaled message again, so a crash cannot leave a gap, and a
    journal that survived is not duplicated."""
    from sqlalchemy import delete

    from store.rows import messages

    for lost in (False, True):
        rid = _uid("journal")
        store.create_run(_new(rid))
        assert store.claim(rid, 1, owner="a", now=NOW, lease_seconds=10, window_messages=10)
        turn = Message(role="assistant", content="plan")
        store.journal_model_output(rid, 1, owner="a", seq=1, message=turn, now=NOW)
        if lost:
            with store.engine.begin() as c:
                c.execute(delete(messages).where(messages.c.run_id == rid, messages.c.seq == 1))
        assert store.commit_lap(LapCommit(
            run_id=rid, lap=1, owner="a",
            messages=[(1, turn), (2, Message(role="tool", content="42", tool_call_id="c"))],
            checkpoint={"schema_version": 2, "message_count": 3}, schema_version=2,
            update=RunUpdate(status="queued"), usage=(1, 0, 0, 0), event={}, now=NOW))
        stored = store.list_messages(rid)
        assert [(m.seq, m.message.content) for m in stored] == [(0, "hi"), (1, "plan"), (2, "42")]


# Everything the untrusted-text rule keeps (agent_worker.untrusted): both stores must
# hand it back byte for byte, in text columns and in JSON, keys included.
KEPT = ("esc\x1b[2J\x1b]0;t\x07 cr\r tab\t nl\n del\x7f c1\x9b rtl\u200f\u202e emoji\U0001f600 "
        "gothic\U00010348 repl\ufffd quote\" back\\ spelled\\u0000")


def test_text_the_rule_keeps_round_trips_byte_for_byte(store: SqlStore) -> None:
    from agent_worker.messages import ToolCall

    rid = _uid("r")
    store.create_run(NewRun(
        id=rid, tenant="t1", agent_name="a", agent_version="1", input={f"k{KEPT}": KEPT},
        limits={}, retention="full", checkpoint={"schema_version": 2, "message_count": 1},
        schema_version=2, messages=[Message(role="user", content=KEPT)], now=NOW))
    assert store.claim(rid, 1, owner="a", now=NOW, lease_seconds=10, window_messages=10)
    model = Message(role="assistant", content=KEPT,
                    tool_calls=(ToolCall(id="c0", name="t", arguments={KEPT: [KEPT]}),))
    store.journal_model_output(rid, 1, owner="a", seq=1, message=model, now=NOW)
    key = f"{rid}:1:0"
    store.begin_effect(EffectIntent(key=key, run_id=rid, lap=1, call_index=0, tool_name="t",
                                    tool_version="1", kind="idempotent", args_hash="h",
                                    args={KEPT: KEPT}), owner="a", now=NOW)
    store.finish_effect(key, status="applied", result={KEPT: KEPT}, error=KEPT, now=NOW)
    tool_message = Message(role="tool", content=KEPT, tool_call_id="c0", name="t")
    assert store.commit_lap(LapCommit(
        run_id=rid, lap=1, owner="a", messages=[(1, model), (2, tool_message)],
        checkpoint={"schema_version": 2, "message_count": 3, "facts": {KEPT: KEPT}},
        schema_version=2, update=RunUpdate(status="succeeded", result={KEPT: KEPT},
                                           error_message=KEPT, error_detail=KEPT),
        usage=(1, 0, 0, 0), event={KEPT: KEPT}, now=NOW))
    assert [m.message for m in store.list_messages(rid)] == [
        Message(role="user", content=KEPT), model, tool_message]
    [effect] = store.list_effects(rid)
    assert (effect.args, effect.result, effect.error) == ({KEPT: KEPT}, {KEPT: KEPT}, KEPT)
    run = store.get_run(rid)
    assert run is not None and run.input == {f"k{KEPT}": KEPT}
    assert (run.result, run.error_message, run.error_detail) == ({KEPT: KEPT}, KEPT, KEPT)
    assert store.get_checkpoint(rid, 1) == {"schema_version": 2, "message_count": 3,
                                            "facts": {KEPT: KEPT}}
    assert [e.data for e in store.list_events(rid) if e.kind == "lap_committed"] == [
        {KEPT: KEPT}]

    other = _uid("r")
    store.create_run(_new(other))
    store.send_signal(other, "s", {KEPT: KEPT}, now=NOW)
    assert [s.payload for s in store.pending_signals(other, "s")] == [{KEPT: KEPT}]
    store.request_cancel(other, reason=KEPT, by=KEPT, now=NOW)
    cancelled = store.get_run(other)
    assert cancelled is not None
    assert (cancelled.cancel_reason, cancelled.cancelled_by) == (KEPT, KEPT)


def test_unclaimed_hand_off_is_resent_after_the_lease_ttl_then_backs_off(
        store: SqlStore, travel: Callable[[float], datetime]) -> None:
    """A queued lap nobody claims is re-sent one lease TTL (10 s) after its
    send, then at doubling intervals capped at 60 s: not once per sweep."""
    rid = _uid("handoff")
    store.create_run(_new(rid))
    resent_at: list[int] = []
    for second in range(1, 181):
        now = travel(1)
        store.heartbeat("w1", [("a", "1")], now=now)
        if rid in {d.run_id for d in store.sweep(now=now, handoff_seconds=10,
                                                 resend_max_seconds=60)}:
            resent_at.append(second)
    # Each gap is the hand-off's age at the last re-send (doubling), capped at
    # 60 s; a sweep sees an expiry one tick after it passes, and Postgres' clock
    # also moves by the test's own run time (about a second).
    gaps = [b - a for a, b in itertools.pairwise(resent_at)]
    assert resent_at[0] in (10, 11) and len(gaps) == 4, resent_at
    assert all(want - 3 <= gap <= want * 1.1 + 1
               for gap, want in zip(gaps, [11, 22, 44, 60], strict=True)), gaps


def test_sweeper_sends_nothing_to_a_version_no_live_worker_serves(
        store: SqlStore, travel: Callable[[float], datetime]) -> None:
    rid = _uid("unserved")
    store.create_run(_new(rid))
    store.heartbeat("w1", [("a", "2")], now=travel(0))
    assert store.sweep(now=travel(120), handoff_seconds=10, resend_max_seconds=60) == []
    store.heartbeat("w2", [("a", "1")], now=travel(0))
    assert [d.run_id for d in store.sweep(now=travel(0), handoff_seconds=10,
                                          resend_max_seconds=60)] == [rid]
    # A worker silent for longer than its heartbeat TTL no longer counts.
    later = travel(600)
    assert store.sweep(now=later, handoff_seconds=10, resend_max_seconds=60) == []
