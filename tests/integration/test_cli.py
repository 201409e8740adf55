"""Every ``agent-worker`` command as a subprocess against real Postgres and
Redis, its ``--json`` output parsed, its exit code and one-line errors checked.

One worker and one beat serve the whole module, both started through the CLI
(``agent-worker worker`` / ``beat``), so those two commands are exercised for
real. The worker arms one fault (``after_intent@book``) so a run can end up
with an effect of unknown outcome for ``effects resolve``.

A CLI process takes seconds to start on a loaded machine, so each command runs
as a subprocess where it is the subject of a test; setup steps and secondary
checks call the same ``main()`` in this process (``inproc=True``), and waits
read the store directly.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_worker.demo.vendor import VendorProcess, start_vendor
from agent_worker.store.base import RunRecord
from agent_worker.store.sql import SqlStore
from tests.store_helpers import delete_run
from tests.support import ROOT, TEST_AGENTS, Proc, wait_for

# The tests build on each other's runs (cli-loop-1): one xdist worker runs them all.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("cli")]


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def lines(self) -> list[Any]:
        """JSON Lines output (``--watch``, ``tail``)."""
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


@dataclass
class Cli:
    env: dict[str, str]
    tmp: Path
    vendor: VendorProcess
    worker: Proc

    store: SqlStore

    def __call__(self, *args: str, code: int = 0, timeout: float = 180, inproc: bool = False,
                 **env: str) -> Result:
        if inproc:
            assert not env, "in-process calls use the module's environment"
            result = _in_process(list(args))
        else:
            done = subprocess.run([sys.executable, "-m", "agent_worker.cli", *args],
                                  env={**self.env, **env}, cwd=ROOT, capture_output=True,
                                  text=True, timeout=timeout)
            result = Result(done.returncode, done.stdout, done.stderr)
        assert result.code == code, (args, result)
        if code != 0:
            assert_one_error_line(result, as_json="--json" in args)
        return result

    def run(self, run_id: str) -> RunRecord:
        run = self.store.get_run(run_id)
        assert run is not None
        return run

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 90) -> RunRecord:
        found: RunRecord = wait_for(
            lambda: (r := self.run(run_id)).status in statuses and r, timeout=timeout,
            interval=0.2, what=f"{run_id} in {statuses}")
        return found

    def submit(self, agent: str, payload: Any, *args: str) -> str:
        run_id: str = self("submit", agent, "--input", json.dumps(payload), *args, "--json",
                           inproc=True).json["id"]
        return run_id


def _in_process(argv: list[str]) -> Result:
    from agent_worker.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return Result(code, out.getvalue(), err.getvalue())


def assert_one_error_line(result: Result, *, as_json: bool = False) -> None:
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    if as_json:
        error = json.loads(lines[0])["error"]
        assert error["exit_code"] == result.code and error["code"] and error["meaning"]
    else:
        assert lines[0].startswith("error: "), result.err
    assert "Traceback" not in result.err


def json_error(result: Result) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(result.err)["error"]
    return error


@pytest.fixture(scope="module")
def cli(database_url: str, broker_url: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """The ``worker_env`` settings (short lease and sweep), at module scope so one
    worker and one beat serve every test here."""
    tmp = tmp_path_factory.mktemp("cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
    env.update(
        PYTHONPATH=str(ROOT), COLUMNS="200",
        AGENT_WORKER_DATABASE_URL=database_url, AGENT_WORKER_BROKER_URL=broker_url,
        AGENT_WORKER_AGENT_MODULES=TEST_AGENTS, AGENT_WORKER_LEASE_TTL_SECONDS="3",
        AGENT_WORKER_HEARTBEAT_INTERVAL_SECONDS="1", AGENT_WORKER_SWEEP_INTERVAL_SECONDS="0.5",
        AGENT_WORKER_QUEUED_OVERDUE_SECONDS="5", AGENT_WORKER_RETRY_BACKOFF_SECONDS="0.2",
        AGENT_WORKER_MAX_LAP_ATTEMPTS="2", AGENT_WORKER_FAULT_DIR=str(tmp / "faults"),
    )
    vendor = start_vendor(tmp / "vendor.db")
    env["AGENT_WORKER_VENDOR_URL"] = vendor.url
    cli_cmd = [sys.executable, "-m", "agent_worker.cli"]
    worker = Proc([*cli_cmd, "worker", "--concurrency", "2", "--without-gossip",
                   "-n", f"cli-{os.getpid()}@%h"],
                  {**env, "AGENT_WORKER_FAULTS": "after_intent@book",
                   "AGENT_WORKER_LOG_JSON": "true"}, tmp / "worker.log").start()
    beat = Proc([*cli_cmd, "beat", "--schedule", str(tmp / "beat.db")], env,
                tmp / "beat.log").start()
    store = SqlStore(database_url)
    with _in_process_env(env, broker_url):
        try:
            yield Cli(env, tmp, vendor, worker, store)
        finally:
            for p in (worker, beat):
                p.kill(signal.SIGKILL)
            vendor.stop()
            store.dispose()


@contextmanager
def _in_process_env(env: dict[str, str], broker_url: str) -> Iterator[None]:
    """This process's settings and default client point where the subprocesses' do."""
    import agent_worker.api as api
    from agent_worker.core.settings import get_settings
    from agent_worker.tasks import app

    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        if k.startswith("AGENT_WORKER_"):
            mp.setenv(k, v)
    get_settings.cache_clear()
    api.configure(None)
    previous = app.conf.broker_url
    app.conf.update(broker_url=broker_url)
    try:
        yield
    finally:
        api.configure(None)
        mp.undo()
        get_settings.cache_clear()
        app.conf.update(broker_url=previous)


# --- no worker needed ------------------------------------------------------------------


def test_db_upgrade_and_launch_commands(cli: Cli) -> None:
    db = cli("db", "upgrade", "--json").json
    assert db["revision"] and "@" in db["database"]
    argv = cli("worker", "--dry-run", "--json", "--concurrency", "3").json["argv"]
    assert argv[1:6] == ["-m", "celery", "-A", "agent_worker.tasks", "worker"]
    queues = argv[argv.index("--queues") + 1].split(",")
    assert "laps.loop.v1" in queues and "laps.refund-desk.v1" in queues and "maint" in queues
    assert argv[-2:] == ["--concurrency", "3"], "extra arguments pass through"
    custom = cli("worker", "--dry-run", "--json", "-Q", "only", inproc=True).json["argv"]
    assert "--queues" not in custom and custom[-2:] == ["-Q", "only"]
    beat = cli("beat", "--dry-run", "--json", "--schedule", "/tmp/s.db").json["argv"]
    assert beat[4:6] == ["agent_worker.tasks", "beat"]
    assert beat[beat.index("--schedule") + 1] == "/tmp/s.db"


def test_bad_input_exit_codes(cli: Cli) -> None:
    assert cli("submit", "no-such-agent", code=2).err.startswith("error: unknown_agent: ")
    assert cli("runs", "show", "no-such-run", code=3).err.startswith("error: unknown_run: ")

    def err(*args: str, code: int) -> str:
        return cli(*args, code=code, inproc=True).err

    assert "not valid JSON" in err("submit", "loop", "--input", "{nope", code=2)
    assert "cannot read" in err("submit", "loop", "--input", "@/nonexistent.json", code=2)
    assert err("submit", "loop", "--run-id", "bad id!", code=2).startswith(
        "error: invalid_input")
    assert err("cancel", "no-such-run", "--reason", "x", code=3)
    assert err("signal", "no-such-run", "go", code=3)
    assert err("runs", "show", code=2).startswith("error: usage: ")
    assert err("runs", "list", "--bogus", code=2).startswith("error: usage: ")
    assert "unknown effect" in err("effects", "resolve", "nope:1:0", "--applied", code=3)
    assert "--applied or --not-applied" in err("effects", "resolve", "nope:1:0", code=2)
    assert "unknown approval" in err("approve", "no-such-approval", code=3)


def test_json_errors_are_json_with_the_exit_codes_meaning(cli: Cli) -> None:
    """Scripts that ask for --json get errors they can parse (they were text)."""
    # The registered agents listed in the message depend on what this test
    # process has imported; the error's shape does not.
    for inproc in (False, True):
        error = json_error(cli("submit", "no-such-agent", "--json", code=2, inproc=inproc))
        assert error.pop("message").startswith("unknown agent 'no-such-agent' (registered: ")
        assert error == {"code": "unknown_agent", "exit_code": 2, "meaning": "bad input"}
    shown = json_error(cli("runs", "show", "no-such-run", "--json", code=3))
    assert shown["code"] == "unknown_run" and shown["meaning"] == "not found"
    usage = json_error(cli("runs", "list", "--json", "--bogus", code=2, inproc=True))
    assert usage["code"] == "usage" and usage["meaning"] == "bad input"


def test_unknown_option_values_are_refused_with_the_allowed_ones(cli: Cli) -> None:
    """``runs list --status bogus`` used to say "no runs match" and exit 0."""
    def err(*args: str) -> str:
        return cli(*args, code=2, inproc=True).err

    assert "queued, running, waiting, sleeping, succeeded, failed, cancelled" in err(
        "runs", "list", "--status", "bogus")
    assert "pending, approved, rejected, timed_out, cancelled" in err(
        "approvals", "list", "--status", "bogus")
    assert "pending, applied, failed, compensated, unknown" in err(
        "effects", "list", "any-run", "--status", "bogus")
    refused = json_error(cli("runs", "list", "--status", "bogus", "--json", code=2))
    assert "'bogus' is not one of" in refused["message"]


def test_submit_validates_the_demo_agents_input_on_postgres(cli: Cli) -> None:
    """refund-desk has an input_model: unknown or mistyped fields are refused
    before anything is written (``{"count": "many"}`` used to start a run)."""
    before = len(cli("runs", "list", "--agent", "refund-desk", "--json", inproc=True).json)
    for bad in ('{"count": "many"}', '{"orders": "many"}', '{"orders": 99}'):
        error = json_error(cli("submit", "refund-desk", "-i", bad, "--json", code=2))
        assert error["code"] == "invalid_input" and "refund-desk" in error["message"]
    assert len(cli("runs", "list", "--agent", "refund-desk", "--json", inproc=True).json) \
        == before


# --- with the module's worker ---------------------------------------------------------------


def test_submit_wait_prints_the_result_as_json(cli: Cli) -> None:
    """Not a Python repr (``{'laps': 2}``): a person pastes it into jq."""
    out = cli("submit", "loop", "--input", '{"laps": 2}', "--wait", "--timeout", "120").out
    assert json.loads(out.strip().splitlines()[-1]) == {"laps": 2}


def test_submit_wait_list_show_and_plan_progress(cli: Cli, database_url: str) -> None:
    (cli.tmp / "input.json").write_text(json.dumps({"laps": 3}))
    run = cli("submit", "loop", "--input", f"@{cli.tmp / 'input.json'}", "--run-id",
              "cli-loop-1", "--tenant", "cli-t1", "--wait", "--timeout", "120", "--json").json
    assert run["id"] == "cli-loop-1" and run["status"] == "succeeded"
    assert run["result"] == {"laps": 3} and run["lap"] == 3 and run["tenant"] == "cli-t1"
    again = cli("submit", "loop", "--input", '{"laps": 3}', "--run-id", "cli-loop-1",
                "--json", inproc=True).json
    assert again["id"] == "cli-loop-1" and again["status"] == "succeeded", "idempotent id"
    other = cli("submit", "loop", "--input", '{"laps": 4}', "--run-id", "cli-loop-1",
                "--json", code=2, inproc=True)
    assert json.loads(other.err)["error"]["code"] == "run_conflict", "another input: refused"

    listed = cli("runs", "list", "--tenant", "cli-t1", "--json").json
    assert [r["id"] for r in listed] == ["cli-loop-1"]
    assert cli("runs", "list", "--tenant", "cli-t1", "--status", "failed", "--json",
               inproc=True).json == []
    assert [r["id"] for r in cli("runs", "list", "--agent", "loop", "--agent-version", "1",
                                 "--status", "succeeded", "--limit", "500", "--json",
                                 inproc=True).json if r["id"] == "cli-loop-1"] == ["cli-loop-1"]
    human: Any = cli("runs", "list", "--tenant", "cli-t1", inproc=True)
    assert "cli-loop-1" in human.out and "succeeded" in human.out

    shown = cli("runs", "show", "cli-loop-1", "--laps", "--json").json
    assert shown["budget"]["laps"] == {"used": 3, "limit": 1000}
    assert shown["since_checkpoint_seconds"] >= 0 and shown["pending_approvals"] == []
    assert [lap["lap"] for lap in shown["laps"]] == [1, 2, 3]
    first = shown["laps"][0]
    assert first["model"]["tool_calls"] == [{"name": "step", "arguments": {"n": 1,
                                                                          "pause": 0.0}}]
    assert first["tools"][0]["name"] == "step" and first["tools"][0]["ms"] is not None
    assert [t["step"] for t in first["trace"]] == ["model", "tool", "commit"]
    assert shown["laps"][2]["model"]["text"] == '{"laps": 3}' and not shown["laps"][2]["tools"]
    human = cli("runs", "show", "cli-loop-1", "--laps", "--last", "2", inproc=True).out
    assert "lap 2" in human and "lap 1 " not in human and "succeeded" in human

    # An agent that declares a plan in its checkpoint: progress shows against it.
    from sqlalchemy import select, update

    from agent_worker.store.rows import checkpoints

    with cli.store.engine.begin() as conn:
        where = (checkpoints.c.run_id == "cli-loop-1", checkpoints.c.lap == 3)
        state = dict(conn.execute(select(checkpoints.c.state).where(*where)).scalar_one())
        state["plan"] = [{"title": "read", "done": True}, {"title": "write", "done": False}]
        conn.execute(update(checkpoints).where(*where).values(state=state))
    row = cli("runs", "list", "--tenant", "cli-t1", "--json").json[0]
    assert row["plan"] == {"done": 1, "total": 2, "next": "write"}
    assert "1/2" in cli("runs", "list", "--tenant", "cli-t1", inproc=True).out


def test_tail_and_watch_follow_laps(cli: Cli) -> None:
    run_id = cli.submit("loop", {"laps": 4, "pause": 0.2}, "--tenant", "cli-batch")
    events = cli("runs", "tail", run_id, "--last", "1000", "--interval", "0.2",
                 "--timeout", "120", "--json").lines
    laps = [e["lap"] for e in events if e["event"] == "lap_committed"]
    assert laps == [1, 2, 3, 4]
    assert all(e["tools"][0]["name"] == "step" for e in events
               if e["event"] == "lap_committed" and e["lap"] < 4)
    assert events[-1]["event"] == "end" and events[-1]["run"]["status"] == "succeeded"

    cli.submit("loop", {"laps": 3, "pause": 0.2}, "--tenant", "cli-batch")
    frames = cli("runs", "list", "--tenant", "cli-batch", "--watch", "--until-done",
                 "--interval", "0.3", "--json").lines
    assert frames[-1]["total"] == 2 and frames[-1]["finished"] == 2
    assert frames[-1]["by_status"] == {"succeeded": 2}
    assert cli("runs", "list", "--tenant", "cli-batch", "--watch", "--count", "1",
               "--json", inproc=True).lines[0]["total"] == 2


def test_stale_filter(cli: Cli, database_url: str) -> None:
    """A run no worker serves sits queued with no checkpoint: it shows as stale."""
    from agent_worker.agent import Agent, register
    from agent_worker.api import AgentWorker
    from agent_worker.core.settings import Settings
    from agent_worker.model.scripted import ScriptedModel, turn
    from agent_worker.runtime import Runtime

    class Drop:
        def send(self, lap: object) -> None:
            pass

    register(Agent(name="cli-orphan", model=lambda: ScriptedModel(lambda r: turn("x"))))
    aw = AgentWorker(Runtime(store=cli.store, dispatcher=Drop(),
                             settings=Settings(database_url=database_url)))
    orphan = aw.start_run("cli-orphan", {})
    try:
        def stale_ids() -> set[str]:
            rows = cli("runs", "list", "--stale", "--json",
                       AGENT_WORKER_STALE_AFTER_SECONDS="0.5").json
            return {r["id"] for r in rows if r["stale"]}

        wait_for(lambda: orphan.id in stale_ids(), timeout=30, interval=0.5, what="stale")
        assert orphan.id not in {r["id"] for r in cli("runs", "list", "--stale", "--json",
                                                        inproc=True).json}
    finally:
        delete_run(cli.store, orphan.id)


def test_approve_and_reject(cli: Cli) -> None:
    plan = {"plan": [["wire_money", {"account": "cli-a1", "amount_cents": 250}]]}
    paid_before = cli.vendor.client.stats()["total_cents"]
    approved, rejected = cli.submit("pauses", plan), cli.submit("pauses", plan)
    for run_id in (approved, rejected):
        cli.wait_status(run_id, "waiting")
    inbox = cli("approvals", "list", "--json").json
    mine = {a["run_id"]: a for a in inbox if a["run_id"] in (approved, rejected)}
    assert set(mine) == {approved, rejected}
    assert mine[approved]["tool"] == "wire_money" and mine[approved]["owner"] == "ops"
    shown = cli("runs", "show", approved, "--json", inproc=True).json
    assert shown["waiting_for"] == f"approval:{mine[approved]['id']}"
    assert [a["id"] for a in shown["pending_approvals"]] == [mine[approved]["id"]]

    decided = cli("approve", mine[approved]["id"], "--comment", "ok", "--json",
                  AGENT_WORKER_PRINCIPAL_ID="alice").json
    assert decided["status"] == "approved" and decided["decided_by"] == "alice"
    assert cli("reject", rejected, "--comment", "no", "--json",
               AGENT_WORKER_PRINCIPAL_ID="bob").json["status"] == "rejected"
    cli.wait_status(approved, "succeeded")
    cli.wait_status(rejected, "succeeded")
    assert cli("approve", mine[approved]["id"], code=4,
               inproc=True).err.startswith("error: already_decided: ")
    assert cli("approvals", "list", "--status", "approved", "--run", approved, "--json",
               inproc=True).json[0]["decided_by"] == "alice"
    paid = cli.vendor.client.stats()["total_cents"] - paid_before
    assert paid == 250, "only the approved call paid"


def test_signal_resumes_a_waiting_run(cli: Cli) -> None:
    run_id = cli.submit("pauses", {"plan": [["wait_for_signal", {"name": "go"}]]})
    assert cli.wait_status(run_id, "waiting").waiting_for == "signal:go"
    sent = cli("signal", run_id, "go", "--payload", '{"n": 7}', "--json").json
    assert sent["name"] == "go" and sent["payload"] == {"n": 7}
    cli.wait_status(run_id, "succeeded")
    laps = cli("runs", "show", run_id, "--laps", "--json", inproc=True).json["laps"]
    delivered = [t for lap in laps for t in lap["tools"] if t["name"] == "wait_for_signal"]
    assert delivered and '"n": 7' in delivered[0]["result"]
    assert cli("signal", run_id, "go", code=4, inproc=True).err.startswith(
        "error: invalid_state: ")


def test_cancel_waits_for_the_run_to_stop(cli: Cli) -> None:
    run_id = cli.submit("loop", {"laps": 500, "pause": 0.2})
    wait_for(lambda: cli.run(run_id).lap >= 1, timeout=60, what="a first lap")
    done = cli("cancel", run_id, "--reason", "operator test", "--wait",
               "--timeout", "90", "--json", AGENT_WORKER_PRINCIPAL_ID="bob").json
    assert done["status"] == "cancelled" and done["cancel_requested"]
    assert cli.run(run_id).cancelled_by == "bob"
    assert cli("cancel", run_id, "--reason", "again", code=4, inproc=True).err


def test_failed_run_retry_and_structured_logs(cli: Cli) -> None:
    failed = cli("submit", "poison", "--input", "{}", "--wait", "--timeout", "120", "--json",
                 code=1)
    run = failed.json
    assert run["status"] == "failed" and run["error_code"] == "lap_error"
    assert json_error(failed)["code"] == "lap_error"
    again = cli("retry", run["id"], "--json", AGENT_WORKER_PRINCIPAL_ID="carol").json
    # Only the status is the verb's to show: the retried lap goes to a live
    # worker, which may fail it again (and set its error) before the verb
    # reads the run back. The events below show the retry was one.
    assert again["status"] in ("queued", "running")
    tailed = cli("runs", "tail", run["id"], "--last", "1000", "--timeout", "120", "--json",
                 code=1)
    assert tailed.lines[-1]["run"]["status"] == "failed"
    kinds = [e["event"] for e in tailed.lines]
    assert kinds.count("retry") == 2 and kinds.count("retried") == 1, kinds
    succeeded = _succeeded_loop(cli)
    assert cli("retry", succeeded, code=4, inproc=True).err.startswith(
        "error: invalid_state: ")
    # The worker logs JSON lines that carry the lap's identity.
    records = [json.loads(line) for line in cli.worker.log.read_text().splitlines()
               if line.startswith("{")]
    retries = [r for r in records if r.get("run_id") == run["id"] and "retrying" in
               r["message"]]
    assert retries, "no structured retry log line"
    assert retries[0]["agent"] == "poison@1" and retries[0]["lap"] == 1
    assert retries[0]["attempt"] == 1 and "tenant" not in retries[0]
    assert retries[0]["task"] == "agent_worker.run_lap" and retries[0]["task_id"]


def test_unknown_effect_is_resolved_by_a_human(cli: Cli) -> None:
    """The worker dies right after writing the intent of a compensatable call with
    no lookup: nobody knows whether it landed, so the run waits for a human."""
    run_id = cli.submit("pauses", {"plan": [["book", {"order_id": "cli-e1",
                                                      "amount_cents": 100}]]})
    run = cli.wait_status(run_id, "waiting", timeout=120)
    assert (run.waiting_for or "").startswith("effect:") and run.error_code == "effect_unknown"
    unknown = cli("effects", "list", run_id, "--status", "unknown", "--json").json
    assert [e["tool"] for e in unknown] == ["book"]
    key = unknown[0]["key"]
    resolved = cli("effects", "resolve", key, "--applied",
                   "--result", '{"refund_id": "manual"}', "--json",
                   AGENT_WORKER_PRINCIPAL_ID="ops").json
    assert resolved["resolved"] == "applied" and resolved["effect"]["status"] == "applied"
    cli.wait_status(run_id, "succeeded")
    laps = cli("runs", "show", run_id, "--laps", "--json", inproc=True).json["laps"]
    booked = [t for lap in laps for t in lap["tools"] if t["name"] == "book"]
    assert booked == [{**booked[0], "effect": {"key": key, "kind": "compensatable",
                                               "status": "applied"}}]
    assert "manual" in booked[0]["result"], "the model saw the resolved result"
    assert cli("effects", "resolve", key, "--not-applied", code=4,
               inproc=True).err
    assert key not in cli.vendor.client.stats()["by_key"], "book was never re-called"


def _succeeded_loop(cli: Cli) -> str:
    """A finished three-lap run of this test's own. Not cli-loop-1 (tenant
    cli-t1, from an earlier test): in full parallel runs a later test now and
    then found that run unknown (subprocess and in-process alike), which is
    not explained yet (see the session's closing note); these tests check
    retry and fork, not that."""
    run_id: str = cli("submit", "loop", "--input", '{"laps": 3}', "--wait", "--timeout", "120",
                      "--json").json["id"]
    return run_id


def test_fork_from_a_lap(cli: Cli) -> None:
    source = _succeeded_loop(cli)
    fork = cli("fork", source, "--lap", "1", "--run-id", "cli-fork-1", "--json").json
    assert fork["id"] == "cli-fork-1" and fork["parent_run_id"] == source
    assert fork["forked_from_lap"] == 1
    assert cli.wait_status("cli-fork-1", "succeeded").result == {"laps": 3}
    assert cli("fork", source, "--lap", "99", code=3, inproc=True).err


def test_metrics_once_and_demo(cli: Cli) -> None:
    scrape = cli("metrics", "--once", "--json").json
    runs = {s["labels"]["status"]: s["value"] for s in scrape["agent_worker_runs"]}
    assert runs["succeeded"] >= 1 and scrape["agent_worker_store_up"][0]["value"] == 1
    demo = cli("demo", "--runs", "2", "--orders", "1", "--timeout", "120", "--json").json
    assert demo["succeeded"] == 2 and [r["laps"] for r in demo["runs"]] == [5, 5]
    assert demo["vendor"]["duplicates"] == 0
    # Every lap shows its own call's effect (the scripted model reuses call_0).
    laps = cli("runs", "show", demo["runs"][0]["id"], "--laps", "--json").json["laps"]
    effects = [(t["name"], t["effect"] and t["effect"]["key"].split(":", 1)[1])
               for lap in laps for t in lap["tools"]]
    assert effects == [("list_orders", None), ("get_order", None), ("refund", "3:0"),
                       ("send_notice", "4:0")]
