"""One conformance suite for every Store implementation: SQLite (in-process
mode) and Postgres (production). Pure store behaviour, no workers."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Text, cast, event, select

from agent_worker.core.errors import (
    AlreadyDecidedError,
    IdempotencyConflictError,
    InvalidStateError,
    LeaseLost,
)
from agent_worker.core.messages import Message
from agent_worker.core.vocabulary import WaitingFor
from agent_worker.store.base import ApprovalRecord, EffectIntent, LapCommit, NewRun, RunUpdate
from agent_worker.store.rows import checkpoints, messages
from agent_worker.store.sql import SqlStore
from tests.conftest import DatabaseClock
from tests.store_helpers import sent_to_postgres

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
def travel(request: pytest.FixtureRequest) -> Iterator[Callable[[float], datetime]]:
    """Let ``seconds`` more pass on the clock of the test's store (``store``
    or ``own_store``); returns the caller's ``now`` then. SQLite's clock is
    the caller's (store.dbtime); Postgres keeps its own, which a test
    database lets us move (set back when the test ends)."""
    store: SqlStore = request.getfixturevalue(
        "own_store" if "own_store" in request.fixturenames else "store")
    clock = (DatabaseClock(store.engine.url.render_as_string(hide_password=False))
             if store.engine.dialect.name == "postgresql" else None)
    passed = [0.0]

    def go(seconds: float) -> datetime:
        if clock is not None:
            clock.advance(seconds=seconds)
        passed[0] += seconds
        return NOW + timedelta(seconds=passed[0])

    yield go
    if clock is not None:
        clock.reset()


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


def test_the_claim_is_fenced_on_the_versions_served(store: SqlStore) -> None:
    """Old code never claims a run pinned to a version it does not serve
    (nothing served at all included); a caller that names none claims any."""
    rid = _uid("r")
    store.create_run(_new(rid))
    for served in ([], ["a@2"], ["b@1", "a@2"]):
        assert store.claim(rid, 1, owner="old", now=NOW, lease_seconds=10,
                           window_messages=10, served=served) is None
    run = store.get_run(rid)
    assert run is not None and run.lease_owner is None and run.lap_attempts == 0
    claim = store.claim(rid, 1, owner="new", now=NOW, lease_seconds=10, window_messages=10,
                        served=["a@2", "a@1"])
    assert claim is not None and claim.checkpoint == {"schema_version": 2, "message_count": 1}
    assert store.claim(rid, 1, owner="new", now=NOW, lease_seconds=10,
                       window_messages=10) is not None  # the same attempt, again


def test_wrong_lap_is_not_claimed(store: SqlStore) -> None:
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 2, owner="a", now=NOW, lease_seconds=10, window_messages=10) is None


def test_a_plain_lap_commit_is_one_statement_on_postgres(database_url: str) -> None:
    """The lap commit keeps one round trip (in autocommit: one fsync) on Postgres:
    the fenced UPDATE and the inserts, generated from ``store.lapcommit``'s one
    description of the run row, go as one statement of CTEs. Counted at the
    driver: whatever any layer sends."""
    store = SqlStore(database_url)
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 1, owner="a", now=NOW, lease_seconds=10, window_messages=10)
    try:
        with sent_to_postgres() as sent:
            assert _commit(store, rid, 1, "a", 1) is True
    finally:
        store.dispose()
    assert len(sent) == 1 and sent[0].lstrip().startswith("WITH fenced AS"), sent


def test_lap_json_is_stored_without_separator_spaces(store: SqlStore) -> None:
    """Every lap writes its checkpoint, messages and event as JSON; the spaces
    of ``json.dumps``'s default separators were ~3% of a lap's bytes."""
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 1, owner="a", now=NOW, lease_seconds=10, window_messages=10)
    assert _commit(store, rid, 1, "a", 1) is True
    with store.engine.connect() as c:
        texts = [c.execute(select(cast(checkpoints.c.state, Text)).where(
                     checkpoints.c.run_id == rid, checkpoints.c.lap == 1)).scalar_one(),
                 c.execute(select(cast(messages.c.body, Text)).where(
                     messages.c.run_id == rid, messages.c.seq == 1)).scalar_one()]
    assert all('": ' not in t and ', "' not in t for t in texts), texts


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
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    rid, rid2 = _uid("dead"), _uid("lost")
    own_store.create_run(_new(rid))
    own_store.create_run(_new(rid2))
    assert own_store.claim(rid, 1, owner="dead", now=NOW, lease_seconds=1, window_messages=10)
    later = travel(120)
    own_store.heartbeat("w1", [("a", "1")], now=later)
    due = {d.run_id for d in own_store.sweep(now=later, handoff_seconds=10,
                                             resend_max_seconds=60)}
    assert due == {rid, rid2}
    run = own_store.get_run(rid)
    assert run is not None and run.status == "queued" and run.recoveries == 1
    # A second sweep right after finds nothing new: sent laps are marked sent.
    again = own_store.sweep(now=later, handoff_seconds=10, resend_max_seconds=60)
    assert not {rid, rid2} & {d.run_id for d in again}


def test_lap_commit_restores_a_journal_lost_in_a_crash(store: SqlStore) -> None:
    """The journal is committed without waiting for fsync; the lap commit
    carries the journaled message again, so a crash cannot leave a gap, and a
    journal that survived is not duplicated."""
    from sqlalchemy import delete

    from agent_worker.store.rows import messages

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


# Everything the untrusted-text rule keeps (agent_worker.core.untrusted): both stores must
# hand it back byte for byte, in text columns and in JSON, keys included.
KEPT = ("esc\x1b[2J\x1b]0;t\x07 cr\r tab\t nl\n del\x7f c1\x9b rtl\u200f\u202e emoji\U0001f600 "
        "gothic\U00010348 repl\ufffd quote\" back\\ spelled\\u0000")


def test_text_the_rule_keeps_round_trips_byte_for_byte(store: SqlStore) -> None:
    from agent_worker.core.messages import ToolCall

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
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    """A queued lap nobody claims is re-sent one lease TTL (10 s) after its
    send, then at doubling intervals capped at 60 s: not once per sweep."""
    rid = _uid("handoff")
    own_store.create_run(_new(rid))
    started = time.monotonic()
    resent_at: list[float] = []
    for second in range(1, 181):
        now = travel(1)
        own_store.heartbeat("w1", [("a", "1")], now=now)
        if rid in {d.run_id for d in own_store.sweep(now=now, handoff_seconds=10,
                                                     resend_max_seconds=60)}:
            # On the database's clock: Postgres' also moves by the test's own
            # run time (a few seconds on a loaded machine); SQLite's is ours.
            on_postgres = own_store.engine.dialect.name == "postgresql"
            real = time.monotonic() - started if on_postgres else 0
            resent_at.append(second + real)
    # Each gap is the hand-off's age at the last re-send (doubling from the
    # 10 s lease TTL), capped at 60 s; a sweep sees an expiry up to one tick
    # after it passes, and the ticks' lateness adds up along the doubling.
    gaps = [b - a for a, b in itertools.pairwise(resent_at)]
    assert 10 <= resent_at[0] <= 12 and len(gaps) == 4, resent_at
    assert all(least - 0.5 <= gap <= most for gap, least, most in zip(
        gaps, [10, 20, 40, 60], [13.1, 25.2, 49.4, 67], strict=True)), gaps


def test_sweeper_sends_nothing_to_a_version_no_live_worker_serves(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    rid = _uid("unserved")
    own_store.create_run(_new(rid))
    own_store.heartbeat("w1", [("a", "2")], now=travel(0))
    assert own_store.sweep(now=travel(120), handoff_seconds=10, resend_max_seconds=60) == []
    own_store.heartbeat("w2", [("a", "1")], now=travel(0))
    sent = [d.run_id for d in own_store.sweep(now=travel(0), handoff_seconds=10,
                                              resend_max_seconds=60)]
    assert sent == [rid]
    # A worker silent for longer than its heartbeat TTL no longer counts.
    later = travel(600)
    assert own_store.sweep(now=later, handoff_seconds=10, resend_max_seconds=60) == []


# --- every other method of the protocol, on both dialects -----------------------


def _claimed(store: SqlStore, owner: str = "a") -> str:
    rid = _uid("r")
    store.create_run(_new(rid))
    assert store.claim(rid, 1, owner=owner, now=NOW, lease_seconds=30, window_messages=10)
    return rid


def test_renew_lease_says_ok_lost_or_cancelled(store: SqlStore) -> None:
    rid = _claimed(store)
    assert store.renew_lease(rid, 1, owner="a", now=NOW, lease_seconds=30) == "ok"
    assert store.renew_lease(rid, 1, owner="b", now=NOW, lease_seconds=30) == "lost"
    assert store.renew_lease(rid, 2, owner="a", now=NOW, lease_seconds=30) == "lost"
    # A live lease: the cancel is left to the lap, which learns it at its next renewal.
    assert store.request_cancel(rid, reason="stop", by="bob", now=NOW) is None
    assert store.renew_lease(rid, 1, owner="a", now=NOW, lease_seconds=30) == "cancelled"


def test_renew_leases_fences_each_lease_in_one_statement(
        store: SqlStore, travel: Callable[[float], datetime]) -> None:
    """The heartbeat's batch (``store.leasebatch``) says what ``renew_lease``
    says lap by lap, extends only the leases still held, in one UPDATE."""
    held, cancelled, stolen = _uid("held"), _uid("cancelled"), _uid("stolen")
    for rid, owner, seconds in ((held, "a1", 30), (cancelled, "a2", 30), (stolen, "a3", 1)):
        store.create_run(_new(rid))
        assert store.claim(rid, 1, owner=owner, now=NOW, lease_seconds=seconds,
                           window_messages=10)
    assert store.request_cancel(cancelled, reason="stop", by="bob", now=NOW) is None
    later = travel(2)  # stolen's lease expired: the sweeper's resend was claimed anew
    assert store.claim(stolen, 1, owner="b3", now=later, lease_seconds=30, window_messages=10)
    before = {rid: store.get_run(rid) for rid in (held, stolen)}
    updates: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            updates.append(statement)

    states = store.renew_leases([(held, 1, "a1"), (cancelled, 1, "a2"), (stolen, 1, "a3"),
                                 (held, 2, "a1-next")], now=later, lease_seconds=60)
    event.remove(store.engine, "before_cursor_execute", _seen)
    assert states == {"a1": "ok", "a2": "cancelled", "a3": "lost", "a1-next": "lost"}
    assert len(updates) == 1
    after = {rid: store.get_run(rid) for rid in (held, stolen)}
    b_held, a_held, b_stolen, a_stolen = (before[held], after[held], before[stolen],
                                          after[stolen])
    assert b_held and a_held and b_stolen and a_stolen
    assert a_held.lease_expires_at and b_held.lease_expires_at
    assert a_held.lease_expires_at > b_held.lease_expires_at  # renewed, 60 s from later
    assert a_stolen.lease_owner == "b3"  # the lost lap extended nothing
    assert a_stolen.lease_expires_at == b_stolen.lease_expires_at
    assert store.renew_leases([], now=later, lease_seconds=60) == {}


def test_journaled_model_output_is_kept_from_the_first_attempt(store: SqlStore) -> None:
    rid = _claimed(store)
    first = store.journal_model_output(rid, 1, owner="a", seq=1, now=NOW,
                                       message=Message(role="assistant", content="first"))
    again = store.journal_model_output(rid, 1, owner="a", seq=1, now=NOW,
                                       message=Message(role="assistant", content="second"))
    assert first.content == again.content == "first"
    with pytest.raises(LeaseLost):
        store.journal_model_output(rid, 1, owner="intruder", seq=1, now=NOW,
                                   message=Message(role="assistant", content="x"))
    [mine] = [m for m in store.list_messages(rid, start=1)]
    assert mine.lap == 1 and mine.message.content == "first"


def test_release_is_fenced_and_a_signal_wakes_only_its_waiter(store: SqlStore) -> None:
    rid = _claimed(store)
    waiting = RunUpdate(status="waiting", waiting_for=WaitingFor.signal("go"))
    assert not store.release(rid, 1, owner="b", now=NOW, outcome=waiting, event={})
    assert store.release(rid, 1, owner="a", now=NOW, outcome=waiting, event={"kind": "paused"})
    run = store.get_run(rid)
    assert run is not None and (run.status, run.waiting_for, run.lease_owner) == (
        "waiting", "signal:go", None)
    other, due = store.send_signal(rid, "other", {"n": 1}, now=NOW)
    assert due is None and [s.id for s in store.pending_signals(rid, "other")] == [other.id]
    _, due = store.send_signal(rid, "go", None, now=NOW)
    assert due is not None and (due.run_id, due.lap) == (rid, 1)
    run = store.get_run(rid)
    assert run is not None and run.status == "queued" and run.waiting_for is None


def test_an_approval_committed_with_the_lap_is_decided_once(store: SqlStore) -> None:
    rid = _claimed(store)
    key = f"{rid}:1:0"
    approval = ApprovalRecord(
        id=_uid("ap"), run_id=rid, effect_key=key, tool_name="refund", arguments={"n": 1},
        reason="irreversible", owner="alice", status="pending", on_timeout="reject",
        escalate_to=None, requested_at=NOW, timeout_at=NOW + timedelta(hours=1),
        decided_by=None, comment=None, decided_at=None)
    assert store.commit_lap(LapCommit(
        run_id=rid, lap=1, owner="a", messages=[(1, Message(role="assistant", content="ask"))],
        checkpoint={"schema_version": 2, "message_count": 2}, schema_version=2,
        update=RunUpdate(status="waiting", waiting_for=WaitingFor.approval(approval.id)),
        usage=(1, 0, 0, 0), event={}, new_approvals=[approval], now=NOW))
    found = store.approval_for(key)
    assert found is not None and found.id == approval.id and found.status == "pending"
    assert [a.id for a in store.list_approvals(run_id=rid)] == [approval.id]
    decided, due = store.decide_approval(approval.id, None, approved=True, by="alice",
                                         comment="ok", now=NOW)
    assert decided.status == "approved" and decided.decided_by == "alice"
    assert due is not None and (due.run_id, due.lap) == (rid, 2)
    with pytest.raises(AlreadyDecidedError):
        store.decide_approval(approval.id, None, approved=False, by="bob", comment=None,
                              now=NOW)
    assert store.list_approvals(run_id=rid) == []


def test_cancel_wakes_an_idle_run_once_and_requeue_checks_the_status(store: SqlStore) -> None:
    rid = _uid("r")
    store.create_run(_new(rid))
    due = store.request_cancel(rid, reason="withdrawn", by="bob", now=NOW)
    assert due is not None and due.run_id == rid
    run = store.get_run(rid)
    assert run is not None and run.ending == "cancelled" and run.cancelled_by == "bob"
    assert store.request_cancel(rid, reason="again", by="bob", now=NOW) is None
    with pytest.raises(InvalidStateError):
        store.requeue(rid, now=NOW, from_statuses=("failed",), event={"kind": "retried"})


def test_an_unknown_effect_is_resolved_only_while_its_run_waits_on_it(store: SqlStore) -> None:
    rid = _claimed(store)
    key = f"{rid}:1:0"
    store.begin_effect(EffectIntent(key=key, run_id=rid, lap=1, call_index=0, tool_name="pay",
                                    tool_version="1", kind="irreversible", args_hash="h",
                                    args={}), owner="a", now=NOW)
    store.finish_effect(key, status="unknown", result=None, error="died mid-call", now=NOW)
    with pytest.raises(InvalidStateError):  # the run still holds its lease
        store.resolve_effect(key, applied=True, result={"id": 7}, by="op", now=NOW)
    assert store.release(rid, 1, owner="a", now=NOW, event={},
                         outcome=RunUpdate(status="waiting", waiting_for=WaitingFor.effect(key)))
    resolved = store.resolve_effect(key, applied=True, result={"id": 7}, by="op", now=NOW)
    assert resolved.status == "applied" and resolved.result == {"id": 7}
    run = store.get_run(rid)
    assert run is not None and run.status == "queued" and run.lap_attempts == 0
    with pytest.raises(AlreadyDecidedError):
        store.resolve_effect(key, applied=False, result=None, by="op", now=NOW)


def test_history_reads_and_listing(store: SqlStore) -> None:
    rid = _claimed(store)
    assert _commit(store, rid, 1, "a", 1)
    assert store.get_checkpoint(rid, 1) == {"schema_version": 2, "message_count": 2}
    assert store.get_checkpoint(rid, 7) is None
    assert [m.seq for m in store.list_messages(rid, start=0, end=1)] == [0]
    kinds = [e.kind for e in store.list_events(rid)]
    assert kinds[0] == "run_created"
    last = store.list_events(rid)[-1].id
    store.record_event(rid, 2, "note", {"x": 1}, now=NOW)
    [note] = store.list_events(rid, after_id=last)
    assert (note.kind, note.lap, note.data) == ("note", 2, {"x": 1})
    assert rid in {r.id for r in store.list_runs(tenant="t1", status="queued", limit=1000)}
    assert rid not in {r.id for r in store.list_runs(tenant="nobody")}
    assert store.list_effects(rid) == []
    assert store.current_time().tzinfo is not None


def test_prune_keeps_the_latest_checkpoint(store: SqlStore) -> None:
    rid = _claimed(store)
    assert _commit(store, rid, 1, "a", 1)
    store.prune(checkpoints_before=NOW + timedelta(days=1), ledger_before=NOW - timedelta(days=1),
                batch=100)
    kept = [c[0] for c in store.list_checkpoints(rid)]
    assert kept and kept[-1] == 1


def test_a_forgotten_worker_no_longer_serves_its_versions(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    rid, agent = _uid("r"), _uid("agent")
    own_store.create_run(replace(_new(rid), agent_name=agent))
    later = travel(120)
    own_store.heartbeat("w-gone", [(agent, "1")], now=later)
    own_store.forget_worker("w-gone")
    assert own_store.sweep(now=later, handoff_seconds=10, resend_max_seconds=60) == []
    own_store.heartbeat("w-back", [(agent, "1")], now=later)
    assert [d.run_id for d in own_store.sweep(now=later, handoff_seconds=10,
                                              resend_max_seconds=60)] == [rid]
