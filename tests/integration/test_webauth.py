"""The web endpoints' principal (``agent_worker.webauth``) on
Postgres: the SSE app refuses a request without credentials it accepts (401),
acts as the principal of a bearer token or of a trusted proxy's headers (only
when one is configured), and so answers a run of another tenant with the same
404 as a run nobody has."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

import tests.agents  # noqa: F401  (registers "loop")
from agent_worker.core.errors import ConfigurationError
from agent_worker.core.principal import Principal
from agent_worker.core.settings import Settings
from agent_worker.inprocess import InProcessWorker
from agent_worker.sse import create_app
from agent_worker.webauth import ProxyHeaders, WebAuth, parse_tokens, token_digest

pytestmark = pytest.mark.integration

ACME = Principal("acme:dash", "acme", {"submitter"})
GLOBEX = Principal("globex:dash", "globex", {"submitter"})
TOKENS = {token_digest("acme-t0ken"): ACME, token_digest("globex-t0ken"): GLOBEX}


@pytest.fixture(scope="module")
def site(database_url: str) -> Iterator[tuple[InProcessWorker, str]]:
    """An in-process worker on the session's Postgres, and a finished acme run
    (its stream ends at once)."""
    w = InProcessWorker(database_url)
    try:
        run = w.acting_as(ACME).start_run("loop", {"laps": 1},
                                          run_id=f"web-{uuid.uuid4().hex[:8]}")
        w.run_until_idle()
        yield w, run.id
    finally:
        w.close()


def http(worker: InProcessWorker, proxy: ProxyHeaders | None = None) -> TestClient:
    return TestClient(create_app(worker, auth=WebAuth(tokens=TOKENS, proxy=proxy)))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_token_acts_as_its_principal_and_another_tenants_run_is_a_404(
        site: tuple[InProcessWorker, str]) -> None:
    worker, acme_run = site
    client = http(worker)
    mine = client.get(f"/runs/{acme_run}/events", headers=bearer("acme-t0ken"))
    assert mine.status_code == 200 and "event: end" in mine.text
    theirs = client.get(f"/runs/{acme_run}/events", headers=bearer("globex-t0ken"))
    nobodys = client.get("/runs/web-nobody/events", headers=bearer("globex-t0ken"))
    assert theirs.status_code == nobodys.status_code == 404
    assert theirs.json()["error"]["code"] == nobodys.json()["error"]["code"] == "unknown_run"
    assert "acme" not in theirs.text.replace(acme_run, "")


@pytest.mark.parametrize("headers", [
    {}, bearer("wrong"), bearer(""), {"Authorization": "Basic YWNtZTpkYXNo"},
    # Proxy headers from a client, with no proxy configured: ignored.
    {"X-Forwarded-User": "acme:dash", "X-Forwarded-Tenant": "acme"},
], ids=["none", "unknown", "empty", "basic", "unconfigured-proxy"])
def test_without_accepted_credentials_it_is_a_401(
        site: tuple[InProcessWorker, str], headers: dict[str, str]) -> None:
    worker, acme_run = site
    r = http(worker).get(f"/runs/{acme_run}/events", headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "unauthenticated"


def test_a_configured_proxy_names_the_principal(site: tuple[InProcessWorker, str]) -> None:
    worker, acme_run = site
    client = http(worker, ProxyHeaders("X-Forwarded-User"))
    url = f"/runs/{acme_run}/events"

    def proxied(tenant: str | None, **extra: str) -> int:
        headers = {"X-Forwarded-User": f"{tenant}:sso-user", "X-Forwarded-Roles": "submitter",
                   **({"X-Forwarded-Tenant": tenant} if tenant else {}), **extra}
        return client.get(url, headers=headers).status_code

    assert proxied("acme") == 200
    assert proxied("globex") == 404
    assert proxied(None) == 401  # a user without a tenant is nobody
    assert proxied("acme", Authorization="Bearer wrong") == 401  # a bad token is not rescued


def test_tokens_are_configured_by_their_digest_never_in_plaintext() -> None:
    entry = {"id": "acme:ci", "tenant": "acme", "roles": ["submitter"]}
    auth = WebAuth.from_settings(Settings(web_tokens=json.dumps({token_digest("s3cret"): entry})))
    assert auth.principal({"authorization": "Bearer s3cret"}) == Principal(
        "acme:ci", "acme", {"submitter"})
    with pytest.raises(ConfigurationError, match="SHA-256"):
        parse_tokens(json.dumps({"s3cret": entry}))
    with pytest.raises(ConfigurationError):
        parse_tokens(json.dumps({token_digest("x"): {"id": "x", "tenant": "*"}}))  # not admin
