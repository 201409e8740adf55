"""The CLI verbs of run state and search (``runs list --label``, ``runs state``,
``runs update-state``, ``approve --arguments``) in this process against an
in-process worker on both dialects: the CLI is a thin layer over the API verbs
the other engine tests check; here its options, JSON and errors. The label
values are the test's own (on Postgres the database is the session's)."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import redirect_stdout

import pytest

import agent_worker.api as api
from agent_worker import InProcessWorker, ScriptedModel, ToolContext, register, tool, turn
from agent_worker.agent import Agent
from agent_worker.cli import common, main
from agent_worker.core.errors import ModelRefusalError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.state_toolkit import state_tools
from tests.engine.cli_json import cli
from tests.principals import acting


@tool(kind="irreversible")
def pay(amount_cents: int, ctx: ToolContext) -> int:
    """Pay; a human approves it."""
    return amount_cents


register(Agent(name="cli-state", model=ScriptedModel(
    lambda r: turn("paying", [("pay", {"amount_cents": 700})]) if r.lap == 1
    else turn("done")), tools=[pay]))


register(Agent(name="cli-planner", model=ScriptedModel(
    lambda r: turn("planning", [("set_plan", {"steps": ["look [up]", "[bold]reply[/]"]}),
                                ("mark_step", {"step": 1})]) if r.lap == 1
    else turn("done")), tools=[*state_tools]))


def _refuse(r: ModelRequest) -> ModelResponse:
    raise ModelRefusalError("[red]no[/]")


register(Agent(name="cli-refused", model=ScriptedModel(_refuse)))


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(dialect_url)
    api.configure(worker)
    yield worker
    api.configure(None)
    worker.close()




def test_state_labels_and_edited_approvals_from_the_cli(w: InProcessWorker) -> None:
    customer = f"acme-cli-{uuid.uuid4().hex[:8]}"
    run = w.start_run("cli-state", "go", labels={"customer": customer, "queue": "vip"})
    w.start_run("cli-state", "go", labels={"customer": "other"})
    w.run_until_idle()
    listed = cli("runs", "list", "--label", f"customer={customer}", "--label", "queue=vip",
                 "--json")
    assert [r["id"] for r in listed["runs"]] == [run.id] and listed["next_cursor"] is None
    assert listed["runs"][0]["labels"] == {"customer": customer, "queue": "vip"}
    page = cli("runs", "list", "--since", "2000-01-01T00:00:00", "--limit", "1", "--json")
    assert len(page["runs"]) == 1 and page["next_cursor"]
    assert cli("runs", "list", "--label", "nokey", "--json", code=2)["code"] == "invalid_input"
    assert cli("runs", "list", "--cursor", "bogus", "--json", code=2)["code"] == "invalid_input"

    state = cli("runs", "state", run.id, "--json")
    assert state["status"] == "waiting" and state["pending_calls"][0]["call"]["name"] == "pay"
    assert cli("runs", "state", "nope", "--json", code=3)["code"] == "unknown_run"

    bad = cli("approve", run.id, "--arguments", '{"amount_cents": "x"}',
              "--json", code=2)
    assert "pay's schema" in bad["message"]
    ok = cli("approve", run.id, "--arguments", '{"amount_cents": 50}', "--json")
    assert ok["approved_arguments"] == {"amount_cents": 50} and ok["arguments"] == {
        "amount_cents": 700}

    edit = cli("runs", "update-state", run.id, "--fact", 'ticket={"id": 7}', "--plan", "pay",
               "--plan", "close", "--note", "be brief", "--json")
    assert edit["fields"] == ["facts", "note", "plan"] and edit["applied_lap"] is None
    w.run_until_idle()
    shown = cli("runs", "show", run.id, "--json")
    assert shown["status"] == "succeeded" and shown["labels"]["queue"] == "vip"
    assert shown["checkpoint"]["facts"] == {"ticket": {"id": 7}}
    assert [p["title"] for p in shown["checkpoint"]["plan"]] == ["pay", "close"]
    assert [e.args for e in w.effects(run.id)] == [{"amount_cents": 50}]
    assert cli("runs", "update-state", run.id, "--note", "late", "--json",
               code=4)["code"] == "invalid_state"


def test_runs_show_prints_plan_facts_and_labels(w: InProcessWorker) -> None:
    run = w.start_run("cli-state", "go", labels={"customer": "acme-show"})
    w.run_until_idle()
    w.update_state(run.id, facts={"ticket": 7}, plan=["pay"])
    acting(w, "ops").approve(run.id)
    w.run_until_idle()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["runs", "show", run.id]) == 0
    text = out.getvalue()
    assert '{"ticket": 7}' in text and "customer=acme-show" in text and "0/1" in text


def _text(*argv: str) -> str:
    """What a command prints for a person, into a pipe (as here: not a terminal)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_runs_state_prints_done_steps_with_their_mark(w: InProcessWorker) -> None:
    run = w.start_run("cli-planner", "go")
    w.run_until_idle()
    lines = _text("runs", "state", run.id).splitlines()
    # the mark, and step titles as data: their brackets are text, not markup
    assert "  1. [x] look [up]" in lines and "  2. [ ] [bold]reply[/]" in lines
    shown = _text("runs", "show", run.id)
    assert "next: [bold]reply[/]" in shown


def test_failed_runs_listed_into_a_pipe_print_no_markup(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    # Into a pipe the table is as wide as COLUMNS says (Rich's 80 without it,
    # as on CI, which cuts the error column off): wide enough for the whole row.
    monkeypatch.setattr(common.console, "width", 200)
    run = w.start_run("cli-refused", "go")
    w.run_until_idle()
    assert w.get_run(run.id).status == "failed"
    text = _text("runs", "list", "--status", "failed", "--limit", "500")
    (line,) = [ln for ln in text.splitlines() if ln.startswith(run.id)]
    assert "model_refusal" in line and "[" not in line
    assert "[red]" not in text and "[/]" not in text
