"""Settings an operator runs the fleet by: the versions a worker serves,
metrics, logs, retention, the schedules' pass and lap traces."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class OperationsSettings(BaseSettings):
    """Versions served, metrics, logs, retention, schedules and traces."""

    worker_versions: str = Field(
        "",
        description="Comma-separated agent@version pairs this worker serves; empty means every "
        "registered agent at its registered version.",
    )
    metrics_port: int = Field(9100, description="Port of `agent-worker metrics`.")
    metrics_bind: str = Field(
        "127.0.0.1",
        description="Address `agent-worker metrics` listens on: loopback unless told otherwise "
        "(every scrape runs fleet-wide queries and needs no auth); `0.0.0.0` inside a "
        "container whose port only the cluster network reaches.",
    )
    vendor_url: str = Field(
        "http://127.0.0.1:63800",
        description="The demo vendor (a fake payments and email API) the `refund-desk` agent "
        "calls; `deploy/local/services.sh start` runs one there. Empty: refunds fail as "
        "not configured.",
    )
    log_json: bool = Field(False, description="Emit structured JSON log lines.")
    stale_after_seconds: float = Field(
        300.0,
        gt=0,
        description="A running or queued run with no checkpoint for this long counts as stale.",
    )
    checkpoint_retention_days: float = Field(
        7.0, ge=0, description="Intermediate checkpoints of finished runs older than this are "
        "pruned (the final one is kept)."
    )
    ledger_retention_days: float = Field(
        365.0, ge=0, description="Effects, events and messages of finished runs are kept this long."
    )
    prune_batch_size: int = Field(
        500, gt=0, description="Rows deleted per prune transaction, so pruning never blocks laps."
    )
    schedule_interval_seconds: float = Field(
        1.0, gt=0, description="How often celery beat runs the schedules' firing pass; keep it "
        "below the shortest interval of any schedule."
    )
    schedule_grace_seconds: float = Field(
        60.0, gt=0, description="A schedule's latest fire time counts as on time (not missed, "
        "whatever its catch-up policy) until this long after it; older ones were missed while "
        "beat was down."
    )
    trace_export: str = Field(
        "",
        pattern=r"^(|otlp|file:.+)$",
        description="Where workers send OpenTelemetry lap traces: empty (off, no cost), `otlp` "
        "(needs `pip install 'agent-worker[otlp]'`; endpoint and headers from the standard "
        "`OTEL_EXPORTER_OTLP_*` variables) or `file:PATH` (one JSON span per line, for tests "
        "and debugging).",
    )


__all__ = ["OperationsSettings"]
