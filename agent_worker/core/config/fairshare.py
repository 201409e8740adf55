"""Settings of fair share (``agent_worker.fairshare``): the fleet's cap on
laps in flight, tenants' and provider keys' concurrency, weights and rate
limits."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings

from agent_worker.core.errors import ConfigurationError
from agent_worker.core.untrusted import check_name


def provider_caps(text: str, name: str = "AGENT_WORKER_PROVIDER_CONCURRENCY"
                  ) -> dict[str, int]:
    """The setting ``name`` parsed: ``key=N,key=N``.

    Raises:
        ConfigurationError: an entry is not ``identifier=positive integer``.
    """
    caps: dict[str, int] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            check_name(key.strip(), "provider key")
            cap = int(value)
        except Exception as e:
            raise ConfigurationError(f"{name} entry {item!r} is not key=N: {e}") from e
        if not sep or cap < 1:
            raise ConfigurationError(f"{name} entry {item!r}: N must be at least 1")
        caps[key.strip()] = cap
    return caps


class FairShareSettings(BaseSettings):
    """Admission's caps, weights and rate limits."""

    max_laps_in_flight: int = Field(
        0,
        ge=0,
        description="Fair share: fleet-wide cap on laps in flight (admitted lap messages plus "
        "running laps); 0 means none. Bounds the lap messages in Redis: a backlog beyond it "
        "waits in Postgres. Set it a little above the fleet's total worker concurrency.",
    )
    tenant_concurrency: int = Field(
        0, ge=0, description="Fair share: default cap on one tenant's laps in flight; 0 means "
        "none. A tenant's own row (`agent-worker share set`) overrides it."
    )
    tenant_weight: float = Field(
        1.0, gt=0, description="Fair share: default weight of a tenant; when runs wait for "
        "slots, tenants get slots in proportion to their weights."
    )
    provider_concurrency: str = Field(
        "",
        description="Fair share: caps on laps in flight per model provider key, as "
        "`key=N,key=N`; an agent names its key with `Agent(provider_key=...)`.",
    )
    tenant_laps_per_minute: int = Field(
        0, ge=0, description="Rate limit: default laps one tenant may start per minute "
        "(sliding window, fleet-wide); 0 means none. A tenant's own row overrides it; a run "
        "over it waits queued, holding nothing."
    )
    tenant_tokens_per_minute: int = Field(
        0, ge=0, description="Rate limit: default model tokens (input plus output) one "
        "tenant may use per minute, estimated at admission and corrected from each lap's "
        "usage; 0 means none. A tenant's own row overrides it."
    )
    provider_tokens_per_minute: str = Field(
        "", description="Rate limit: model tokens per minute per provider key, as "
        "`key=N,key=N`, shared by every tenant on that key."
    )
    rate_tokens_estimate: int = Field(
        1000, ge=1, description="Rate limit: tokens charged for a run's first lap, before "
        "it has a usage of its own to go by (later laps: the run's mean so far)."
    )
    share_refresh_seconds: float = Field(
        5.0, gt=0, description="How often a process re-reads the fair-share limits table: a "
        "change made with `agent-worker share` applies within this long."
    )

    @field_validator("provider_concurrency", "provider_tokens_per_minute")
    @classmethod
    def _provider_caps(cls, value: str, info: ValidationInfo) -> str:
        """Refused at start, not at the first send: raises ``ConfigurationError``."""
        provider_caps(value, f"AGENT_WORKER_{(info.field_name or '').upper()}")
        return value


__all__ = ["FairShareSettings", "provider_caps"]
