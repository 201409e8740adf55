"""Exactly-once side effects through real ``celery -A agent_worker.tasks worker`` processes,
Postgres, Redis and a vendor process.

Each test kills pool children with armed fault points (``agent_worker.core.faults``)
and then compares two ledgers that must agree: ours (``aw.effects``) and what
really moved at the vendor (its ``/stats`` and its own SQLite journal).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent_worker.api import AgentWorker
from agent_worker.core.constants import compensation_key, effect_key
from agent_worker.core.faults import POINTS
from agent_worker.demo.vendor import VendorProcess, start_vendor
from agent_worker.store.base import RunRecord
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.principals import acting
from tests.support import Fleet, supervised, wait_for

pytestmark = pytest.mark.integration

RUN_TIMEOUT = 120.0


# --- the two ledgers ---------------------------------------------------------------


def vendor_journal(vendor: VendorProcess, run_id: str) -> list[tuple[str, str, int]]:
    """(kind, key, amount) of what really moved for ``run_id``, in the vendor's order
    (read from the vendor's own database: the order is not in ``/stats``)."""
    with closing(sqlite3.connect(vendor.db_path)) as db:
        rows = db.execute("SELECT kind, idem_key, amount_cents FROM effects "
                          "WHERE applied = 1 AND idem_key LIKE ? ORDER BY seq",
                          (f"{run_id}:%",)).fetchall()
    return [(str(k), str(key), int(a)) for k, key, a in rows]


def moved(vendor: VendorProcess, run_id: str) -> dict[str, int]:
    """How many times each of ``run_id``'s keys moved money at the vendor."""
    by_key: dict[str, int] = vendor.client.stats()["by_key"]
    return {k: n for k, n in by_key.items() if k.startswith(f"{run_id}:")}


def assert_paid_exactly_once(aw: AgentWorker, vendor: VendorProcess, run: RunRecord,
                             payments: int, amount: int = 1000) -> None:
    """One applied ledger row per lap's payment, each moved exactly once at the
    vendor, for the amount asked, and each result the model saw is the vendor's."""
    keys = [effect_key(run.id, lap, 0) for lap in range(1, payments + 1)]
    effects = aw.effects(run.id)
    assert [(e.key, e.status) for e in effects] == [(k, "applied") for k in keys], effects
    assert moved(vendor, run.id) == dict.fromkeys(keys, 1)
    assert sum(a for _, _, a in vendor_journal(vendor, run.id)) == payments * amount
    seen = [json.loads(m.message.content) for m in aw.messages(run.id)
            if m.message.role == "tool"]
    assert [r["id"] for r in seen] == [e.result["id"] for e in effects]
    assert run.status == "succeeded", run.error_detail
    assert run.result == {"paid": payments}


def fired(fleet: Fleet, point: str) -> int:
    return len(list(Path(fleet.env["AGENT_WORKER_FAULT_DIR"]).glob(f"{point}.*")))


def finish(aw: AgentWorker, run_id: str) -> RunRecord:
    return aw.wait(run_id, timeout=RUN_TIMEOUT)


# --- a worker killed at each point of the lap -----------------------------------------


@pytest.mark.parametrize("point", ["after_intent", "after_apply", "after_outcome",
                                   "after_commit"])
def test_killed_at_each_point_of_the_lap_pays_exactly_once(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path, point: str) -> None:
    """after_apply is the worst instant: the vendor took the money, the ledger
    says pending. The replay re-calls with the same key; the vendor dedupes."""
    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor:
        fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url,
                     AGENT_WORKER_FAULTS=f"{point}*2")
        fleet.beat()
        run = aw.start_run("payments", {"payments": 3})
        done = finish(aw, run.id)
        assert fired(fleet, point) == 2, "the fault point never fired"
        assert_paid_exactly_once(aw, vendor, done, 3)
        assert_laps_exactly_once(aw, run.id, 4)
        if point != "after_commit":
            assert done.recoveries >= 2


def test_vendor_without_idempotency_but_with_lookup_adopts_the_payment(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    """The vendor ignores keys (a re-call would pay twice) but can be asked by key:
    killed before the call, lookup finds nothing and the call is made; killed
    after it, lookup finds the payment and the ledger adopts it."""
    with start_vendor(tmp_path / "vendor.db", "lookup") as vendor:
        fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url,
                     AGENT_WORKER_FAULTS="after_intent,after_apply*2")
        fleet.beat()
        run = aw.start_run("charges", {"payments": 3, "tool": "charge_checked"})
        done = finish(aw, run.id)
        assert (fired(fleet, "after_intent"), fired(fleet, "after_apply")) == (1, 2)
        assert_paid_exactly_once(aw, vendor, done, 3)
        assert_laps_exactly_once(aw, run.id, 4)
        k1, k2 = effect_key(run.id, 1, 0), effect_key(run.id, 2, 0)
        attempts = {e.key: e.attempts for e in aw.effects(run.id)}
        assert attempts[k1] == 3 and attempts[k2] == 2, attempts
        for key in (k1, k2):
            found = vendor.client.lookup(key)
            assert found is not None and found["applied_count"] == 1


