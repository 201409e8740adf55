"""The shared vocabulary: a wait's text round-trips through format and parse."""

from __future__ import annotations

import pytest

from agent_worker.core.vocabulary import RUN_STATUSES, RUNNABLE, TERMINAL, WaitingFor


@pytest.mark.parametrize("wait", [
    WaitingFor.approval("a1b2"), WaitingFor.signal("go"), WaitingFor.effect("run:3:0"),
    WaitingFor("attention"), WaitingFor("budget"),
])
def test_waiting_for_round_trips(wait: WaitingFor) -> None:
    assert WaitingFor.parse(wait.format()) == wait


def test_waiting_for_keeps_the_stored_format() -> None:
    assert WaitingFor.effect("r:1:0").format() == "effect:r:1:0"
    assert str(WaitingFor("budget")) == "budget"
    with pytest.raises(ValueError):
        WaitingFor.parse("nap:5")


def test_status_sets_are_statuses() -> None:
    assert set(RUN_STATUSES) >= TERMINAL and set(RUNNABLE) <= set(RUN_STATUSES)
    assert not TERMINAL & set(RUNNABLE)
