"""``agent-worker schedules`` in process, on a worker over both dialects:
each command's ``--json`` output, and bad input mapped to exit codes with
one error line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agent_worker.api as api
from agent_worker.agent import Agent, Registry
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from tests.engine.cli_json import cli


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(dialect_url)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(name="nightly",
                                      model=ScriptedModel(lambda r: turn("done"))))
    api.configure(worker)
    yield worker
    api.configure(None)
    for name in ("cli-nightly", "x"):
        if name in [s.name for s in worker.list_schedules()]:
            worker.delete_schedule(name)
    worker.close()




def test_schedules_commands(w: InProcessWorker) -> None:
    made = cli("schedules", "create", "cli-nightly", "nightly", "--cron", "30 2 * * *",
               "--tz", "Europe/Berlin", "-i", '{"batch": 1}', "--catchup", "once",
               "--overlap", "cancel")
    assert made["timezone"] == "Europe/Berlin" and made["catchup"] == "once"
    assert made["input"] == {"batch": 1} and not made["paused"]
    assert "cli-nightly" in [s["name"] for s in cli("schedules", "list")]
    assert cli("schedules", "pause", "cli-nightly")["paused"] is True
    assert cli("schedules", "show", "cli-nightly")["paused"] is True
    assert cli("schedules", "resume", "cli-nightly")["paused"] is False
    fired = cli("schedules", "trigger", "cli-nightly")
    assert fired["run_id"].startswith("cli-nightly@") and not fired["skipped"]
    assert w.get_run(fired["run_id"]).input == {"batch": 1}
    assert cli("schedules", "delete", "cli-nightly") == {"deleted": "cli-nightly"}
    assert cli("schedules", "show", "cli-nightly", code=3)["code"] == "unknown_schedule"


def test_bad_schedules_exit_2_and_write_nothing(w: InProcessWorker) -> None:
    for args, error in [(["--cron", "99 * * * *"], "invalid_schedule"),
                        (["--tz", "Nowhere/Atlantis"], "invalid_schedule"),
                        (["--catchup", "always"], "usage"),
                        (["-i", "{not json"], "invalid_input"),
                        ([], "unknown_agent")]:
        agent = "nobody" if not args else "nightly"
        assert cli("schedules", "create", "bad", agent, *args, code=2)["code"] == error
    assert "bad" not in [s.name for s in w.list_schedules()]
    cli("schedules", "create", "x", "nightly")
    assert cli("schedules", "create", "x", "nightly", code=2)["code"] == "schedule_exists"
