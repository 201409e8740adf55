"""Regenerate the console's screenshots from a demo fleet:
``python -m bench.screenshots`` (writes docs/console-inbox.png,
docs/console-run.png, docs/console-timeline.png and docs/console-tree.png).

It builds what ``deploy/local/demo.sh`` runs, in miniature and on its own
database and Redis database on the local servers (so the pictures never show
someone else's runs): the demo vendor, a Celery worker, the console, two
``refund-desk`` runs that finish and two ``goodwill-credit`` runs that wait for
an approver, one more credit the lead approves after a pause, and a ``fan``
run of ten children (the tests' child agents). Then headless Chromium (the
OS's, as in the browser tests) logs in as a support lead and photographs the
approvals inbox, a finished run, the approved credit's timeline (its wait
for the approval labelled) and the fan-out's run tree.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, sync_playwright

from agent_worker.api import AgentWorker
from agent_worker.core.principal import Principal
from agent_worker.demo import goodwill, refund_desk
from agent_worker.demo.vendor import start_vendor
from agent_worker.store.migrate import upgrade
from bench.common import ROOT, RedisDb, create_database, drop_database, sa_url
from tests.browser.chromium import launch
from tests.browser.server import ConsoleServer, User
from tests.support import Fleet, client_on, run_reaching, worker_environ

TENANT = "acme"
#: The demo's agents, and the tests' ``fan`` and ``kid`` for a run tree.
AGENTS = f"{refund_desk.__name__},{goodwill.__name__},tests.child_agents"
#: How long the approved credit waits for its approver (the timeline's gap).
APPROVAL_WAIT_SECONDS = 3.0
VIEWPORT: ViewportSize = {"width": 1280, "height": 1000}
#: The run page is long: tall enough for the header, the actions, the budget and
#: the lap timeline (the messages and ledger below are paged anyway).
RUN_VIEWPORT: ViewportSize = {"width": 1280, "height": 1500}


@dataclass(frozen=True)
class Pictured:
    """The runs the pictures show."""

    refund: str
    approved: str
    fan: str


def _runs(aw: AgentWorker, lead: User) -> Pictured:
    """Start the pictured runs; their ids, once all are where the pictures need them."""
    desk = aw.acting_as(Principal("desk-app", TENANT, ("submitter",)))
    refunds = [desk.start_run(refund_desk.refund_desk.name, {"orders": n}).id for n in (3, 2)]
    credits = [desk.start_run(goodwill.goodwill_credit.name,
                              {"order_id": order, "incidents": incidents}).id
               for order, incidents in (("ord-042", 2), ("ord-117", 3), ("ord-230", 2))]
    fan = desk.start_run("fan", {"n": 10}).id
    for run_id in credits:
        run_reaching(desk, run_id, "waiting", timeout=180)
    time.sleep(APPROVAL_WAIT_SECONDS)  # the wait the timeline shows, labelled
    approver = aw.acting_as(Principal(lead.id, TENANT, lead.roles))
    approver.approve(credits[2], comment="two incidents: credit them")
    for run_id in [*refunds, credits[2], fan]:
        run_reaching(desk, run_id, "succeeded", timeout=180)
    return Pictured(refunds[0], credits[2], fan)


def _photograph(page: Page, url: str, user: User, runs: Pictured, out: Path) -> list[Path]:
    page.goto(f"{url}/login?next=/approvals")
    page.get_by_label("User").fill(user.id)
    page.get_by_label("Password").fill(user.password)
    page.get_by_role("button", name="Log in").click()
    page.locator("#approvals-mine article").first.wait_for()
    inbox, run = out / "console-inbox.png", out / "console-run.png"
    timeline, tree = out / "console-timeline.png", out / "console-tree.png"
    page.screenshot(path=str(inbox), full_page=True)
    page.set_viewport_size(RUN_VIEWPORT)
    page.goto(f"{url}/runs/{runs.refund}")
    page.locator("#run-status[data-status='succeeded']").wait_for()
    page.screenshot(path=str(run))
    page.goto(f"{url}/runs/{runs.approved}")
    page.locator("#run-status[data-status='succeeded']").wait_for()
    page.locator("#run-timeline").screenshot(path=str(timeline))
    page.goto(f"{url}/runs/{runs.fan}")
    page.locator("#run-status[data-status='succeeded']").wait_for()
    page.locator("#family").screenshot(path=str(tree))
    return [inbox, run, timeline, tree]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs",
                        help="Where the PNGs go (default: docs/).")
    opts = parser.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    name = f"aw_screens_{uuid.uuid4().hex[:8]}"
    database = sa_url(create_database(name))
    lead = User("lee", TENANT, ("approver", "operator", goodwill.OWNER),
                secrets.token_urlsafe(12))
    try:
        upgrade(database)
        with RedisDb() as redis, tempfile.TemporaryDirectory(prefix="aw-screens-") as tmp:
            logs = Path(tmp)
            vendor = start_vendor(logs / "vendor.db")
            env = {**worker_environ(database, redis.url, logs / "faults", AGENTS),
                   "AGENT_WORKER_VENDOR_URL": vendor.url}
            fleet = Fleet(env, logs)
            console = ConsoleServer(env, logs / "console.log", [lead])
            try:
                fleet.worker(concurrency=2)
                console.start()
                with pytest.MonkeyPatch.context() as patch:
                    for aw in client_on(env, patch):
                        pictured = _runs(aw, lead)
                with sync_playwright() as playwright:
                    browser = launch(playwright)
                    page = browser.new_context(viewport=VIEWPORT).new_page()
                    written = _photograph(page, console.url, lead, pictured, opts.out)
                    browser.close()
            finally:
                console.stop()
                fleet.close()
                vendor.stop()
            for path in written:
                print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    finally:
        drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
