"""A new run's first state (its row, checkpoint 0 and first message), built
once for every way a run starts: the public API's ``start_run``, a schedule's
firing (``engine.schedules``) and a child run (``engine.children``). Input is
admitted by the same rule in all of them, so a schedule refuses at creation
the input its firings would be refused, and a child the input its parent's
tool could not have given a run started by hand."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from agent_worker.agent import Agent
from agent_worker.core.budget import Budget, BudgetLedger
from agent_worker.core.checkpoint import Checkpoint, dump_checkpoint
from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.core.errors import InvalidInputError, PayloadTooLargeError, RunConflictError
from agent_worker.core.messages import Message
from agent_worker.core.settings import Settings
from agent_worker.core.untrusted import clean
from agent_worker.runtime import Runtime
from agent_worker.store.base import NewRun, RunRecord


def json_size(value: Any, what: str) -> int:
    """The size of ``value`` as JSON; refused if it is not JSON at all."""
    try:
        return len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {e}") from e


def admit_input(spec: Agent, input: Any, settings: Settings) -> Any:
    """``input`` under the untrusted-text rule, within the size limit and valid
    for the agent's ``input_model`` (then as the model dumps it).

    Raises:
        InvalidInputError: not JSON, nested too deep, or invalid for the agent.
        PayloadTooLargeError: over ``max_input_bytes``.
    """
    input = clean(input, max_depth=settings.max_json_depth, what="input", strict=True)
    size = json_size(input, "input")
    if size > settings.max_input_bytes:
        raise PayloadTooLargeError(
            f"input is {size} bytes; the limit is {settings.max_input_bytes}")
    if spec.input_model is not None:
        try:
            input = spec.input_model.model_validate(input or {}).model_dump(mode="json")
        except ValidationError as e:
            raise InvalidInputError(f"invalid input for {spec.name}: {e}") from e
    return input


def new_run(spec: Agent, input: Any, *, run_id: str, tenant: str | None,
            budget: Budget | None, now: datetime, labels: dict[str, str] | None = None,
            limits: Budget | None = None) -> NewRun:
    """The row, checkpoint 0 and first message of a run of ``spec`` on an
    already admitted ``input``. ``budget`` only tightens the agent's limits;
    ``limits``, when given, are the run's limits as the caller computed them
    (a child's share of its parent's budget)."""
    if limits is None:
        limits = spec.budget.tightened_by(budget)
    first = Message(role="user", content=input if isinstance(input, str)
                    else json.dumps(input, sort_keys=True))
    checkpoint = Checkpoint(lap=0, agent_name=spec.name, agent_version=spec.version,
                            budget=BudgetLedger.start(limits, now), message_count=1)
    return NewRun(
        id=run_id, tenant=tenant, agent_name=spec.name, agent_version=spec.version,
        input=input, limits=limits.model_dump(mode="json"), retention=spec.retention,
        checkpoint=dump_checkpoint(checkpoint), schema_version=CHECKPOINT_SCHEMA_VERSION,
        messages=[first], now=now, labels=labels)


def admitted_run(rt: Runtime, spec: Agent, input: Any, *, run_id: str, tenant: str | None,
                 limits: Budget) -> NewRun:
    """``new_run`` on ``input`` once admitted, with the runtime's clock: a
    child run, whose limits are its share of the parent's budget.

    Raises:
        InvalidInputError: the input is not JSON, or not what the agent takes.
        PayloadTooLargeError: it is larger than ``max_input_bytes``.
    """
    return new_run(spec, admit_input(spec, input, rt.settings), run_id=run_id, tenant=tenant,
                   budget=None, now=rt.clock.now(), limits=limits)


def retried_start(existing: RunRecord, spec: Agent, input: Any) -> RunRecord:
    """``existing`` if a start of ``spec`` on the admitted ``input`` asked for
    it (the same agent, the same input as stored): an idempotent retry.

    Raises:
        RunConflictError: ``existing`` is another agent's run, or was started
            with another input.
    """
    if existing.agent_name != spec.name:
        raise RunConflictError(
            f"run {existing.id} already exists for agent {existing.agent_name}, not "
            f"{spec.name}; choose another run id")
    if _as_stored(input) != _as_stored(existing.input):
        raise RunConflictError(
            f"run {existing.id} already exists with a different input; a retried start "
            "must repeat the original input, or choose another run id")
    return existing


def _as_stored(value: Any) -> Any:
    """``value`` as the store hands it back (JSON's lists, not tuples)."""
    return json.loads(json.dumps(value, sort_keys=True))


__all__ = ["admit_input", "admitted_run", "json_size", "new_run", "retried_start"]
