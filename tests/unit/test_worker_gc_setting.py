"""``AGENT_WORKER_WORKER_GC_THRESHOLD``: a value the collector cannot take is a
settings error with the variable's name, not an ``OverflowError`` inside
Celery's ``worker_init``; the largest accepted one is taken."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from agent_worker.core.settings import Settings
from agent_worker.tasks.garbage import tune


@pytest.fixture
def collector() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*saved)


@pytest.mark.parametrize("value", ["-1", "100000001", "99999999999", "many"])
def test_a_threshold_the_collector_cannot_take_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AGENT_WORKER_WORKER_GC_THRESHOLD", value)
    with pytest.raises(ValidationError, match="worker_gc_threshold"):
        Settings()


def test_the_largest_accepted_threshold_is_taken(collector: None) -> None:
    largest = Settings.model_fields["worker_gc_threshold"].metadata
    bound = next(m.le for m in largest if getattr(m, "le", None) is not None)
    tune(bound)
    assert gc.get_threshold()[0] == bound
    assert gc.get_freeze_count() > 0
