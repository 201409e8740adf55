"""The demo agent reads its tool results: a refused refund is reported as
failed and gets no "refunded" notice, and a run in which no refund landed
fails instead of succeeding with a total (it used to answer
``{"refunded": 6, "total_cents": 33501}`` with no vendor configured).
The runs go through the engine on both dialects."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from agent_worker import InProcessWorker
from agent_worker.agent import Registry
from agent_worker.core.errors import InvalidInputError, TaskFailedError
from agent_worker.core.messages import Message, ModelRequest
from agent_worker.core.settings import get_settings
from agent_worker.demo.refund_desk import _script, order_amount, refund_desk


def play(orders: int, refused: set[str]) -> tuple[object, list[str]]:
    """Drive the script as the engine would: answer each call, refusing the
    refunds of ``refused``; return the final answer and the notices sent."""
    messages: list[Message] = [Message(role="user", content=json.dumps({"orders": orders}))]
    notices: list[str] = []
    for lap in range(1, 100):
        request = ModelRequest(run_id="r", lap=lap, instructions="", messages=tuple(messages),
                               idempotency_key=f"r:{lap}:model")
        reply = _script(request).message
        messages.append(reply)
        if not reply.tool_calls:
            return json.loads(reply.content), notices
        for call in reply.tool_calls:
            order = call.arguments.get("order_id", "")
            error = call.name == "refund" and order in refused
            if call.name == "send_notice":
                notices.append(call.arguments["to"].split("@")[0])
            messages.append(Message(role="tool", tool_call_id=call.id, name=call.name,
                                    is_error=error,
                                    content="refund declined (vendor HTTP 402)" if error
                                    else "{}"))
    raise AssertionError("the script never finished")


def test_a_refused_refund_is_reported_failed_and_not_notified() -> None:
    result, notices = play(3, refused={"ord-002"})
    assert result == {
        "refunded": 2, "total_cents": order_amount("ord-001") + order_amount("ord-003"),
        "failed": [{"order_id": "ord-002", "error": "refund declined (vendor HTTP 402)"}],
        "notices_failed": []}
    assert notices == ["ord-001", "ord-003"]


def test_no_refund_landed_is_a_failure_not_a_total() -> None:
    with pytest.raises(TaskFailedError, match="no refund landed: all 2 failed"):
        play(2, refused={"ord-001", "ord-002"})


@pytest.fixture
def worker(dialect_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessWorker]:
    """A worker of the demo agent alone (a registry of its own), with no vendor."""
    monkeypatch.setenv("AGENT_WORKER_VENDOR_URL", "")
    get_settings.cache_clear()
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0)
    w.rt.registry = Registry()
    w.rt.registry.register(refund_desk)
    yield w
    w.close()
    get_settings.cache_clear()


def test_run_with_no_vendor_fails_with_the_reason(worker: InProcessWorker) -> None:
    run = worker.start_run("refund-desk", {"orders": 2})
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "failed" and done.result is None
    assert done.error_code == "task_failed"
    assert "no vendor configured: set AGENT_WORKER_VENDOR_URL" in (done.error_message or "")


def test_unknown_input_fields_are_refused_at_submit(worker: InProcessWorker) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"  # the Postgres database holds other tests' runs
    with pytest.raises(InvalidInputError, match="count"):
        worker.start_run("refund-desk", {"count": "many"}, tenant=tenant)
    assert worker.list_runs(tenant=tenant) == []
