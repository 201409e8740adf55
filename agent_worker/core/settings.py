"""Configuration: one pydantic-settings class, read from ``AGENT_WORKER_*``.

Nothing reads the environment at import time; ``get_settings()`` builds the value
once per process (tests call ``get_settings.cache_clear()`` after changing it).
The configuration reference (docs/reference/configuration.md) is generated from the
field descriptions.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import SettingsConfigDict

from agent_worker.core.config.callers import CallerSettings
from agent_worker.core.config.console import ConsoleSettings
from agent_worker.core.config.fairshare import FairShareSettings
from agent_worker.core.config.fleet import FleetSettings
from agent_worker.core.config.operations import OperationsSettings


# The fields are declared by concern in ``agent_worker.core.config``. Pydantic
# orders them from the last base to the first: the reference's table (and
# ``model_fields``) reads fleet, callers, operations, fair share, console.
class Settings(ConsoleSettings, FairShareSettings, OperationsSettings, CallerSettings,
               FleetSettings):
    """Every knob of agent-worker, with why it exists."""

    model_config = SettingsConfigDict(env_prefix="AGENT_WORKER_", extra="ignore")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()


def config_table() -> str:
    """The configuration reference's table, generated from the field descriptions."""
    rows = ["| variable | default | what it is for |", "|---|---|---|"]
    for name, f in Settings.model_fields.items():
        default = "" if f.default in ("", None) else f"`{f.default}`"
        rows.append(f"| `AGENT_WORKER_{name.upper()}` | {default} | {f.description} |")
    return "\n".join(rows)
