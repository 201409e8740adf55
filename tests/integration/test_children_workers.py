"""Child runs through real Celery workers, Postgres and Redis
(the acceptance test): a fan-out of 50 survives a worker SIGKILLed in the middle, with
every child started once and the parent resumed once with all 50 results (one
of them failed, one cancelled); cancelling a parent cancels its children and
runs their compensations."""

from __future__ import annotations

import io
import json
import signal
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

import tests.child_agents  # noqa: F401  (registers fan and kid here too)
from agent_worker.api import AgentWorker
from agent_worker.cli import main
from agent_worker.core.constants import compensation_key, effect_key
from tests.support import TEST_AGENTS, Fleet, wait_for

pytestmark = pytest.mark.integration

MODULES = f"{TEST_AGENTS},tests.child_agents"


def _journal(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def test_fan_out_of_50_survives_a_killed_worker(aw: AgentWorker, fleet: Fleet,
                                                tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    env = {"AGENT_WORKER_AGENT_MODULES": MODULES, "CHILD_TEST_JOURNAL": str(journal)}
    doomed = fleet.worker(concurrency=2, **env)
    fleet.worker(concurrency=2, **env)
    fleet.beat(**env)
    parent = aw.start_run("fan", {"n": 50, "fail_at": 7, "hold_at": 9, "sleep": 0.15})
    wait_for(lambda: aw.get_run(parent.id).status == "waiting", timeout=30, what="fan-out")
    kids = {k.id: k for k in aw.list_runs(parent=parent.id, limit=100)}
    assert len(kids) == 50
    held = f"{parent.id}:1:0:9"
    wait_for(lambda: aw.get_run(held).status == "waiting", timeout=30, what="kid 9 holds")
    aw.cancel(held, reason="not needed")
    wait_for(lambda: sum(k.status == "succeeded" for k in aw.list_runs(
        parent=parent.id, limit=100)) >= 10, timeout=30, what="some kids done")
    doomed.kill(signal.SIGKILL)
    done = aw.wait(parent.id, timeout=60)
    assert done.status == "succeeded", done.error_message
    told = done.result["children"]
    assert [c["run_id"] for c in told] == [f"{parent.id}:1:0:{i}" for i in range(50)]
    statuses = Counter(c["status"] for c in told)
    assert statuses == Counter({"succeeded": 48, "failed": 1, "cancelled": 1}), statuses
    assert told[7]["error"]["code"] == "model_refusal"
    assert told[9]["reason"] == "not needed"
    assert all(told[i]["result"] == {"double": 2 * i} for i in range(50) if i not in (7, 9))
    # Each child started once; the parent was woken and resumed once.
    for kid in kids:
        assert [e.kind for e in aw.events(kid)].count("run_created") == 1
    events = [e.kind for e in aw.events(parent.id)]
    assert events.count("children_started") == 1 and events.count("woken") == 1
    assert Counter(e.lap for e in aw.events(parent.id) if e.kind == "lap_committed") == \
        Counter({1: 1, 2: 1, 3: 1})
    # Kid 9's reservation was undone once in the ledger, its undo called only
    # under its own idempotency key. The kill may land while kid 9's ending
    # lap compensates (it is queued behind the other kids' laps); the replay
    # then calls the undo again under that same key: compensations are
    # idempotent calls (README, "Limits"), so the journal may hold the line
    # twice. That a finished compensation is never called again is
    # tests/integration/test_effects.py's crash-point test.
    reserved = effect_key(held, 1, 0)
    undo = compensation_key(reserved)
    assert {e.key: e.status for e in aw.effects(held)} == {
        reserved: "compensated", undo: "applied"}
    releases = {line for line in _journal(journal) if line.startswith("release ")}
    assert releases == {f"release {undo}"}


def test_cancelling_the_parent_cancels_children_and_compensates(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    env = {"AGENT_WORKER_AGENT_MODULES": MODULES, "CHILD_TEST_JOURNAL": str(journal)}
    fleet.worker(concurrency=2, **env)
    fleet.beat(**env)
    parent = aw.start_run("fan", {"n": 6, "hold": True})
    wait_for(lambda: [k.status for k in aw.list_runs(parent=parent.id)] == ["waiting"] * 6,
             timeout=30, what="every kid holding")
    aw.cancel(parent.id, reason="changed plans")
    assert aw.wait(parent.id, timeout=30).status == "cancelled"
    wait_for(lambda: all(k.status == "cancelled" for k in aw.list_runs(parent=parent.id)),
             timeout=30, what="kids cancelled")
    undone = _journal(journal)
    for kid in aw.list_runs(parent=parent.id):
        assert undone[f"release {kid.id}:1:0:undo"] == 1
    # The operator's view of the tree.
    tree = _cli("runs", "show", parent.id, "--json")["tree"]
    assert (tree["total"], tree["counts"]) == (6, {"cancelled": 6})
    assert len(_cli("runs", "list", "--parent", parent.id, "--json")) == 6


def _cli(*argv: str) -> Any:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return json.loads(out.getvalue())
