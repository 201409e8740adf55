"""Ledger truth after a cancel (issue 47, item 4), through real ``celery``
worker processes, Postgres, Redis and the vendor process.

The finding: a worker is SIGKILLed after the vendor applied a charge and before
the ledger recorded it (``after_apply``: a lost reply), and the run is
cancelled before that lap is replayed. The cancelled run's ledger must say what
the vendor says (``applied``, with its record, found by the tool's lookup), not
``pending``; the money moved exactly once; and a compensatable charge is
undone exactly once.

No beat runs until the cancel is recorded: the dead worker's lease would
otherwise lapse and the sweeper re-send the lap, whose replay would settle the
charge itself. The engine-level cases are in tests/engine/test_ledger_after_ending.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.ledger_agents  # noqa: F401  (registers ledger-charges here too)
from agent_worker.api import AgentWorker
from agent_worker.core.constants import compensation_key, effect_key
from agent_worker.demo.vendor import Mode, start_vendor
from tests.integration.test_effects import fired, moved, vendor_journal
from tests.principals import acting
from tests.support import TEST_AGENTS, Fleet, supervised, wait_for

pytestmark = pytest.mark.integration

MODULES = f"{TEST_AGENTS},tests.ledger_agents"


@pytest.mark.parametrize(("tool", "mode"), [("charge_idem", "idempotent"),
                                            ("charge_checked", "lookup")])
def test_a_cancelled_run_with_a_lost_reply_charge_ends_with_it_applied(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path, tool: str, mode: Mode) -> None:
    with start_vendor(tmp_path / "vendor.db", mode) as vendor:
        env = {"AGENT_WORKER_VENDOR_URL": vendor.url, "AGENT_WORKER_AGENT_MODULES": MODULES}
        worker = fleet.worker(concurrency=1, AGENT_WORKER_FAULTS="after_apply*1", **env)
        with supervised(worker):
            run = aw.start_run("ledger-charges", {"payments": 3, "tool": tool})
            key = effect_key(run.id, 1, 0)
            wait_for(lambda: fired(fleet, "after_apply") == 1, timeout=60,
                     what="the kill after the vendor applied the charge")
            assert moved(vendor, run.id) == {key: 1}
            assert [(e.key, e.status) for e in aw.effects(run.id)] == [(key, "pending")]

            acting(aw, "carol").cancel(run.id, reason="customer withdrew")
            fleet.beat(**env)  # now the sweeper may hand the dead worker's run on
            done = aw.wait(run.id, timeout=120)

        assert (done.status, done.cancel_reason) == ("cancelled", "customer withdrew"), (
            done.status, done.waiting_for, done.error_message)
        # The cancel came first: lap 1 was never replayed (nor committed).
        assert not any(e.kind == "lap_committed" for e in aw.events(run.id))
        found = vendor.client.lookup(key)
        assert found is not None and found["applied_count"] == 1
        effects = {e.key: e for e in aw.effects(run.id)}
        charge = effects[key]
        assert charge.result == found["response"], "the vendor's record, adopted"
        if tool == "charge_idem":
            assert moved(vendor, run.id) == {key: 1}, "the money moved exactly once"
            assert {k: e.status for k, e in effects.items()} == {key: "applied"}
            assert [k for _, k, _ in vendor_journal(vendor, run.id)] == [key]
        else:
            assert moved(vendor, run.id) == {key: 1, compensation_key(key): 1}
            assert {k: e.status for k, e in effects.items()} == {
                key: "compensated", compensation_key(key): "applied"}
            assert [(kind, k) for kind, k, _ in vendor_journal(vendor, run.id)] == [
                ("refund", key), ("notice", compensation_key(key))], "undone exactly once"
        [finished] = [e for e in aw.events(run.id) if e.kind == "finished"]
        assert (finished.data or {})["reconciled"] == {key: "applied"}
