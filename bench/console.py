"""Server time of the run console's pages on a long run:
a ``loop`` run of ``--laps`` laps (500 by default: 1,001 messages, 501 events)
committed by the in-process engine on its own Postgres database, then each
page requested ``--times`` times through the ASGI app in this process
(Starlette's TestClient: no network, so the figure is the server's work:
the API's reads, shaping, templates, plus Postgres's time to answer), logged
in as an admin; the tables are ANALYZEd first, as autovacuum would.

    python -m bench.console --laps 500 --times 20

Goal: the run page under 200 ms. Prints one JSON document with the load
average before and after, since the shared machine is rarely quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from starlette.testclient import TestClient

import tests.agents  # noqa: F401  (registers the "loop" agent)
from agent_worker.console.app import create_app
from agent_worker.console.users import UserBook, hash_password
from agent_worker.inprocess import InProcessWorker
from bench.common import create_database, drop_database, libpq_url, repeat_ms, sa_url

PASSWORD = "bench-password"


def logged_in(worker: InProcessWorker) -> TestClient:
    users = UserBook.parse(json.dumps([{"id": "bench", "tenant": "*", "roles": ["admin"],
                                        "password_hash": hash_password(PASSWORD)}]))
    browser = TestClient(create_app(worker, users=users), follow_redirects=False)
    form = browser.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert token is not None
    done = browser.post("/login", data={"username": "bench", "password": PASSWORD,
                                        "csrf_token": token.group(1)})
    assert done.status_code == 303, done.text
    return browser


def measure(browser: TestClient, path: str, times: int) -> dict[str, float]:
    """Wall milliseconds per request, and the CPU milliseconds this process
    (the server; the test client's share is small) spent per request: the
    CPU figure moves far less with the machine's load than the wall one."""
    def get() -> None:
        response = browser.get(path)
        assert response.status_code == 200, (path, response.status_code)

    get()  # warm: templates compiled, connections open
    cpu = time.process_time()
    wall = repeat_ms(get, times)
    return {**wall, "cpu_ms": (time.process_time() - cpu) * 1e3 / times}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--laps", type=int, default=500)
    p.add_argument("--times", type=int, default=20)
    args = p.parse_args()
    name = f"aw_bench_console_{uuid.uuid4().hex[:6]}"
    url = sa_url(create_database(name))
    load_before = os.getloadavg()
    try:
        worker = InProcessWorker(url)
        try:
            t0 = time.perf_counter()
            run = worker.start_run("loop", {"laps": args.laps})
            worker.run_until_idle()
            built_s = time.perf_counter() - t0
            done = worker.get_run(run.id)
            assert done.status == "succeeded" and done.lap == args.laps, done.status
            # Fresh tables: give the planner the statistics autovacuum would have.
            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                conn.execute("ANALYZE")
            browser = logged_in(worker)
            pages: dict[str, Callable[[], dict[str, float]]] = {
                "run page": lambda: measure(browser, f"/runs/{run.id}", args.times),
                "run page, oldest laps": lambda: measure(
                    browser, f"/runs/{run.id}?laps=10&messages=20&events=10", args.times),
                "live fragment": lambda: measure(browser, f"/runs/{run.id}/live",
                                                 args.times),
                "runs list": lambda: measure(browser, "/runs", args.times),
            }
            result: dict[str, Any] = {
                "laps": args.laps, "messages": len(worker.messages(run.id)),
                "events": len(worker.events(run.id)), "build_seconds": round(built_s, 1),
                "ms": {k: {s: round(v, 1) for s, v in fn().items()}
                       for k, fn in pages.items()}}
        finally:
            worker.close()
    finally:
        drop_database(name)
    result["load_before"] = [round(x, 1) for x in load_before]
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
