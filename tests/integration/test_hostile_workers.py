"""Hostile text through real ``celery -A agent_worker.tasks worker`` processes on
Postgres: a tool whose effect lands and whose answer Postgres cannot store as
sent (U+0000, a lone surrogate) must not strand the run behind the payment."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_worker.api import AgentWorker
from agent_worker.core.constants import effect_key
from agent_worker.demo.vendor import start_vendor
from tests.integration.test_effects import finish, fired, moved
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import Fleet

pytestmark = pytest.mark.integration

REPLACEMENT = "\ufffd"  # the rule of agent_worker.core.untrusted, spelled out


@pytest.mark.parametrize("faults", [None, "after_apply*2"], ids=["no-fault", "killed"])
def test_idempotent_tool_answering_with_nul_pays_once_and_succeeds(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path, faults: str | None) -> None:
    """``killed``: SIGKILL right after the vendor applied each payment, before the
    ledger records it; the replay re-calls with the same key and stores the
    (cleaned) answer once."""
    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor:
        env = {"AGENT_WORKER_VENDOR_URL": vendor.url}
        if faults:
            env["AGENT_WORKER_FAULTS"] = faults
        fleet.worker(concurrency=2, **env)
        fleet.beat()
        run = aw.start_run("noisy-payments", {"payments": 2})
        done = finish(aw, run.id)
        assert done.status == "succeeded", (done.error_code, done.error_message)
        assert done.result == {"paid": 2}
        if faults:
            assert fired(fleet, "after_apply") == 2
            assert done.recoveries >= 2
        keys = [effect_key(run.id, lap, 0) for lap in (1, 2)]
        assert moved(vendor, run.id) == dict.fromkeys(keys, 1)
        effects = aw.effects(run.id)
        assert [(e.key, e.status) for e in effects] == [(k, "applied") for k in keys]
        assert all(e.result.endswith(f"{REPLACEMENT} of 1000 {REPLACEMENT}ok")
                   for e in effects)
        assert effects[0].args == {"order_id": f"o1{REPLACEMENT}", "amount_cents": 1000}
        tools = [m.message.content for m in aw.messages(run.id) if m.message.role == "tool"]
        assert tools == [e.result for e in effects]
        assistant = [m.message.content for m in aw.messages(run.id)
                     if m.message.role == "assistant"]
        assert assistant[0] == f"payment 1{REPLACEMENT}"
        assert_laps_exactly_once(aw, run.id, 3)
