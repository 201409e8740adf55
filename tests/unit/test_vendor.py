"""The fake vendor must behave like the real thing, or the exactly-once tests prove nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from agent_worker.core.errors import ToolError
from agent_worker.demo.vendor import (
    REFUND_LIMIT_CENTS,
    LookupUnsupported,
    Mode,
    VendorClient,
    VendorProcess,
    VendorUnavailable,
    start_vendor,
)

StartVendor = Callable[..., VendorProcess]


@pytest.fixture
def vendor_factory(tmp_path: Path) -> Iterator[StartVendor]:
    started: list[VendorProcess] = []

    def start(mode: Mode = "idempotent") -> VendorProcess:
        started.append(start_vendor(tmp_path / f"vendor-{mode}.db", mode))
        return started[-1]

    yield start
    for vendor in started:
        vendor.stop()


@pytest.fixture
def vendor(vendor_factory: StartVendor) -> VendorProcess:
    return vendor_factory()


def test_idempotent_replay_returns_same_body_and_moves_once(vendor: VendorProcess) -> None:
    first = vendor.client.refund("o1", 500, idempotency_key="k1")
    again = vendor.client.refund("o1", 500, idempotency_key="k1")
    assert first == again
    assert first["id"].startswith("re_") and first["status"] == "succeeded"
    stats = vendor.client.stats()
    assert stats["applied"] == 1 and stats["total_cents"] == 500
    assert stats["by_key"] == {"k1": 1} and stats["duplicates"] == 0


def test_same_key_different_params_is_422_and_moves_nothing(vendor: VendorProcess) -> None:
    vendor.client.refund("o1", 500, idempotency_key="k1")
    with pytest.raises(ToolError, match="different parameters"):
        vendor.client.refund("o1", 600, idempotency_key="k1")
    with pytest.raises(ToolError, match="422"):
        vendor.client.notice("a@b.c", "hi", idempotency_key="k1")
    stats = vendor.client.stats()
    assert (stats["applied"], stats["total_cents"], stats["notices"]) == (1, 500, 0)


def test_stored_error_is_replayed_verbatim(vendor: VendorProcess) -> None:
    req = {"order_id": "o1", "amount_cents": REFUND_LIMIT_CENTS + 1}
    headers = {"Idempotency-Key": "big"}
    first = httpx.post(vendor.url + "/refunds", json=req, headers=headers)
    again = httpx.post(vendor.url + "/refunds", json=req, headers=headers)
    assert first.status_code == again.status_code == 402
    assert first.content == again.content
    with pytest.raises(ToolError, match="declined"):
        vendor.client.refund("o1", REFUND_LIMIT_CENTS + 1, idempotency_key="big")
    assert vendor.client.stats()["applied"] == 0
    found = vendor.client.lookup("big")
    assert found is not None and found["status"] == 402 and found["applied_count"] == 0


def test_validation_error_is_not_stored(vendor: VendorProcess) -> None:
    with pytest.raises(ToolError, match="amount_cents"):
        vendor.client.refund("o1", -5, idempotency_key="k")
    assert vendor.client.lookup("k") is None
    assert vendor.client.refund("o1", 5, idempotency_key="k")["amount_cents"] == 5


def test_concurrent_same_key_applies_once(vendor: VendorProcess) -> None:
    with ThreadPoolExecutor(8) as pool:
        bodies = list(
            pool.map(lambda _: vendor.client.notice("a@b.c", "hi", idempotency_key="n"), range(16))
        )
    assert all(b == bodies[0] for b in bodies) and bodies[0]["id"].startswith("nt_")
    assert vendor.client.stats()["notices"] == 1


def test_lookup_mode_moves_twice_but_finds_by_key(vendor_factory: StartVendor) -> None:
    vendor = vendor_factory("lookup")
    first = vendor.client.refund("o1", 500, idempotency_key="k1")
    second = vendor.client.refund("o1", 500, idempotency_key="k1")
    assert first["id"] != second["id"]
    stats = vendor.client.stats()
    assert stats["applied"] == 2 and stats["by_key"] == {"k1": 2} and stats["duplicates"] == 1
    found = vendor.client.lookup("k1")
    assert found is not None and found["kind"] == "refund" and found["applied_count"] == 2
    assert found["request"] == {"order_id": "o1", "amount_cents": 500}
    assert vendor.client.lookup("nope") is None


def test_plain_mode_has_no_lookup(vendor_factory: StartVendor) -> None:
    vendor = vendor_factory("plain")
    vendor.client.refund("o1", 500, idempotency_key="k1")
    vendor.client.refund("o1", 500, idempotency_key="k1")
    with pytest.raises(LookupUnsupported):
        vendor.client.lookup("k1")
    assert vendor.client.stats()["duplicates"] == 1


def test_drop_after_apply_takes_the_money_silently(vendor: VendorProcess) -> None:
    vendor.client.inject("drop_after_apply", path="/refunds")
    with pytest.raises(VendorUnavailable):
        vendor.client.refund("o1", 700, idempotency_key="k/1 ?")
    assert vendor.client.stats()["applied"] == 1
    found = vendor.client.lookup("k/1 ?")
    assert found is not None and found["response"]["amount_cents"] == 700
    retried = vendor.client.refund("o1", 700, idempotency_key="k/1 ?")
    assert retried == found["response"]
    assert vendor.client.stats()["applied"] == 1


def test_fail_returns_500_and_applies_nothing(vendor: VendorProcess) -> None:
    vendor.client.inject("fail", count=2)
    raw = httpx.post(vendor.url + "/refunds", json={"order_id": "o1", "amount_cents": 1})
    assert raw.status_code == 500
    with pytest.raises(VendorUnavailable):
        vendor.client.refund("o1", 900, idempotency_key="k1")
    assert vendor.client.stats()["applied"] == 0
    assert vendor.client.lookup("k1") is None
    vendor.client.refund("o1", 900, idempotency_key="k1")
    assert vendor.client.stats()["total_cents"] == 900


def test_hang_times_out_then_applies(vendor: VendorProcess) -> None:
    vendor.client.inject("hang", path="/notices", seconds=0.6)
    with VendorClient(vendor.url, timeout=0.2) as impatient, pytest.raises(VendorUnavailable):
        impatient.notice("a@b.c", "hi", idempotency_key="h")
    deadline = time.monotonic() + 3
    while vendor.client.stats()["notices"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vendor.client.stats()["notices"] == 1


def test_restart_keeps_counts_and_keys(vendor: VendorProcess) -> None:
    first = vendor.client.refund("o1", 500, idempotency_key="k1")
    vendor.restart()
    assert vendor.client.stats()["applied"] == 1
    assert vendor.client.refund("o1", 500, idempotency_key="k1") == first
    vendor.client.reset()
    assert vendor.client.stats()["applied"] == 0


def test_dead_vendor_is_unavailable_and_bad_start_is_reported(tmp_path: Path) -> None:
    with VendorProcess(tmp_path / "v.db") as vendor:
        client = VendorClient(vendor.url, timeout=1)
    with client, pytest.raises(VendorUnavailable):
        client.stats()
    with vendor_on_port(tmp_path, None) as squatter, pytest.raises(RuntimeError, match="exited"):
        vendor_on_port(tmp_path, squatter.port).start()


def vendor_on_port(tmp_path: Path, port: int | None) -> VendorProcess:
    return VendorProcess(tmp_path / f"v{port}.db", port=port, startup_timeout=5)
