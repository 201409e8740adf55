"""``agent-worker queues`` and ``share set|clear|list``, their JSON errors
and exit codes, and the fair-share Prometheus gauges (in-process, both
dialects). Each test has its own agent and tenant, and ends with no limits
(``end_fair_share``): on Postgres the database, its queues and its limits
table are the test session's."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from prometheus_client import generate_latest

import agent_worker.api as api
from agent_worker import Agent, InProcessWorker, ScriptedModel, turn
from agent_worker.agent import Registry
from agent_worker.cli import common as cli_common
from agent_worker.cli import main
from agent_worker.core.principal import Principal
from agent_worker.metrics import registry_for
from tests.store_helpers import end_fair_share


@pytest.fixture
def aw(dialect_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessWorker]:
    # The table's width follows the terminal (none under xdist): fix it, so no
    # column is cut to an ellipsis (on Postgres the queues table also lists
    # other tests' lines, whose names may be long).
    monkeypatch.setattr(cli_common.console, "_width", 200)
    w = InProcessWorker(dialect_url)
    w.rt.registry = Registry()
    api.configure(w)
    yield w
    api.configure(None)
    w.close()
    end_fair_share(dialect_url)


def _tenant() -> str:
    """A tenant of the test's own, short enough for any column of the tables."""
    return f"a{uuid.uuid4().hex[:6]}"


def _cli(*argv: str) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    text = out.getvalue().strip()
    return code, json.loads(text) if text.startswith("{") else text, err.getvalue()


def test_share_commands_queues_and_gauges(aw: InProcessWorker) -> None:
    agent, tenant = f"cli-{uuid.uuid4().hex[:6]}", _tenant()
    aw.rt.registry.register(Agent(name=agent, model=ScriptedModel(lambda r: turn("ok")),
                                  concurrency=5))
    assert _cli("share", "set", tenant, "--concurrency", "1", "--weight", "2", "--json")[0] == 0
    first = _cli("submit", agent, "--tenant", tenant, "--priority", "7", "--json")[1]["id"]
    second = _cli("submit", agent, "--tenant", tenant, "--json")[1]["id"]
    shown = _cli("runs", "show", first, "--json")[1]
    assert (shown["priority"], shown["throttled"]) == (7, False)
    assert _cli("runs", "show", second, "--json")[1]["throttled"] is True
    assert "throttled" in _cli("runs", "show", second)[1]
    code, out, _ = _cli("queues", "--json")
    line = next(q for q in out["queues"] if q["agent"] == agent)
    assert (line["tenant"], line["tenant_cap"], line["agent_cap"], line["weight"],
            line["in_flight"], line["queued"], line["throttled"]) == (tenant, 1, 5, 2.0, 1, 2, 1)
    assert tenant in _cli("queues")[1] and tenant in _cli("share", "list")[1]
    metrics = generate_latest(registry_for(aw.rt.store, aw.rt.settings)).decode()  # type: ignore[arg-type]
    assert f'agent_worker_share_throttled{{agent="{agent}",tenant="{tenant}"}} 1.0' in metrics
    # Bad input: one JSON error line, the documented exit codes.
    for argv, exit_code, error in (
            (("share", "set", tenant, "--weight", "0"), 2, "invalid_input"),
            (("share", "set", tenant, "--agent", agent, "--weight", "2"), 2, "invalid_input"),
            (("share", "clear", "nobody"), 3, "unknown_share_limit"),
            (("submit", agent, "--priority", "5000"), 2, "invalid_input")):
        code, _, err = _cli(*argv, "--json")
        assert code == exit_code and json.loads(err)["error"]["code"] == error, err
    assert _cli("share", "clear", tenant, "--json")[0] == 0
    aw.run_until_idle()
    assert all(q["throttled"] == 0 for q in _cli("queues", "--json")[1]["queues"]
               if q["agent"] == agent)


def test_share_set_takes_rate_limits_and_refuses_a_submitter(aw: InProcessWorker) -> None:
    tenant = _tenant()
    code, row, _ = _cli("share", "set", tenant, "--laps-per-minute", "30",
                        "--tokens-per-minute", "90000", "--json")
    assert code == 0 and (row["laps_per_minute"], row["tokens_per_minute"]) == (30, 90000)
    listed = _cli("share", "list", "--json")[1]["limits"]
    assert [(r["laps_per_minute"], r["tokens_per_minute"]) for r in listed
            if r["tenant"] == tenant] == [(30, 90000)]
    agent = f"cli-{uuid.uuid4().hex[:6]}"
    aw.rt.registry.register(Agent(name=agent, model=ScriptedModel(lambda r: turn("ok"))))
    _cli("submit", agent, "--tenant", tenant, "--json")
    line = next(q for q in _cli("queues", "--json")[1]["queues"] if q["agent"] == agent)
    assert (line["laps_per_minute"], line["tokens_per_minute"]) == (30, 90000)
    assert "30/90000" in _cli("queues")[1]
    code, _, err = _cli("share", "set", tenant, "--laps-per-minute", "-1", "--json")
    assert code == 2 and json.loads(err)["error"]["code"] == "invalid_input"
    api.configure(aw.acting_as(Principal("sam", tenant, frozenset({"submitter"}))))
    code, _, err = _cli("share", "set", tenant, "--tokens-per-minute", "1", "--json")
    assert code == 5 and json.loads(err)["error"]["code"] == "permission_denied"
