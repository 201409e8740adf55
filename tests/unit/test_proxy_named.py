"""One reading of a trusted proxy's header (``webauth.proxy_named``) for the
web endpoints and the run console: configured or not, present, blank, padded
or in another case, both faces see the same name, or none."""

from __future__ import annotations

import json

import pytest

from agent_worker.console.proxy import proxied_user
from agent_worker.console.users import UserBook
from agent_worker.core.errors import AuthenticationError
from agent_worker.webauth import ProxyHeaders, WebAuth, proxy_named

BOOK = UserBook.parse(json.dumps([{"id": "ann", "tenant": "acme", "roles": ["approver"]}]))


@pytest.mark.parametrize(("headers", "named"), [
    ({"X-User": "ann"}, "ann"),
    ({"x-user": " ann \t"}, "ann"),  # padded, and keyed in lower case
    ({"X-User": "  "}, None),
    ({"X-Other": "ann"}, None),
    ({}, None),
])
def test_both_faces_read_the_header_alike(headers: dict[str, str], named: str | None) -> None:
    assert proxy_named(headers, "X-User") == named
    console = proxied_user(headers, "X-User", BOOK)
    assert (console.id if console else None) == named
    web = WebAuth(proxy=ProxyHeaders("X-User"))
    if named is None:
        with pytest.raises(AuthenticationError, match="authentication required"):
            web.principal({**headers, "X-Forwarded-Tenant": "acme"})
    else:
        assert web.principal({**headers, "X-Forwarded-Tenant": "acme"}).id == named


def test_an_unconfigured_header_is_never_read() -> None:
    assert proxy_named({"X-User": "ann", "": "ann"}, "") is None
    assert proxied_user({"X-User": "ann"}, "", BOOK) is None
    with pytest.raises(AuthenticationError):
        WebAuth().principal({"X-User": "ann", "X-Forwarded-Tenant": "acme"})
