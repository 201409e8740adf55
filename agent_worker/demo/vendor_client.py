"""The demo vendor's HTTP API as its callers see it (``agent_worker.demo.vendor``
runs it): routes, modes, and a client that sorts every answer into the two
outcomes the effect ledger tells apart, a definite "no" and "unknown".
"""

from __future__ import annotations

from typing import Any, Literal, cast
from urllib.parse import quote

import httpx

from agent_worker.core.errors import ToolError

Mode = Literal["idempotent", "lookup", "plain"]
Json = dict[str, Any]
MODES: tuple[Mode, ...] = ("idempotent", "lookup", "plain")
#: Where an effect is looked up by its idempotency key.
BY_KEY = "/effects/by-key/"


class VendorUnavailable(Exception):
    """The vendor failed or went silent; whether the effect landed is unknown to the caller."""


class LookupUnsupported(ToolError):
    """The vendor cannot be asked what happened, so an unknown outcome stays unknown."""


class VendorClient:
    """Maps vendor answers onto the error split the engine relies on.

    A 4xx is a definite "no" the model should read (``ToolError``); a 5xx, timeout or
    dropped connection leaves the outcome unknown (``VendorUnavailable``).
    """

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout)

    def refund(self, order_id: str, amount_cents: int, *, idempotency_key: str | None) -> Json:
        body = {"order_id": order_id, "amount_cents": amount_cents}
        return self._effect("/refunds", body, idempotency_key)

    def notice(self, to: str, body: str, *, idempotency_key: str | None) -> Json:
        return self._effect("/notices", {"to": to, "body": body}, idempotency_key)

    def lookup(self, key: str) -> Json | None:
        resp = self._request("GET", BY_KEY + quote(key, safe=""))
        if resp.status_code == 404:
            return None
        if resp.status_code == 501:
            raise LookupUnsupported(f"vendor at {self._http.base_url} offers no lookup by key")
        return self._json(resp)

    def stats(self) -> Json:
        return self._json(self._request("GET", "/stats"))

    def calls(self) -> list[Json]:
        """Every effect request the vendor answered: path, key, and when it
        arrived and was answered (the vendor's monotonic clock, in seconds)."""
        resp = self._request("GET", "/_calls")
        if resp.status_code != 200:
            raise VendorUnavailable(f"vendor answered {resp.status_code}: {resp.text}")
        return cast(list[Json], resp.json())

    def inject(
        self, action: str, count: int = 1, path: str | None = None, seconds: float | None = None
    ) -> None:
        body = {"action": action, "count": count, "path": path, "seconds": seconds}
        self._json(self._request("POST", "/_faults", json=body))

    def reset(self) -> None:
        self._json(self._request("POST", "/_reset"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> VendorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _effect(self, path: str, body: Json, key: str | None) -> Json:
        headers = {"Idempotency-Key": key} if key is not None else {}
        return self._json(self._request("POST", path, json=body, headers=headers))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise VendorUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _json(resp: httpx.Response) -> Json:
        if resp.status_code >= 500:
            raise VendorUnavailable(f"vendor answered {resp.status_code}: {resp.text}")
        if resp.status_code >= 400:
            try:
                message = str(resp.json()["error"]["message"])
            except (ValueError, KeyError, TypeError):
                message = resp.text
            raise ToolError(f"{message} (vendor HTTP {resp.status_code})")
        return cast(Json, resp.json())


__all__ = ["BY_KEY", "MODES", "Json", "LookupUnsupported", "Mode", "VendorClient",
           "VendorUnavailable"]
