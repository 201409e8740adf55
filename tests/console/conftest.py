"""Console tests: the app over an in-process worker on SQLite (fast; the API's
tenant scoping is the same code on both dialects), driven by Starlette's
TestClient, logged in as configured users."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from agent_worker.console.app import create_app
from agent_worker.console.users import UserBook, hash_password
from agent_worker.inprocess import InProcessWorker
from tests.console.agents import registry
from tests.principals import acting

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="session")
def password_hash() -> str:
    # A cheap cost for speed: the default's (slow on purpose) is test_auth's business.
    return hash_password(PASSWORD, n=2**8)


@pytest.fixture(scope="session")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file each test copies (migrating costs a second a test)."""
    path = tmp_path_factory.mktemp("console") / "template.db"
    InProcessWorker(f"sqlite:///{path}").close()
    return path


@pytest.fixture(scope="session")
def users(password_hash: str) -> UserBook:
    """alice approves in acme, bob only reads in acme, olga operates acme,
    eve approves and gus operates in another tenant, root is an admin across
    tenants."""
    def user(uid: str, tenant: str, *roles: str) -> dict[str, object]:
        return {"id": uid, "tenant": tenant, "roles": list(roles),
                "password_hash": password_hash}
    return UserBook.parse(json.dumps([
        user("alice", "acme", "approver"), user("bob", "acme", "submitter"),
        user("olga", "acme", "operator"), user("eve", "globex", "approver"),
        user("gus", "globex", "operator"), user("root", "*", "admin")]))


@pytest.fixture
def worker(tmp_path: Path, migrated: Path) -> Iterator[InProcessWorker]:
    shutil.copy(migrated, tmp_path / "console.db")
    w = InProcessWorker(f"sqlite:///{tmp_path / 'console.db'}", retry_backoff_seconds=0,
                        max_lap_attempts=2, console_flower_url="http://flower.test")
    w.rt.registry = registry()
    yield w
    w.close()


@pytest.fixture
def app_client(worker: InProcessWorker, users: UserBook) -> Callable[[], TestClient]:
    """A new browser (its own cookie jar) on the console."""
    app = create_app(worker, users=users)
    return lambda: TestClient(app, follow_redirects=False)


def started(worker: InProcessWorker, agent: str, tenant: str = "acme",
            labels: dict[str, str] | None = None) -> str:
    """A run of ``agent`` in ``tenant``, moved as far as it goes; its id."""
    run = acting(worker, "app", "submitter", tenant=tenant).start_run(agent, "go",
                                                                     labels=labels)
    worker.run_until_idle()
    return run.id


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


@pytest.fixture
def login(app_client: Callable[[], TestClient]) -> Callable[[str], TestClient]:
    """A browser logged in as ``user``."""
    def as_user(user: str) -> TestClient:
        browser = app_client()
        form = browser.get("/login")
        done = browser.post("/login", data={"username": user, "password": PASSWORD,
                                            "csrf_token": csrf_of(form.text), "next": "/runs"})
        assert done.status_code == 303, done.text
        return browser
    return as_user
