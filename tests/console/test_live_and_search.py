"""The runs page's search, sort and columns, and the console's live stream
(``/stream``, ``/stream/state``): behind the login, acting as the visitor,
so another tenant's runs and approvals never appear in it."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable

import anyio
import pytest
from starlette.testclient import TestClient

from agent_worker.console.app import create_app
from agent_worker.console.stream import Gate
from agent_worker.console.users import UserBook
from agent_worker.inprocess import InProcessWorker
from tests.console.agents import REFUSAL
from tests.console.conftest import PASSWORD, csrf_of, started


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr data-run-id="([^"]+)"', html)


def test_the_search_box_finds_runs_by_id_label_agent_and_error(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    waiting = started(worker, "refunds", labels={"customer": "c-9"})
    failed = started(worker, "console-fails")
    theirs = started(worker, "refunds", tenant="globex", labels={"customer": "c-9"})
    alice = login("alice")
    assert _rows(alice.get("/runs", params={"q": "customer=c-9"}).text) == [waiting]
    assert _rows(alice.get("/runs", params={"q": "c-9"}).text) == [waiting]  # a label's value
    assert _rows(alice.get("/runs", params={"q": waiting[:8]}).text) == [waiting]
    assert _rows(alice.get("/runs", params={"q": "console-fails"}).text) == [failed]
    assert _rows(alice.get("/runs", params={"q": REFUSAL.split(":")[1].upper()}).text) == [
        failed]
    assert _rows(alice.get("/runs", params={"q": theirs}).text) == []
    # Hostile input: shown as text, matching nothing, or refused clearly; never a 500.
    for term in ("%", "_", "\\", "%_\\", "\x00", "<script>x</script>", "a=b=c"):
        answer = alice.get("/runs", params={"q": term})
        assert answer.status_code == 200, (term, answer.text[:300])
        assert _rows(answer.text) == [], term
    # A lone surrogate cannot be sent as UTF-8: its bytes, as a browser would.
    for raw in ("%ED%A0%80", "%F0%9F", "%FF"):
        answer = alice.get(f"/runs?q={raw}")
        assert answer.status_code == 200 and _rows(answer.text) == [], raw
    assert "<script>x</script>" not in alice.get("/runs", params={"q": "<script>x</script>"}).text
    too_long = alice.get("/runs", params={"q": "x" * 201})
    assert too_long.status_code == 400 and "limit is 200" in too_long.text
    assert alice.get("/runs", params={"q": "bad key=v"}).status_code == 200  # text, not a label
    stale = alice.get("/runs", params={"q": "refunds", "stale": "1"})
    assert stale.status_code == 200 and _rows(stale.text) == []  # nothing is moving


def test_sorts_columns_and_the_link_to_a_waiting_runs_approval(
        worker: InProcessWorker, users: UserBook) -> None:
    small = worker.rt.settings.model_copy(update={"console_page_size": 2})
    browser = TestClient(create_app(worker, users=users, settings=small),
                         follow_redirects=False)
    browser.post("/login", data={"username": "alice", "password": PASSWORD,
                                 "csrf_token": csrf_of(browser.get("/login").text)})
    made = [started(worker, "refunds", labels={"n": str(n)}) for n in range(3)]
    newest = browser.get("/runs").text
    assert _rows(newest) == made[::-1][:2]
    oldest = browser.get("/runs", params={"sort": "oldest"}).text
    assert _rows(oldest) == made[:2]  # the store's order, not the page's
    following = re.search(r'id="next-page" href="([^"]+)"', oldest)
    assert following is not None
    second = browser.get(following.group(1).replace("&amp;", "&")).text
    assert _rows(second) == made[2:]
    # The live stream follows the page shown (its cursor included), not the first.
    live = re.search(r'id="runs-live" data-list="([^"]+)" data-digest="(\w+)"', second)
    assert live is not None and "cursor=" in live.group(1)
    state = browser.get("/stream/state", params={"list": live.group(1).replace("&amp;", "&")})
    assert state.json()["runs"]["digest"] == live.group(2)
    (approval,) = worker.list_approvals(status="pending", run_id=made[0])
    assert f'href="/approvals#approval-{approval.id}"' in oldest
    assert re.search(r'class="duration" data-seconds="[\d.]+">\d+s<', oldest)
    assert 'data-label="n">n=0<' in oldest
    assert 'id="runs-live" data-list="sort=oldest" data-digest="' in oldest
    assert 'id="approvals-badge"' in oldest and 'data-stream="/stream"' in oldest


def test_the_stream_needs_a_login_and_another_tenants_run_is_not_found(
        worker: InProcessWorker, app_client: Callable[[], TestClient],
        login: Callable[[str], TestClient]) -> None:
    theirs = started(worker, "refunds", tenant="globex")
    nobody = app_client()
    for path in ("/stream", "/stream/state", f"/stream?run={theirs}"):
        assert nobody.get(path).status_code == 401, path
    alice = login("alice")
    answer = alice.get("/stream", params={"run": theirs})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_run"
    assert alice.get("/stream", params={"run": "no-such-run"}).status_code == 404
    assert alice.get("/stream", params={"run": theirs, "after": "-1"}).status_code == 400
    for path in ("/stream/state", "/stream"):  # a bad list is refused before any stream
        for bad in ("status=bogus", "cursor=forged", "q=" + "x" * 201):
            assert alice.get(path, params={"list": bad}).status_code == 400, (path, bad)


def test_the_state_counts_only_the_visitors_approvals(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    mine = started(worker, "refunds")  # waits for an approver of acme
    started(worker, "refunds", tenant="globex")
    started(worker, "refunds", tenant="globex")
    alice = login("alice").get("/stream/state").json()
    assert (alice["approvals"]["mine"], alice["approvals"]["others"]) == (1, 0)
    bob = login("bob").get("/stream/state").json()  # same tenant, may not approve
    assert (bob["approvals"]["mine"], bob["approvals"]["others"]) == (0, 1)
    eve = login("eve").get("/stream/state").json()
    assert eve["approvals"]["mine"] == 2
    assert eve["approvals"]["digest"] != alice["approvals"]["digest"]
    listed = login("alice").get("/stream/state", params={"list": "q=refunds"}).json()
    page = login("alice").get("/runs", params={"q": "refunds"}).text
    assert f'data-digest="{listed["runs"]["digest"]}"' in page  # what the page compares
    assert mine in page


def test_a_finished_runs_stream_sends_its_events_then_end(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    failed = started(worker, "console-fails")
    alice = login("alice")
    body = alice.get("/stream", params={"run": failed, "after": "0"}).text
    kinds = re.findall(r"event: (\w+)\ndata: \{\"kind\":\"(\w+)\"", body)
    assert ("run", "lap_committed") in kinds and kinds[-1] == ("end", "end")
    ids = [int(i) for i in re.findall(r"^id: (\d+)$", body, re.M)]
    assert ids == sorted(ids) and len(set(ids[:-1])) == len(ids) - 1
    # Resumed after its last id: only the end again; and from now (no id): the end.
    resumed = alice.get("/stream", params={"run": failed},
                        headers={"Last-Event-ID": str(ids[-2])}).text
    assert re.findall(r"event: (\w+)", resumed) == ["end"]
    assert re.findall(r"event: (\w+)", alice.get("/stream", params={"run": failed}).text) == [
        "end"]


def test_the_overview_stream_sends_the_state_at_once(
        worker: InProcessWorker, users: UserBook) -> None:
    quick = worker.rt.settings.model_copy(update={"console_poll_seconds": 0.05})
    app = create_app(worker, users=users, settings=quick, stream_seconds=0.2)
    browser = TestClient(app, follow_redirects=False)
    browser.post("/login", data={"username": "alice", "password": PASSWORD,
                                 "csrf_token": csrf_of(browser.get("/login").text)})
    started(worker, "refunds")
    answer = browser.get("/stream", params={"list": ""})
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["x-accel-buffering"] == "no"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    events = re.findall(r"event: (\w+)\ndata: (.*)\n", answer.text)
    assert [k for k, _ in events] == ["approvals", "runs"]  # once: nothing changed after
    assert '"mine":1' in events[0][1]


def test_streams_per_session_are_capped(worker: InProcessWorker, users: UserBook) -> None:
    gate = Gate(per_session=1, run_streams=1)
    assert gate.take("s", run=False) is None
    refused = gate.take("s", run=False)
    assert refused is not None and refused.status_code == 429
    assert gate.take("t", run=True) is None
    refused = gate.take("u", run=True)
    assert refused is not None and refused.status_code == 503
    gate.release("s", run=False)
    gate.release("t", run=True)
    assert gate.take("s", run=False) is None and gate.take("u", run=True) is None

    app = create_app(worker, users=users, streams=Gate(per_session=0))
    browser = TestClient(app, follow_redirects=False)
    browser.post("/login", data={"username": "alice", "password": PASSWORD,
                                 "csrf_token": csrf_of(browser.get("/login").text)})
    assert browser.get("/stream").status_code == 429


@pytest.mark.parametrize("path", ["/stream", "/stream/state"])
def test_a_logged_out_session_gets_no_stream(path: str,
                                             login: Callable[[str], TestClient]) -> None:
    alice = login("alice")
    token = csrf_of(alice.get("/runs").text)
    cookie = alice.cookies.get("aw_console")
    assert alice.post("/logout", data={"csrf_token": token}).status_code == 303
    alice.cookies.set("aw_console", cookie or "")
    assert alice.get(path).status_code == 401


def test_a_streams_slot_comes_back_when_it_ends_or_never_starts(
        worker: InProcessWorker, users: UserBook) -> None:
    failed = started(worker, "console-fails")
    gate = Gate(per_session=1, run_streams=1)
    app = create_app(worker, users=users, streams=gate)
    browser = TestClient(app, follow_redirects=False)
    browser.post("/login", data={"username": "alice", "password": PASSWORD,
                                 "csrf_token": csrf_of(browser.get("/login").text)})
    for _ in range(3):  # each ends (the run has ended), freeing its slot
        assert browser.get("/stream", params={"run": failed}).status_code == 200

    # A client gone before the first byte: the body never starts, the slot comes back.
    cookie = f"aw_console={browser.cookies.get('aw_console')}".encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/stream", "raw_path": b"/stream",
             "root_path": "", "query_string": f"run={failed}".encode(),
             "headers": [(b"host", b"testserver"), (b"cookie", cookie)],
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def gone(message: dict[str, object]) -> None:
        raise OSError("the client left")

    async def call() -> None:
        with pytest.raises(OSError):
            await app(scope, receive, gone)  # type: ignore[arg-type]

    anyio.run(call)
    gc.collect()
    assert gate.take("someone", run=True) is None  # the run slot is free again