def test_vendor_with_neither_pauses_for_a_human_instead_of_paying_twice(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    """A payment tool that is not idempotent and has no lookup, against a vendor
    that offers neither: after a kill mid-call the effect is marked unknown and
    the run waits. The human's verdict decides: "never landed" lets the call be
    made (once); "landed" adopts it."""
    with start_vendor(tmp_path / "vendor.db", "plain") as vendor:
        fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url,
                     AGENT_WORKER_FAULTS="after_intent,after_apply")
        fleet.beat()
        run = aw.start_run("charges", {"payments": 3, "tool": "charge"})
        key = effect_key(run.id, 1, 0)

        def paused(times: int) -> RunRecord:
            wait_for(lambda: sum(e.kind == "effect_unknown" for e in aw.events(run.id)) == times,
                     timeout=RUN_TIMEOUT, what=f"pause number {times} on an unknown effect")
            r = aw.get_run(run.id)
            assert (r.status, r.waiting_for, r.error_code) == (
                "waiting", f"effect:{key}", "effect_unknown")
            assert [(e.key, e.status) for e in aw.effects(run.id)] == [(key, "unknown")]
            return r

        # Killed after the intent, before the call: nothing moved; the engine cannot know.
        paused(1)
        assert moved(vendor, run.id) == {}
        acting(aw, "ops@example.com").resolve_effect(key, applied=False)
        # Re-called once, then killed after the vendor applied it: unknown again.
        paused(2)
        assert moved(vendor, run.id) == {key: 1}
        [(_, _, amount)] = vendor_journal(vendor, run.id)
        acting(aw, "ops@example.com").resolve_effect(key, applied=True,
                          result={"id": "from-vendor-dashboard", "amount_cents": amount})
        done = finish(aw, run.id)
        assert done.status == "succeeded", done.error_detail
        assert (fired(fleet, "after_intent"), fired(fleet, "after_apply")) == (1, 1)
        keys = [effect_key(run.id, lap, 0) for lap in (1, 2, 3)]
        assert moved(vendor, run.id) == dict.fromkeys(keys, 1)
        assert [(e.key, e.status) for e in aw.effects(run.id)] == [(k, "applied") for k in keys]
        assert aw.effects(run.id)[0].result["id"] == "from-vendor-dashboard"
        assert_laps_exactly_once(aw, run.id, 4)
        resolved = [e.data for e in aw.events(run.id) if e.kind == "effect_resolved"]
        assert [d["applied"] for d in resolved if d] == [False, True]


# --- journaled model output ----------------------------------------------------------


def test_replayed_lap_reuses_the_recorded_model_output(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    """``flaky-model`` pays a random order id on every call; killed after its
    answer was journaled, after the intent and after the vendor applied, the lap
    still makes one set of tool calls with the first answer's arguments."""
    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor:
        fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url,
                     AGENT_WORKER_FAULTS="after_model_journal,after_intent,after_apply")
        fleet.beat()
        run = aw.start_run("flaky-model", {"laps": 3})
        done = finish(aw, run.id)
        assert done.status == "succeeded", done.error_detail
        assert [fired(fleet, p) for p in ("after_model_journal", "after_intent",
                                          "after_apply")] == [1, 1, 1]
        assert_laps_exactly_once(aw, run.id, 4)
        assistant = {m.lap: m.message for m in aw.messages(run.id)
                     if m.message.role == "assistant"}
        assert sorted(assistant) == [1, 2, 3, 4]
        assert sum(m.message.role == "assistant" for m in aw.messages(run.id)) == 4
        effects = aw.effects(run.id)
        keys = [effect_key(run.id, lap, 0) for lap in (1, 2, 3)]
        assert [e.key for e in effects] == keys
        assert moved(vendor, run.id) == dict.fromkeys(keys, 1)
        for lap, effect in zip((1, 2, 3), effects, strict=True):
            [call] = assistant[lap].tool_calls
            assert effect.args == call.arguments and effect.status == "applied"
            found = vendor.client.lookup(effect.key)
            assert found is not None and found["request"] == call.arguments


# --- saga ------------------------------------------------------------------------------


