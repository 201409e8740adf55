"""``agent-worker console`` as deployed, over real HTTP: the security headers
on the wire, and ``AGENT_WORKER_CONSOLE_TRUSTED_PROXIES`` deciding whose
``X-Forwarded-Proto`` makes the cookies ``Secure`` (uvicorn's own proxy
handling, which would trust 127.0.0.1 by itself, is off)."""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest

from agent_worker.console.security import HEADERS
from tests.browser.server import ConsoleServer, User
from tests.support import worker_environ

pytestmark = [pytest.mark.integration]

ANN = User("ann", "served", ("approver",), secrets.token_urlsafe(12))


def _serve(database_url: str, broker_url: str, tmp_path: Path, trusted: str
           ) -> Iterator[ConsoleServer]:
    env = worker_environ(database_url, broker_url, tmp_path / "faults")
    env.update(AGENT_WORKER_CONSOLE_SECRET=secrets.token_urlsafe(32),
               AGENT_WORKER_CONSOLE_TRUSTED_PROXIES=trusted)
    server = ConsoleServer(env, tmp_path / "console.log", [ANN]).start()
    yield server
    server.stop()


@pytest.fixture
def behind_proxy(database_url: str, broker_url: str, tmp_path: Path
                 ) -> Iterator[ConsoleServer]:
    yield from _serve(database_url, broker_url, tmp_path, "127.0.0.1")


@pytest.fixture
def trusting_nobody(database_url: str, broker_url: str, tmp_path: Path
                    ) -> Iterator[ConsoleServer]:
    yield from _serve(database_url, broker_url, tmp_path, "")


def _get(url: str, headers: dict[str, str]) -> tuple[int, Message]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def _login_cookie(headers: Message) -> str:
    found = [c for c in headers.get_all("Set-Cookie") or [] if c.startswith("aw_console_login=")]
    assert found, headers
    return found[0].lower()


def test_served_console_sends_headers_and_believes_its_proxy(
        behind_proxy: ConsoleServer) -> None:
    for path in ("/healthz", "/login", "/runs", "/static/console.js", "/nope"):
        status, headers = _get(behind_proxy.url + path, {})
        assert status in (200, 404), (path, status)  # urllib follows /runs to /login
        for name, value in HEADERS.items():
            assert headers.get(name) == value, (path, name)
    _, plain = _get(behind_proxy.url + "/login", {})
    assert "secure" not in _login_cookie(plain)
    _, proxied = _get(behind_proxy.url + "/login", {"X-Forwarded-Proto": "https"})
    assert "; secure" in _login_cookie(proxied)


def test_served_console_ignores_forwarded_headers_by_default(
        trusting_nobody: ConsoleServer) -> None:
    _, proxied = _get(trusting_nobody.url + "/login", {"X-Forwarded-Proto": "https"})
    assert "secure" not in _login_cookie(proxied)
