"""Regenerate the README's console screenshots from a demo fleet:
``python -m bench.screenshots`` (writes docs/console-inbox.png and
docs/console-run.png).

It builds what ``deploy/local/demo.sh`` runs, in miniature and on its own
database and Redis database on the local servers (so the pictures never show
someone else's runs): the demo vendor, a Celery worker, the console, two
``refund-desk`` runs that finish and two ``goodwill-credit`` runs that wait for
an approver. Then headless Chromium (the OS's, as in the browser tests) logs in
as a support lead and photographs the approvals inbox and a finished run.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, sync_playwright

from agent_worker.api import AgentWorker
from agent_worker.demo import goodwill, refund_desk
from agent_worker.demo.vendor import start_vendor
from agent_worker.principal import Principal
from agent_worker.store.migrate import upgrade
from bench.common import ROOT, RedisDb, create_database, drop_database, sa_url
from tests.browser.chromium import launch
from tests.browser.server import ConsoleServer, User
from tests.support import Fleet, client_on, run_reaching, worker_environ

TENANT = "acme"
AGENTS = f"{refund_desk.__name__},{goodwill.__name__}"
VIEWPORT: ViewportSize = {"width": 1280, "height": 1000}
#: The run page is long: tall enough for the header, the actions, the budget and
#: the lap timeline (the messages and ledger below are paged anyway).
RUN_VIEWPORT: ViewportSize = {"width": 1280, "height": 1500}


def _runs(aw: AgentWorker) -> str:
    """Start the pictured runs; the finished refund run's id, once all are where
    the pictures need them."""
    desk = aw.acting_as(Principal("desk-app", TENANT, ("submitter",)))
    refunds = [desk.start_run(refund_desk.refund_desk.name, {"orders": n}).id for n in (3, 2)]
    credits = [desk.start_run(goodwill.goodwill_credit.name,
                              {"order_id": order, "incidents": incidents}).id
               for order, incidents in (("ord-042", 2), ("ord-117", 3))]
    for run_id in credits:
        run_reaching(desk, run_id, "waiting", timeout=180)
    for run_id in refunds:
        run_reaching(desk, run_id, "succeeded", timeout=180)
    return refunds[0]


def _photograph(page: Page, url: str, user: User, run_id: str, out: Path) -> list[Path]:
    page.goto(f"{url}/login?next=/approvals")
    page.get_by_label("User").fill(user.id)
    page.get_by_label("Password").fill(user.password)
    page.get_by_role("button", name="Log in").click()
    page.locator("#approvals-mine article").first.wait_for()
    inbox, run = out / "console-inbox.png", out / "console-run.png"
    page.screenshot(path=str(inbox), full_page=True)
    page.set_viewport_size(RUN_VIEWPORT)
    page.goto(f"{url}/runs/{run_id}")
    page.locator("#run-status[data-status='succeeded']").wait_for()
    page.screenshot(path=str(run))
    return [inbox, run]


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
                        run_id = _runs(aw)
                with sync_playwright() as playwright:
                    browser = launch(playwright)
                    page = browser.new_context(viewport=VIEWPORT).new_page()
                    written = _photograph(page, console.url, lead, run_id, opts.out)
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