def test_saga_compensates_in_reverse_order_once_despite_kills(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    """charge, reserve, then a step that always raises: the run fails and both
    undos run, reserve's first, each exactly once at the vendor, although the
    worker is killed before each undo (the second kill lands between the two)."""
    plan = [["charge", {"order_id": "trip-flight", "amount_cents": 30_000}],
            ["reserve", {"order_id": "trip-hotel", "amount_cents": 12_000}],
            ["explode", {}]]
    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor:
        fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url,
                     AGENT_WORKER_MAX_LAP_ATTEMPTS="3",
                     AGENT_WORKER_FAULTS="in_compensation@reserve,in_compensation@charge")
        fleet.beat()
        run = aw.start_run("saga", {"plan": plan})
        done = finish(aw, run.id)
        assert done.status == "failed"
        assert "boom: this tool always fails" in (done.error_message or ""), done.error_message
        assert [fired(fleet, "in_compensation@reserve"),
                fired(fleet, "in_compensation@charge")] == [1, 1]
        k1, k2 = effect_key(run.id, 1, 0), effect_key(run.id, 2, 0)
        u1, u2 = compensation_key(k1), compensation_key(k2)
        effects = {e.key: e for e in aw.effects(run.id)}
        assert {k: e.status for k, e in effects.items()} == {
            k1: "compensated", k2: "compensated", u1: "applied", u2: "applied"}
        assert (effects[u1].compensates, effects[u2].compensates) == (k1, k2)
        assert effects[u2].created_at <= effects[u1].created_at
        assert effects[u2].updated_at <= effects[u1].updated_at
        # The vendor's own order: two payments, then the undos in reverse, once each.
        assert [(kind, key) for kind, key, _ in vendor_journal(vendor, run.id)] == [
            ("refund", k1), ("refund", k2), ("notice", u2), ("notice", u1)]
        assert moved(vendor, run.id) == {k1: 1, k2: 1, u1: 1, u2: 1}
        assert [c[0] for c in aw.checkpoints(run.id)] == [0, 1, 2]
        finished = [e.data for e in aw.events(run.id) if e.kind == "finished"]
        assert finished and finished[-1] is not None and finished[-1]["status"] == "failed"


# --- property: random kills over random runs ------------------------------------------

#: Every lap fault point is armed this many times in the chaos worker; an example
#: arms k of them by removing k marker files (``faults.fault`` fires while one is
#: missing), so one worker and one vendor serve every example.
CAPACITY = 4
LAP_POINTS = tuple(p for p in POINTS if p != "in_compensation")


@dataclass
class ChaosRig:
    aw: AgentWorker
    vendor: VendorProcess
    faults: Path

    def arm(self, kills: dict[str, int]) -> None:
        for point in LAP_POINTS:
            for i in range(CAPACITY):
                marker = self.faults / f"{point}.{i}"
                if i < kills.get(point, 0):
                    marker.unlink(missing_ok=True)
                else:
                    marker.touch()

    def fired(self, kills: dict[str, int]) -> int:
        return sum((self.faults / f"{p}.{i}").exists() for p, k in kills.items()
                   for i in range(k))


@pytest.fixture
def chaos_rig(aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> Iterator[ChaosRig]:
    faults = Path(fleet.env["AGENT_WORKER_FAULT_DIR"])
    faults.mkdir(parents=True, exist_ok=True)
    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor:
        rig = ChaosRig(aw, vendor, faults)
        rig.arm({})
        worker = fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url,
                              AGENT_WORKER_MAX_LAP_ATTEMPTS="10",
                              AGENT_WORKER_FAULTS=",".join(f"{p}*{CAPACITY}" for p in LAP_POINTS))
        fleet.beat()
        with supervised(worker):
            yield rig


@st.composite
def chaos_plans(draw: st.DrawFn) -> dict[str, Any]:
    payments = draw(st.integers(1, 3))
    tool = draw(st.sampled_from(["pay", "charge_checked"]))
    points = draw(st.lists(st.sampled_from(LAP_POINTS), min_size=1, max_size=2, unique=True))
    # Each armed kill must find a victim. after_claim, after_model_journal and
    # after_commit are reached at least once per lap; after_intent once per
    # payment; after_apply and after_outcome once per call, and ``pay`` is called
    # again on every replay, but ``charge_checked`` adopts instead (one call per
    # payment, shared by the two points).
    per_payment = {"after_intent"} | ({"after_apply", "after_outcome"}
                                      if tool == "charge_checked" else {"after_outcome"})
    if tool == "charge_checked" and {"after_apply", "after_outcome"} <= set(points):
        points.remove("after_outcome")
    kills = {p: draw(st.integers(1, min(2, payments) if p in per_payment else 2))
             for p in points}
    return {"payments": payments, "amount": draw(st.integers(1, 50_000)), "kills": kills,
            "tool": tool}


@pytest.mark.chaos
@settings(max_examples=5, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],  # shrinking real processes takes too long
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=chaos_plans())
def test_random_kills_never_move_money_twice_or_lose_an_effect(
        chaos_rig: ChaosRig, plan: dict[str, Any]) -> None:
    """Random kill points (and counts) over random runs, paying through an
    idempotent tool (re-call with the key) or a compensatable one with lookup
    (adopt what the vendor has): every payment lands exactly once, for the
    amount asked, and every applied effect is in the ledger and seen by the model."""
    rig, kills = chaos_rig, plan["kills"]
    rig.arm(kills)
    try:
        agent = "payments" if plan["tool"] == "pay" else "charges"
        run = rig.aw.start_run(agent, {"payments": plan["payments"], "amount": plan["amount"],
                                       "tool": plan["tool"]})
        done = finish(rig.aw, run.id)
        assert rig.fired(kills) == sum(kills.values()), f"not every kill fired: {plan}"
        assert_paid_exactly_once(rig.aw, rig.vendor, done, plan["payments"], plan["amount"])
        assert_laps_exactly_once(rig.aw, run.id, plan["payments"] + 1)
    finally:
        rig.arm({})
