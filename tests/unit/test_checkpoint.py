"""Checkpoint schema versions: every released version has a fixture that must
keep loading; unknown or newer versions are refused with a clear reason."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from agent_worker.core.checkpoint import (
    Checkpoint,
    PendingCall,
    PlanItem,
    dump_checkpoint,
    load_checkpoint,
)
from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.core.errors import CheckpointVersionError
from agent_worker.core.messages import ToolCall

FIXTURES = Path(__file__).parent / "checkpoints"


@pytest.mark.parametrize("version", range(1, CHECKPOINT_SCHEMA_VERSION + 1))
def test_every_released_version_loads(version: int) -> None:
    state = json.loads((FIXTURES / f"v{version}.json").read_text())
    ckpt = load_checkpoint(state)
    assert ckpt.schema_version == CHECKPOINT_SCHEMA_VERSION
    assert ckpt.lap == 7 and ckpt.message_count == 15
    assert ckpt.facts == {"customer": "c-42"}
    assert load_checkpoint(dump_checkpoint(ckpt)) == ckpt


def test_newer_version_is_refused() -> None:
    state = json.loads((FIXTURES / f"v{CHECKPOINT_SCHEMA_VERSION}.json").read_text())
    state["schema_version"] = CHECKPOINT_SCHEMA_VERSION + 1
    with pytest.raises(CheckpointVersionError, match="newer than this worker"):
        load_checkpoint(state)


@pytest.mark.parametrize("bad", [None, 0, "2", -1])
def test_missing_or_invalid_version_is_refused(bad: object) -> None:
    with pytest.raises(CheckpointVersionError, match="schema_version"):
        load_checkpoint({"schema_version": bad, "lap": 1})


def test_payload_not_matching_its_version_is_refused() -> None:
    state = json.loads((FIXTURES / f"v{CHECKPOINT_SCHEMA_VERSION}.json").read_text())
    state["budget"] = "lots"
    with pytest.raises(CheckpointVersionError, match="does not match"):
        load_checkpoint(state)


def test_current_fixture_is_up_to_date() -> None:
    """Adding a version means adding its fixture (and an upgrade step)."""
    assert (FIXTURES / f"v{CHECKPOINT_SCHEMA_VERSION}.json").exists()
    assert not (FIXTURES / f"v{CHECKPOINT_SCHEMA_VERSION + 1}.json").exists()
    Checkpoint.model_validate(json.loads((FIXTURES / f"v{CHECKPOINT_SCHEMA_VERSION}.json")
                                         .read_text()))


def test_a_stored_checkpoint_leaves_out_what_is_default_and_reads_back_the_same() -> None:
    """Fields at their default are not stored (WAL on every lap): ``None``,
    empty facts and pending calls, a plan item not done, a zero cost. The
    version is stored although it is the default (``load_checkpoint`` reads it
    first); ``None`` values the agent or the model gave (a fact, a tool
    argument) are kept, and everything reads back equal."""
    state = json.loads((FIXTURES / f"v{CHECKPOINT_SCHEMA_VERSION}.json").read_text())
    ckpt = load_checkpoint(state).model_copy(update={
        "next_action": None, "summary_seq": None, "facts": {"customer": None},
        "plan": (PlanItem(title="look up"), PlanItem(title="refund", done=True)),
        "pending_calls": (PendingCall(call=ToolCall(id="c1", name="refund",
                                                    arguments={"note": None}), lap=6, index=0),)})
    ckpt = ckpt.model_copy(update={"budget": ckpt.budget.model_copy(update={"cost": Decimal(0)})})
    stored = dump_checkpoint(ckpt)
    assert "next_action" not in stored and "summary_seq" not in stored
    assert "deadline" not in stored["budget"] and "wake_at" not in stored["pending_calls"][0]
    assert "cost" not in stored["budget"]
    assert stored["plan"] == [{"title": "look up"}, {"title": "refund", "done": True}]
    assert stored["facts"] == {"customer": None}
    assert stored["pending_calls"][0]["call"]["arguments"] == {"note": None}
    assert stored["schema_version"] == CHECKPOINT_SCHEMA_VERSION
    assert load_checkpoint(json.loads(json.dumps(stored))) == ckpt
    bare = dump_checkpoint(ckpt.model_copy(update={"facts": {}, "pending_calls": ()}))
    assert "facts" not in bare and "pending_calls" not in bare
    assert load_checkpoint(json.loads(json.dumps(bare))).facts == {}
