"""Login, sessions, CSRF and the proxy header of the console."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest
from starlette.testclient import TestClient

from agent_worker.cli import main
from agent_worker.console.app import create_app
from agent_worker.console.auth import safe_next
from agent_worker.console.session import SESSION_COOKIE
from agent_worker.console.users import UserBook, check_password, hash_password
from agent_worker.core.errors import ConfigurationError
from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import PASSWORD, csrf_of


def test_login_page_has_labelled_fields_and_a_wrong_password_is_refused(
        app_client: Callable[[], TestClient]) -> None:
    browser = app_client()
    page = browser.get("/login")
    assert page.status_code == 200
    for field in ("username", "password"):
        assert f'<label for="{field}">' in page.text and f'id="{field}"' in page.text
    for user, password in (("alice", "wrong"), ("nobody", PASSWORD)):
        refused = browser.post("/login", data={"username": user, "password": password,
                                               "csrf_token": csrf_of(page.text)})
        assert refused.status_code == 401 and 'id="login-error"' in refused.text
        assert SESSION_COOKIE not in refused.cookies
    assert browser.get("/runs").status_code == 303


def test_session_cookie_is_httponly_lax_and_logout_needs_the_token(
        app_client: Callable[[], TestClient]) -> None:
    browser = app_client()
    form = browser.get("/login?next=/approvals")
    done = browser.post("/login", data={"username": "alice", "password": PASSWORD,
                                        "csrf_token": csrf_of(form.text),
                                        "next": "/approvals"})
    assert done.status_code == 303 and done.headers["location"] == "/approvals"
    cookie = done.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=lax" in cookie.lower()
    assert "secure" not in cookie.lower()  # plain HTTP here; over HTTPS it is Secure
    page = browser.get("/runs")
    assert page.status_code == 200 and 'id="whoami"' in page.text
    forged = browser.post("/logout", data={"csrf_token": "guess"})
    assert forged.status_code == 403 and browser.get("/runs").status_code == 200
    out = browser.post("/logout", data={"csrf_token": csrf_of(page.text)})
    assert out.status_code == 303
    assert browser.get("/runs").headers["location"] == "/login?next=/runs"


def test_login_without_its_csrf_token_and_a_forged_cookie_are_refused(
        app_client: Callable[[], TestClient]) -> None:
    browser = app_client()
    browser.get("/login")
    assert browser.post("/login", data={"username": "alice", "password": PASSWORD}
                        ).status_code == 403
    stranger = app_client()
    stranger.cookies.set(SESSION_COOKIE, "eyJ1IjoiYWxpY2UifQ.forged.sig")
    assert stranger.get("/runs").status_code == 303
    assert stranger.post("/approvals/x/decide", data={"decision": "approve"}
                         ).status_code == 403


def test_next_never_leaves_the_console() -> None:
    assert safe_next("/runs/abc?x=1") == "/runs/abc?x=1"
    for bad in ("https://evil.test/", "//evil.test", "/\\evil.test", None, ""):
        assert safe_next(bad) == "/runs"


def test_proxy_header_only_when_configured(worker: InProcessWorker, users: UserBook) -> None:
    off = TestClient(create_app(worker, users=users), follow_redirects=False)
    assert off.get("/runs", headers={"X-Remote-User": "alice"}).status_code == 303
    on = TestClient(create_app(worker, users=users, settings=worker.rt.settings.model_copy(
        update={"console_proxy_header": "X-Remote-User"})), follow_redirects=False)
    page = on.get("/runs", headers={"X-Remote-User": "alice"})
    assert page.status_code == 200 and "alice · tenant acme" in page.text
    assert 'id="logout-form"' not in page.text  # the proxy owns the session
    assert on.get("/runs", headers={"X-Remote-User": "mallory"}).status_code == 303


def test_password_hashes_and_user_configuration(tmp_path: object) -> None:
    stored = hash_password("s3cret")
    assert stored.startswith("scrypt$") and "s3cret" not in stored
    assert check_password("s3cret", stored) and not check_password("s3creT", stored)
    assert not check_password("s3cret", "md5$x")
    with pytest.raises(ConfigurationError):
        UserBook.parse(json.dumps([{"id": "x", "tenant": "*", "roles": ["approver"]}]))
    with pytest.raises(ConfigurationError):
        UserBook.parse(json.dumps([{"id": "x", "tenant": "t", "password_hash": "plain"}]))
    assert UserBook.parse("").users == {}


def test_hash_password_command(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hunter22\n"))
    assert main(["console", "hash-password", "--stdin"]) == 0
    printed = capsys.readouterr().out.strip()
    assert check_password("hunter22", printed)


def test_over_https_the_session_cookie_is_secure(worker: InProcessWorker,
                                                 users: UserBook) -> None:
    browser = TestClient(create_app(worker, users=users), base_url="https://console.test",
                         follow_redirects=False)
    form = browser.get("/login")
    done = browser.post("/login", data={"username": "alice", "password": PASSWORD,
                                        "csrf_token": csrf_of(form.text)})
    assert done.status_code == 303 and "secure" in done.headers["set-cookie"].lower()
