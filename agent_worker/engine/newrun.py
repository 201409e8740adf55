"""The first state of a new run (its row, checkpoint 0 and first message),
built from a caller's input: shared by ``start_run`` and child runs, so both
admit input by the same rules (``agent_worker.untrusted``) and limits."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from agent_worker.agent import Agent
from agent_worker.budget import Budget, BudgetLedger
from agent_worker.checkpoint import Checkpoint, dump_checkpoint
from agent_worker.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.errors import InvalidInputError, PayloadTooLargeError
from agent_worker.messages import Message
from agent_worker.runtime import Runtime
from agent_worker.untrusted import clean
from store.base import NewRun


def json_size(value: Any, what: str) -> int:
    try:
        return len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {e}") from e


def new_run(rt: Runtime, spec: Agent, input: Any, *, run_id: str, tenant: str | None,
            limits: Budget) -> NewRun:
    """A run of ``spec`` on ``input``, ready for the store.

    Raises:
        InvalidInputError: the input is not JSON, or not what the agent takes.
        PayloadTooLargeError: it is larger than ``max_input_bytes``.
    """
    input = clean(input, max_depth=rt.settings.max_json_depth, what="input", strict=True)
    size = json_size(input, "input")
    if size > rt.settings.max_input_bytes:
        raise PayloadTooLargeError(
            f"input is {size} bytes; the limit is {rt.settings.max_input_bytes}")
    if spec.input_model is not None:
        try:
            input = spec.input_model.model_validate(input or {}).model_dump(mode="json")
        except ValidationError as e:
            raise InvalidInputError(f"invalid input for {spec.name}: {e}") from e
    now = rt.clock.now()
    first = Message(role="user", content=input if isinstance(input, str)
                    else json.dumps(input, sort_keys=True))
    checkpoint = Checkpoint(lap=0, agent_name=spec.name, agent_version=spec.version,
                            budget=BudgetLedger.start(limits, now), message_count=1)
    return NewRun(
        id=run_id, tenant=tenant, agent_name=spec.name, agent_version=spec.version,
        input=input, limits=limits.model_dump(mode="json"), retention=spec.retention,
        checkpoint=dump_checkpoint(checkpoint), schema_version=CHECKPOINT_SCHEMA_VERSION,
        messages=[first], now=now)


__all__ = ["json_size", "new_run"]
