"""What used to be process-wide singletons are owned objects with a
lifetime: the API's default handle, a worker process's runtime, and the
model client an agent's factory builds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_worker import api
from agent_worker.agent import Agent
from agent_worker.core.settings import get_settings
from agent_worker.model.protocol import ModelClient
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.runtime import Runtime
from agent_worker.tasks.runtime import WorkerRuntime


@pytest.fixture
def sqlite_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AGENT_WORKER_DATABASE_URL", f"sqlite:///{tmp_path / 'o.db'}")
    monkeypatch.setenv("AGENT_WORKER_AGENT_MODULES", "")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _disposed(rt: Runtime) -> list[bool]:
    """Records whether ``rt`` gets closed."""
    closed: list[bool] = []
    close = rt.close

    def recording_close() -> None:
        closed.append(True)
        close()

    rt.close = recording_close  # type: ignore[method-assign]
    return closed


@pytest.mark.usefixtures("sqlite_settings")
def test_the_default_handle_is_built_once_and_closed_when_replaced() -> None:
    slot = api.DefaultClient()
    built = slot.get()
    assert slot.get() is built
    closed = _disposed(built.rt)
    mine = api.AgentWorker(built.rt)
    slot.replace(mine)  # the handle the slot built is closed: nobody else owns it
    assert closed == [True] and slot.get() is mine
    slot.close()  # a handle the caller gave is the caller's to close
    assert closed == [True]
    assert slot.get() is not mine and slot.get() is not built


@pytest.mark.usefixtures("sqlite_settings")
def test_a_worker_runtime_is_dropped_after_fork_and_closed_at_shutdown() -> None:
    worker = WorkerRuntime()
    first = worker.get()
    assert worker.get() is first
    worker.forget()  # a forked child must not use its parent's connections
    second = worker.get()
    assert second is not first
    closed = _disposed(second)
    worker.close()
    assert closed == [True] and worker.get() is not second
    worker.close()


def test_each_agent_definition_owns_the_client_its_factory_builds() -> None:
    built: list[ModelClient] = []

    def factory() -> ModelClient:
        built.append(ScriptedModel(lambda r: turn("done")))
        return built[-1]

    a = Agent(name="owned-model", model=factory)
    assert a.client() is a.client() and len(built) == 1
    again = Agent(name="owned-model", model=factory)  # same name and version
    assert again.client() is not a.client() and len(built) == 2
