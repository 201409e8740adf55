"""Settings of the fleet: where its state lives (the store, the broker), how
long a lap may hold a run, and how worker processes run laps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings


class FleetSettings(BaseSettings):
    """The store, the broker, leases, retries and worker processes."""

    database_url: str = Field(
        "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker",
        description="SQLAlchemy URL of the store (Postgres in production; sqlite:///file.db "
        "for the in-process mode).",
    )
    system_database_url: str = Field(
        "",
        description="SQLAlchemy URL the workers, sweeper and heartbeat connect with (they act "
        "for every tenant): a Postgres role with BYPASSRLS, a member of the app role, so laps "
        "pay no row-level-security policy. Never used for a principal's call. Empty: "
        "database_url, with the policies in the system scope.",
    )
    broker_url: str = Field(
        "redis://127.0.0.1:63799/0",
        description="Celery broker URL (Redis). Carries lap messages only; Postgres is the truth.",
    )
    agent_modules: str = Field(
        "agent_worker.demo.refund_desk",
        description="Comma-separated modules imported at start so their agents register.",
    )
    lease_ttl_seconds: float = Field(
        10.0,
        gt=0,
        description="How long a claimed lap stays owned without a heartbeat; bounds recovery "
        "time after a worker dies (with the sweep interval).",
    )
    heartbeat_interval_seconds: float = Field(
        3.0, gt=0, description="How often a running lap renews its lease (< lease TTL / 2); "
        "also how long a lap message missing from its queue stays unclaimed before the "
        "sweeper re-sends it."
    )
    sweep_interval_seconds: float = Field(
        2.0, gt=0, description="How often celery beat runs the sweeper."
    )
    queued_overdue_seconds: float = Field(
        60.0,
        gt=0,
        description="Longest wait between re-sends of a queued lap nobody claims while the "
        "broker's queues cannot be read. The sweeper re-sends a lap only when its queue holds "
        "fewer messages than runs wait on one (a backlog is never sent twice); without that "
        "reading the first re-send comes one lease TTL after the send, later ones back off, "
        "doubling, up to this. Never to a version no live worker serves; a duplicate is "
        "harmless: the claim is fenced.",
    )
    max_lap_attempts: int = Field(
        5, ge=1, description="Attempts of one lap before the run fails (dead-letter)."
    )
    retry_backoff_seconds: float = Field(
        1.0, ge=0, description="First retry delay of a failed lap; doubles each attempt."
    )
    retry_backoff_max_seconds: float = Field(
        60.0, ge=0, description="Cap of the retry delay (jitter is added on top, up to 25%)."
    )
    lap_soft_time_limit_seconds: float = Field(
        600.0, gt=0, description="Celery soft time limit of one lap: a hung tool is interrupted."
    )
    lap_time_limit_seconds: float = Field(
        660.0, gt=0, description="Celery hard time limit of one lap (pool child is killed)."
    )
    worker_pool: Literal["prefork", "threads", "solo"] = Field(
        "prefork",
        description="Celery pool of a worker process (a `--pool` flag other than "
        "`prefork`, which Celery takes for its default, overrides it). "
        "`prefork`: one lap per process, hard time limits kill a hung lap. `threads`: many "
        "laps per process waiting on their model calls (IO-bound fleets: the fleet guide); no "
        "Celery time limits, a lap past `AGENT_WORKER_LAP_TIME_LIMIT_SECONDS` loses its lease "
        "instead.",
    )
    worker_concurrency: int = Field(
        0,
        ge=0,
        description="Laps one worker runs at once (a `--concurrency` flag overrides it); 0 "
        "means Celery's default, the CPU count. With `threads`, about the runs in flight per "
        "process you want (e.g. 256).",
    )
    worker_active_laps: int = Field(
        4,
        ge=0,
        description="Laps of one worker process that do their own work at once (claim, "
        "parsing, journal, commit, hand-off); the others wait for a place, and a lap gives "
        "its place up while it waits on its model or tools. Matters only for a `threads` "
        "worker, where a wave of model answers otherwise contends for the interpreter, "
        "Postgres and Redis all at once; 0 means no limit.",
    )
    worker_db_pool_size: int = Field(
        20,
        ge=1,
        description="Postgres connections a worker process keeps for its laps (opened on "
        "demand, then kept): at least the laps that touch the database at once, so a "
        "`threads` worker does not connect and disconnect around every lap. Up to 10 more "
        "are opened past it, each closed after use.",
    )
    worker_gc_threshold: int = Field(
        10_000,
        ge=0,
        le=100_000_000,  # gc.set_threshold takes a C int; past it the worker would not start
        description="Allocations between two collections of the youngest generation of "
        "Python's cyclic garbage collector in a worker process (Python's default: 700): a "
        "lap's objects die young instead of being promoted, so the full collections that "
        "stop every thread of the process come far less often. The heap the worker starts "
        "with is frozen first (`gc.freeze`), which keeps prefork children's copies of it "
        "shared (BENCHMARKS.md, \"The worker's garbage collector\"). 0 leaves Python's "
        "collector as it is.",
    )
    task_events: bool = Field(
        True,
        description="Send Celery task events (Flower's task views need them); each lap costs "
        "Redis publishes. Off, Flower still lists workers and queues.",
    )
    visibility_timeout_seconds: int = Field(
        7200,
        gt=0,
        description="Redis visibility timeout; must exceed the longest lap plus queue wait, "
        "or healthy laps get redelivered while running.",
    )
    soft_shutdown_timeout_seconds: float = Field(
        20.0,
        ge=0,
        description="On SIGTERM (with REMAP_SIGTERM=SIGQUIT) laps get this long to finish "
        "before they are handed back; keep it below the platform's grace period.",
    )
    max_parallel_calls: int = Field(
        8,
        ge=1,
        le=256,
        description="Default of `Agent(max_parallel_calls=...)`: how many tool calls of one "
        "model turn run at once in a lap (threads; each holds a database connection only while "
        "it writes its intent or outcome). 1 runs them one by one.",
    )


__all__ = ["FleetSettings"]
