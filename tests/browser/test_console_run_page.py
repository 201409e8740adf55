"""The run page in a real browser, on a real fleet: a worker killed in the
middle of a lap shows on the run's timeline as the gap its lease left,
labelled; a fan-out of ten children shows as the run's tree, each child
linked with its status; an operator raises the budget a run paused on, and
the run resumes (the API's audit log names them); no page logs an error.

The worker really dies: its fleet is armed to SIGKILL the process that has
just recorded the outcome of the ``stamp`` call (``agent_worker.core.faults``),
once; its lease lapses and the beat's sweeper hands the lap to the restarted
worker, as in production.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, expect

from agent_worker.api import AgentWorker
from agent_worker.core.principal import Principal
from tests.browser.server import Cast, ConsoleServer
from tests.browser.test_console_browser import log_in
from tests.support import Fleet, logs, run_reaching, supervised

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.xdist_group("browser")]

#: The call whose worker dies right after its outcome is recorded.
FAULT = "after_outcome@stamp"


@pytest.fixture(scope="module")
def console_env(console_env: dict[str, str]) -> dict[str, str]:
    """The shared environment, plus the child-run agents (``fan``, ``kid``)."""
    modules = console_env["AGENT_WORKER_AGENT_MODULES"]
    return {**console_env, "AGENT_WORKER_AGENT_MODULES": f"{modules},tests.child_agents"}


@pytest.fixture(scope="module")
def browser_fleet(console_env: dict[str, str],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A worker armed to die once after the stamp lands (restarted if the
    whole process died, as systemd would: the threads pool has no parent to
    replace a child), and a beat whose sweeper recovers the lapsed lease."""
    fleet = Fleet({**console_env, "AGENT_WORKER_FAULTS": FAULT},
                  tmp_path_factory.mktemp("fleet"))
    worker = fleet.worker(concurrency=2)
    fleet.beat()
    with supervised(worker):
        yield fleet
    fleet.close()
    print(logs(fleet))  # shown only when a test failed


@dataclass(frozen=True)
class Runs:
    stamped: str
    fan: str
    budget: str


@pytest.fixture(scope="module", autouse=True)
def runs(submitter: AgentWorker, browser_fleet: Fleet) -> Runs:
    """Started as the module starts, so the fleet moves them meanwhile."""
    return Runs(stamped=submitter.start_run("console-stamp", {}).id,
                fan=submitter.start_run("fan", {"n": 10}).id,
                budget=submitter.start_run("console-budget", {}).id)


def test_a_killed_workers_lap_shows_its_recovery_gap_on_the_timeline(
        page: Page, errors: list[str], console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    done = run_reaching(submitter, runs.stamped, "succeeded", timeout=120)
    assert done.recoveries >= 1  # the worker did die mid-lap
    log_in(page, console, cast.viewer, path=f"/runs/{runs.stamped}")
    row = page.locator("#run-timeline a.tl-row[data-lap='1']")
    expect(row).to_have_attribute("data-cause", "recovered")
    expect(row.locator(".tl-text")).to_contain_text("lease expired, recovered")
    expect(row.locator(".tl-gap[data-cause='recovered']")).to_have_count(1)
    expect(row.locator(".tl-bar[data-kind='tool']")).to_have_count(1)
    expect(page.locator("#run-timeline .legend")).to_contain_text("lease expired, recovered")
    row.click()  # to the lap's calls and effects
    expect(page).to_have_url(f"{console.url}/runs/{runs.stamped}#lap-1")
    expect(page.locator("#lap-1")).to_contain_text("stamp")


def test_the_tree_shows_a_fan_out_of_ten_children(
        page: Page, errors: list[str], console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    run_reaching(submitter, runs.fan, "succeeded", timeout=120)
    kids = submitter.list_runs(parent=runs.fan)
    assert len(kids) == 10
    log_in(page, console, cast.viewer, path=f"/runs/{runs.fan}")
    children = page.locator("#children > ul > li[data-run-id]")
    expect(children).to_have_count(10)
    for kid in kids:
        item = page.locator(f"#children li[data-run-id='{kid.id}']")
        expect(item).to_have_attribute("data-status", "succeeded")
    first = kids[0]
    page.locator(f"#children li[data-run-id='{first.id}'] > a").click()
    expect(page.locator("#run-title")).to_have_text(f"Run {first.id}")
    expect(page.locator("#parent a")).to_have_attribute("href", f"/runs/{runs.fan}")


def test_an_operator_raises_the_budget_and_the_paused_run_resumes(
        page: Page, errors: list[str], console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    paused = run_reaching(submitter, runs.budget, "waiting", timeout=120)
    assert paused.waiting_for == "budget"
    log_in(page, console, cast.operator, path=f"/runs/{runs.budget}")
    expect(page.locator("#budget tr[data-budget='laps'] .used")).to_have_text("1")
    page.locator("#raise-budget").click()
    page.get_by_label("Laps (new limit; blank: unchanged)").fill("5")
    page.locator("#confirm-submit").click()
    expect(page.locator("#notice")).to_have_text("Budget raised: the run resumes.")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "succeeded",
                                                          timeout=60_000)
    expect(page.locator("#budget tr[data-budget='laps'] .limit")).to_have_text("5")
    auditor = submitter.acting_as(Principal("auditor", cast.tenant, ("operator",)))
    entries = auditor.audit(principal=cast.operator.id, action="raise_budget")
    assert [e.run_id for e in entries] == [runs.budget]
