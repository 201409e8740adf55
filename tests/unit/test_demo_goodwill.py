"""The demo's approval case (``goodwill-credit``, which demo.sh leaves waiting
in the console's inbox and ``bench.screenshots`` photographs): it waits for a
member of the support leads, refuses an approver outside that group, and pays
the credit exactly once after the approval."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_worker.core.errors import PermissionDeniedError
from agent_worker.core.settings import get_settings
from agent_worker.demo import goodwill
from agent_worker.demo.refund_desk import order_amount
from agent_worker.demo.vendor import start_vendor
from agent_worker.inprocess import InProcessWorker
from tests.principals import acting


def test_goodwill_credit_waits_for_a_support_lead_then_pays_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vendor = start_vendor(tmp_path / "vendor.db")
    monkeypatch.setenv("AGENT_WORKER_VENDOR_URL", vendor.url)
    get_settings.cache_clear()
    worker = InProcessWorker(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        desk = acting(worker, "desk", "submitter", tenant="acme")
        run = desk.start_run(goodwill.goodwill_credit.name, {"order_id": "ord-042"})
        worker.run_until_idle()
        assert worker.get_run(run.id).status == "waiting"
        (asked,) = worker.list_approvals(run_id=run.id)
        assert asked.owner == goodwill.OWNER
        assert asked.arguments == {"order_id": "ord-042",
                                   "amount_cents": order_amount("ord-042") // 5}
        with pytest.raises(PermissionDeniedError):
            acting(worker, "olga", "approver", tenant="acme").approve(asked.id)
        acting(worker, "lee", "approver", goodwill.OWNER, tenant="acme").approve(asked.id)
        worker.run_until_idle()
        assert worker.get_run(run.id).status == "succeeded"
        assert vendor.client.stats()["refunds"] == 1
    finally:
        worker.rt.store.dispose()
        vendor.stop()
        get_settings.cache_clear()
