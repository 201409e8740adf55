"""agent-worker as a library inside an application, as a team would use it:
the built wheel installed into a fresh virtual environment, and an application
folder with its own ``store.py`` and its own Celery app in ``tasks.py`` (with a
task of its own) that calls ``agent_worker.tasks.configure(app)``.

From that folder: ``agent_worker`` imports beside the application's ``store``
and ``tasks``; an agent runs in process; a durable run goes through real
workers of the application's own app (``celery -A tasks worker``) while one
worker's pool child is SIGKILLed at the worst instant (the vendor took the
money, the ledger says pending) and later the whole worker is SIGKILLed;
every payment moves once, and the application's own task runs on the same
workers before and after.

The fresh environment sees this test run's installed dependencies through a
``.pth`` line (``tests.support.seeded_venv``), so installing the wheel needs
no download; ``agent_worker`` itself comes only from the wheel (checked).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent_worker.api import AgentWorker
from agent_worker.demo.vendor import start_vendor
from tests.integration.test_effects import moved
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import ROOT, Proc, seeded_venv, wait_for, worker_environ

# A wheel build and installs in fresh virtual environments (300 s each at
# most, timed by their own subprocess timeouts, which fire first).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

PAYMENTS = 4

STORE_PY = '''
"""The application's own store module (a common name)."""
SHELF = "the application's store"
'''

TASKS_PY = '''
"""The application's own Celery app, with a task of its own."""
import os
from pathlib import Path

from celery import Celery

import agent_worker.tasks

app = Celery("shop", broker=os.environ["SHOP_BROKER_URL"])
app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True,
                worker_hijack_root_logger=False)
agent_worker.tasks.configure(app)


@app.task(name="shop.record")
def record(tag: str) -> None:
    Path(os.environ["SHOP_RECORDS"], tag).write_text(str(os.getpid()))
'''

AGENTS_PY = '''
"""The application's agents: a read-only echo and an idempotent payment."""
import json
import os

from agent_worker import Agent, register
from agent_worker.demo.vendor import VendorClient
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool


@tool
def echo(text: str) -> dict:
    """Say it back."""
    return {"echo": text}


@tool(kind="idempotent")
def pay(order_id: str, amount_cents: int, ctx: ToolContext) -> dict:
    """Pay through the vendor, passing the idempotency key."""
    with VendorClient(os.environ["AGENT_WORKER_VENDOR_URL"]) as vendor:
        return vendor.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


def _echo(r):
    if r.lap > 1:
        return turn("done")
    return turn("echo", [("echo", {"text": "hello"})])


def _pay(r):
    first = next(m for m in r.messages if m.role == "user")
    n = json.loads(first.content)["payments"]
    if r.lap > n:
        return turn(json.dumps({"paid": n}))
    return turn(f"payment {r.lap}", [("pay", {"order_id": f"o{r.lap}", "amount_cents": 100})])


register(Agent(name="shop-echo", model=lambda: ScriptedModel(_echo), tools=[echo]))
register(Agent(name="shop-pay", model=lambda: ScriptedModel(_pay), tools=[pay]))
'''

IN_PROCESS = '''
import store, tasks, agent_worker
from agent_worker import InProcessWorker
assert store.SHELF == "the application's store" and tasks.app.main == "shop"
worker = InProcessWorker("sqlite:///inprocess.db")
run = worker.start_run("shop-echo", {})
worker.run_until_idle()
print(agent_worker.__file__, worker.get_run(run.id).status)
'''

START_RUN = '''
import tasks  # the application's module, which configures its app
from agent_worker import start_run
print(start_run("shop-pay", {"payments": %d}).id)
tasks.record.delay("%s")
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, timeout=300, capture_output=True)
    [built] = out.glob("agent_worker-*.whl")
    return built


def test_the_wheel_installs_only_agent_worker(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = set(z.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"agent_worker"}
    assert "agent_worker/store/migrations/script.py.mako" in names
    assert "agent_worker/tasks/celeryapp.py" in names


def test_an_application_with_its_own_store_and_celery_app(
        wheel: Path, database_url: str, broker_url: str, tmp_path: Path,
        aw: AgentWorker) -> None:
    venv = seeded_venv(tmp_path / "venv")
    python = str(venv / "bin/python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    app = tmp_path / "shop"
    records = tmp_path / "records"
    app.mkdir()
    records.mkdir()
    for name, text in (("store.py", STORE_PY), ("tasks.py", TASKS_PY),
                       ("shop_agents.py", AGENTS_PY)):
        (app / name).write_text(text)
    env = worker_environ(database_url, broker_url, tmp_path / "faults",
                         agent_modules="shop_agents")
    del env["PYTHONPATH"]  # the checkout must not be importable: only the wheel
    env.update(SHOP_BROKER_URL=broker_url, SHOP_RECORDS=str(records))

    def python_in_app(source: str) -> str:
        done = subprocess.run([python, "-c", source], cwd=app, env=env, text=True,
                              capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    where, status = python_in_app(IN_PROCESS).split()
    assert Path(where).is_relative_to(venv), f"agent_worker came from {where}, not the wheel"
    assert status == "succeeded"

    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor, contextlib.ExitStack() \
            as cleanup:
        env["AGENT_WORKER_VENDOR_URL"] = vendor.url
        for_each_proc = cleanup.callback

        def celery(*args: str, log: str, **extra: str) -> Proc:
            proc = Proc([python, "-m", "celery", "-A", "tasks", *args], {**env, **extra},
                        tmp_path / log, cwd=app).start()
            for_each_proc(proc.kill)
            return proc

        first = celery("worker", "--concurrency", "2", "--without-mingle", "--without-gossip",
                       "-n", f"first-{os.getpid()}@%h", log="first.log",
                       AGENT_WORKER_FAULTS="after_apply*1")
        celery("beat", "-s", str(tmp_path / "beat.db"), log="beat.log")
        run_id = python_in_app(START_RUN % (PAYMENTS, "before"))
        wait_for(lambda: (records / "before").exists(), timeout=60,
                 what="the application's own task on its worker")
        # The pool child died after the vendor took a payment: the lap is redelivered.
        wait_for(lambda: (tmp_path / "faults/after_apply.0").exists(), timeout=120,
                 what="the armed SIGKILL mid-payment")
        wait_for(lambda: aw.get_run(run_id).lap >= 2, timeout=120, what="a later lap")
        first.kill()  # the whole worker, mid-run
        second = celery("worker", "--concurrency", "2", "--without-mingle", "--without-gossip",
                        "-n", f"second-{os.getpid()}@%h", log="second.log")
        python_in_app("import tasks; tasks.record.delay('after')")
        done = aw.wait(run_id, timeout=180)
        wait_for(lambda: (records / "after").exists(), timeout=60,
                 what="the application's own task on the new worker")
        assert done.status == "succeeded", done
        assert done.result == {"paid": PAYMENTS}
        keys = [e.key for e in aw.effects(run_id)]
        assert len(keys) == PAYMENTS and all(e.status == "applied" for e in aw.effects(run_id))
        assert moved(vendor, run_id) == dict.fromkeys(keys, 1)
        assert_laps_exactly_once(aw, run_id, PAYMENTS + 1)
        assert second.alive()
        # The application's own task ran in the application's worker processes.
        assert (records / "after").read_text().isdigit()
