"""The console's least privilege: security headers on every response, ``Secure``
cookies over HTTPS and behind a trusted proxy only, placeholder secrets refused
at start, and failed logins throttled per user name and per address."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agent_worker.cli import main
from agent_worker.console.app import HERE, create_app
from agent_worker.console.security import HEADERS, check_console_secrets
from agent_worker.console.session import LOGIN_COOKIE, SESSION_COOKIE, Sessions
from agent_worker.console.throttle import LoginThrottle
from agent_worker.console.users import UserBook
from agent_worker.core.errors import PlaceholderSecretError
from agent_worker.core.settings import Settings, get_settings
from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import PASSWORD, csrf_of, started

#: What TestClient's requests return (an httpx response).
Answer = Any

GOOD_SECRET = "a-real-session-key-of-forty-two-characters"


def assert_secured(response: Answer, what: str) -> None:
    headers = response.headers
    for name, value in HEADERS.items():
        assert headers.get(name) == value, f"{what}: {name} is {headers.get(name)!r}"


def test_every_kind_of_response_carries_the_security_headers(
        worker: InProcessWorker, login: Callable[[str], TestClient],
        app_client: Callable[[], TestClient]) -> None:
    run_id = started(worker, "refunds")
    stranger = app_client()
    alice = login("alice")
    for what, response in [
        ("login page", stranger.get("/login")),
        ("redirect to the login", stranger.get("/runs")),
        ("redirect home", stranger.get("/")),
        ("healthz", stranger.get("/healthz")),
        ("script", stranger.get("/static/console.js")),
        ("style sheet", stranger.get("/static/console.css")),
        ("missing static file", stranger.get("/static/nope.js")),
        ("unknown route", stranger.get("/nope")),
        ("login refused (csrf)", stranger.post("/login", data={"username": "alice"})),
        ("runs page", alice.get("/runs")),
        ("run page", alice.get(f"/runs/{run_id}")),
        ("live fragment", alice.get(f"/runs/{run_id}/live")),
        ("error page", alice.get("/runs/no-such-run")),
        ("forged POST", alice.post("/approvals/x/decide", data={"csrf_token": "guess"})),
    ]:
        assert_secured(response, what)
    assert stranger.get("/static/console.js").headers["content-type"].startswith(
        ("text/javascript", "application/javascript"))


def test_a_server_error_carries_the_security_headers_too(
        worker: InProcessWorker, users: UserBook, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Sessions, request: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(Sessions, "visitor", boom)
    browser = TestClient(create_app(worker, users=users), raise_server_exceptions=False)
    crashed = browser.get("/runs")
    assert crashed.status_code == 500
    assert_secured(crashed, "500")


def test_the_pages_need_nothing_the_policy_forbids() -> None:
    """No inline script, style or event handler: ``script-src 'self'`` and
    ``style-src 'self'`` would block them (the browser tests see it happen)."""
    assert "frame-ancestors 'none'" in HEADERS["Content-Security-Policy"]
    for template in sorted((HERE / "templates").glob("*.html")):
        text = template.read_text()
        for pattern in (r"<script(?![^>]*\ssrc=)[^>]*>", r"<style", r"\sstyle=",
                        r"\son[a-z]+=", r"javascript:", r"https?://"):
            assert not re.search(pattern, text), f"{template.name}: {pattern}"


# --- Secure cookies ----------------------------------------------------------


def _console(worker: InProcessWorker, users: UserBook, **update: object) -> TestClient:
    settings = worker.rt.settings.model_copy(update=update)
    return TestClient(create_app(worker, users=users, settings=settings),
                      follow_redirects=False)


def _log_in(browser: TestClient, headers: dict[str, str] | None = None,
            user: str = "alice", password: str = PASSWORD) -> Answer:
    browser.cookies.pop(SESSION_COOKIE, None)  # log in anew, not as the last one
    form = browser.get("/login", headers=headers)
    return browser.post("/login", headers=headers, data={
        "username": user, "password": password, "csrf_token": csrf_of(form.text)})


def _cookie(response: Answer, name: str) -> str:
    cookies = response.headers.get_list("set-cookie")
    found = [c for c in cookies if c.startswith(name + "=")]
    assert found, f"no {name} cookie in {cookies}"
    return str(found[0]).lower()


HTTPS = {"X-Forwarded-Proto": "https"}


def test_behind_a_trusted_proxy_speaking_https_the_cookies_are_secure(
        worker: InProcessWorker, users: UserBook) -> None:
    # TestClient's requests come from the address "testclient".
    browser = _console(worker, users, console_trusted_proxies="10.9.9.9, testclient")
    form = browser.get("/login", headers=HTTPS)
    assert "; secure" in _cookie(form, LOGIN_COOKIE)
    # The browser speaks HTTPS to the proxy, so it sends the Secure cookie back
    # (TestClient's jar would not, over its plain http://testserver).
    token = csrf_of(form.text)
    done = browser.post("/login", headers={**HTTPS, "Cookie": f"{LOGIN_COOKIE}={token}"},
                        data={"username": "alice", "password": PASSWORD, "csrf_token": token})
    assert done.status_code == 303
    assert "; secure" in _cookie(done, SESSION_COOKIE)
    plain = _log_in(_console(worker, users, console_trusted_proxies="testclient"))
    assert "secure" not in _cookie(plain, SESSION_COOKIE)  # the proxy spoke plain HTTP


@pytest.mark.parametrize("trusted", ["", "10.9.9.9", "127.0.0.0/8"])
def test_forwarded_headers_of_anybody_else_are_ignored(
        worker: InProcessWorker, users: UserBook, trusted: str) -> None:
    browser = _console(worker, users, console_trusted_proxies=trusted)
    assert "secure" not in _cookie(browser.get("/login", headers=HTTPS), LOGIN_COOKIE)
    done = _log_in(browser, HTTPS)
    assert done.status_code == 303
    assert "secure" not in _cookie(done, SESSION_COOKIE)


# --- placeholder secrets --------------------------------------------------------


@pytest.mark.parametrize("secret", ["changeme", "CHANGE_ME", "  ", "secret",
                                    "CHANGE_ME_to_something_long_and_random",
                                    "short-but-not-a-placeholder"])
def test_a_placeholder_or_short_session_key_is_refused(
        worker: InProcessWorker, users: UserBook, secret: str) -> None:
    settings = worker.rt.settings.model_copy(update={"console_secret": secret})
    with pytest.raises(PlaceholderSecretError, match="AGENT_WORKER_CONSOLE_SECRET"):
        create_app(worker, users=users, settings=settings)


def test_a_real_or_empty_session_key_is_accepted(worker: InProcessWorker) -> None:
    for secret in ("", GOOD_SECRET):
        check_console_secrets(worker.rt.settings.model_copy(update={"console_secret": secret}))


@pytest.mark.parametrize("field, value", [
    ("database_url", "postgresql+psycopg://agent_worker:CHANGE_ME@127.0.0.1:1/agent_worker"),
    ("broker_url", "redis://agent-worker:changeme@127.0.0.1:1/0"),
])
def test_a_placeholder_password_is_refused_before_connecting(field: str, value: str) -> None:
    settings = Settings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(PlaceholderSecretError, match=field.upper()):
        create_app(settings=settings)


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.parametrize("variable, value", [
    ("AGENT_WORKER_CONSOLE_SECRET", "changeme"),
    ("AGENT_WORKER_CONSOLE_SECRET", "CHANGE_ME"),
    ("AGENT_WORKER_CONSOLE_SECRET", "tooshort"),
    ("AGENT_WORKER_DATABASE_URL",
     "postgresql+psycopg://agent_worker:CHANGE_ME@127.0.0.1:1/agent_worker"),
])
def test_the_console_command_refuses_to_start_with_a_placeholder(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        fresh_settings: None, tmp_path: Path, variable: str, value: str) -> None:
    served: list[object] = []
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: served.append(a))
    monkeypatch.setenv("AGENT_WORKER_DATABASE_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv(variable, value)
    assert main(["console", "--port", "1"]) != 0
    out = capsys.readouterr()
    assert "placeholder" in out.err.lower() or "characters" in out.err
    assert variable in out.err and "serving" not in out.out
    assert served == []


# --- login throttling -----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _throttled(worker: InProcessWorker, users: UserBook, clock: Clock, *, per_user: int = 3,
               per_address: int = 100, trusted: str = "") -> TestClient:
    settings = worker.rt.settings.model_copy(update={"console_trusted_proxies": trusted})
    throttle = LoginThrottle(per_user=per_user, per_address=per_address, window_seconds=60,
                             clock=clock)
    return TestClient(create_app(worker, users=users, settings=settings, throttle=throttle),
                      follow_redirects=False)


def _status(response: Answer) -> int:
    return int(response.status_code)


def test_failed_logins_to_one_user_are_throttled_until_the_window_passes(
        worker: InProcessWorker, users: UserBook) -> None:
    clock = Clock()
    browser = _throttled(worker, users, clock)
    for _ in range(3):
        assert _status(_log_in(browser, password="wrong")) == 401
    refused = _log_in(browser)  # the right password, but too late
    assert _status(refused) == 429 and refused.headers["retry-after"] == "60"
    assert 'id="login-error"' in refused.text
    assert_secured(refused, "429")
    assert _status(_log_in(browser, user="bob")) == 303  # other users are not affected
    clock.now += 45.5
    assert _log_in(browser).headers["retry-after"] == "15"
    clock.now += 14.5
    assert _status(_log_in(browser)) == 303


def test_a_successful_login_resets_the_users_count(
        worker: InProcessWorker, users: UserBook) -> None:
    browser = _throttled(worker, users, Clock())
    for _ in range(2):
        assert _status(_log_in(browser, password="wrong")) == 401
    assert _status(_log_in(browser)) == 303
    for _ in range(3):  # a fresh count: three more before the refusal
        assert _status(_log_in(browser, password="wrong")) == 401
    assert _status(_log_in(browser)) == 429


def test_failed_logins_from_one_address_are_throttled_whoever_they_name(
        worker: InProcessWorker, users: UserBook) -> None:
    clock = Clock()
    browser = _throttled(worker, users, clock, per_user=100, per_address=4,
                         trusted="testclient")
    mallory = {"X-Forwarded-For": "203.0.113.7"}
    for name in ("alice", "bob", "olga", "nobody"):
        assert _status(_log_in(browser, mallory, user=name, password="wrong")) == 401
    refused = _log_in(browser, mallory, user="root")
    assert _status(refused) == 429 and refused.headers["retry-after"] == "60"
    # Another address (as the trusted proxy says) logs in; its success does not
    # clear the guesser's address.
    assert _status(_log_in(browser, {"X-Forwarded-For": "198.51.100.2"})) == 303
    assert _status(_log_in(browser, mallory, user="eve")) == 429
    clock.now += 60
    assert _status(_log_in(browser, mallory, user="eve")) == 303


def test_an_untrusted_client_cannot_dodge_the_count_with_a_forwarded_header(
        worker: InProcessWorker, users: UserBook) -> None:
    browser = _throttled(worker, users, Clock(), per_user=100, per_address=2)
    for n in range(2):
        assert _status(_log_in(browser, {"X-Forwarded-For": f"192.0.2.{n}"},
                               password="wrong")) == 401
    assert _status(_log_in(browser, {"X-Forwarded-For": "192.0.2.99"})) == 429


def test_the_limits_come_from_the_settings(worker: InProcessWorker, users: UserBook) -> None:
    defaults = Settings()
    assert (defaults.console_login_user_failures, defaults.console_login_address_failures,
            defaults.console_login_window_seconds) == (5, 20, 300.0)
    assert defaults.console_trusted_proxies == ""
    browser = _console(worker, users, console_login_user_failures=1)
    assert _status(_log_in(browser, password="wrong")) == 401
    refused = _log_in(browser)
    assert _status(refused) == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 300


def test_the_throttles_memory_is_bounded() -> None:
    clock = Clock()
    throttle = LoginThrottle(per_user=2, per_address=2, window_seconds=60, clock=clock,
                             max_keys=10)
    for n in range(50):
        throttle.failed(f"user-{n}" + "x" * 1000, f"addr-{n}")
    assert len(throttle._users.failures) <= 10 and len(throttle._addresses.failures) <= 10
    assert all(len(k) <= 256 for k in throttle._users.failures)
    throttle.failed("user-49" + "x" * 1000, "addr-49")
    assert throttle.retry_after("user-49" + "x" * 1000, "elsewhere") == 60
    clock.now += 61
    throttle.failed("late", "late")
    assert throttle.retry_after("user-49" + "x" * 1000, "addr-49") == 0
