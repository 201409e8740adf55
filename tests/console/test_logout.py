"""Logging out revokes the session server-side: a copy of the cookie taken
before the logout (a stolen one) is refused after it, on every console
process; the same user's other sessions stay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from starlette.testclient import TestClient

from agent_worker.api import AgentWorker
from agent_worker.console.app import create_app, revocations_for
from agent_worker.console.revocation import PREFIX, RedisRevocations
from agent_worker.console.session import SESSION_COOKIE
from agent_worker.console.users import UserBook
from agent_worker.core.errors import ConfigurationError
from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import PASSWORD, csrf_of


def copy_of(browser: TestClient, app_client: Callable[[], TestClient]) -> TestClient:
    """Another browser holding ``browser``'s session cookie (a thief's)."""
    thief = app_client()
    thief.cookies.set(SESSION_COOKIE, browser.cookies[SESSION_COOKIE])
    return thief


def log_out(browser: TestClient) -> None:
    page = browser.get("/runs")
    assert page.status_code == 200
    assert browser.post("/logout", data={"csrf_token": csrf_of(page.text)}).status_code == 303


def test_a_cookie_copied_before_logout_is_refused_after_it(
        login: Callable[[str], TestClient], app_client: Callable[[], TestClient]) -> None:
    alice = login("alice")
    other_device = login("alice")  # her second session: its own login, its own nonce
    thief = copy_of(alice, app_client)
    page = thief.get("/runs")
    assert page.status_code == 200
    log_out(alice)
    assert thief.get("/runs").headers["location"] == "/login?next=/runs"
    refused = thief.post("/approvals/x/decide", data={"csrf_token": csrf_of(page.text),
                                                      "decision": "approve"})
    assert refused.status_code == 403 and 'data-code="console_auth"' in refused.text
    assert other_device.get("/runs").status_code == 200  # only that session ended
    again = login("alice")  # and she can log in again
    assert again.get("/runs").status_code == 200


#: The fleet's session key (every replica's): 32 characters at least.
FLEET_SECRET = "fleet-wide-session-key-0123456789abcdef"


def _replica(worker: InProcessWorker, users: UserBook, broker_url: str) -> TestClient:
    """A console process of a fleet: its own Redis connection, the fleet's secret."""
    settings = worker.rt.settings.model_copy(update={"console_secret": FLEET_SECRET})
    app = create_app(worker, users=users, settings=settings,
                     revocations=RedisRevocations(broker_url))
    return TestClient(app, follow_redirects=False)


def test_a_logout_on_one_replica_is_seen_by_the_others(
        worker: InProcessWorker, users: UserBook, broker_url: str) -> None:
    one, other = _replica(worker, users, broker_url), _replica(worker, users, broker_url)
    form = one.get("/login")
    assert one.post("/login", data={"username": "olga", "password": PASSWORD,
                                    "csrf_token": csrf_of(form.text)}).status_code == 303
    other.cookies.set(SESSION_COOKIE, one.cookies[SESSION_COOKIE])
    assert other.get("/runs").status_code == 200  # the load balancer sent it elsewhere
    log_out(one)
    assert other.get("/runs").status_code == 303
    # The revocation expires with the session, so the list cleans itself.
    r = redis.Redis.from_url(broker_url)
    ttls = [r.ttl(k) for k in r.scan_iter(PREFIX + "*")]
    r.close()
    session_seconds = worker.rt.settings.console_session_hours * 3600
    assert ttls and all(0 < t <= session_seconds for t in ttls)


def test_an_unreachable_revocation_store_refuses_the_session(
        worker: InProcessWorker, users: UserBook) -> None:
    """Fail closed: a session that cannot be checked is not trusted (a login
    needs no check; the first page after it does)."""
    down = TestClient(create_app(worker, users=users,
                                 revocations=RedisRevocations("redis://127.0.0.1:1/0")),
                      follow_redirects=False)
    form = down.get("/login")
    assert down.post("/login", data={"username": "alice", "password": PASSWORD,
                                     "csrf_token": csrf_of(form.text)}).status_code == 303
    page = down.get("/runs")
    assert page.status_code == 403 and 'data-code="session_unchecked"' in page.text
    assert "cannot check whether this session was logged out" in page.text


def test_the_fleet_console_remembers_logouts_in_the_brokers_redis(
        worker: InProcessWorker) -> None:
    """An in-process worker is one process: memory. A handle on a fleet: the
    broker's Redis, and a broker that is not Redis is refused at start."""
    settings = worker.rt.settings
    assert not isinstance(revocations_for(worker, settings), RedisRevocations)
    fleet = AgentWorker(worker.rt)  # a plain handle, as ``client()`` builds one
    assert isinstance(revocations_for(fleet, settings), RedisRevocations)
    with pytest.raises(ConfigurationError, match="not Redis"):
        revocations_for(fleet, settings.model_copy(
            update={"broker_url": "amqp://guest@localhost//"}))
