"""Configuration: one pydantic-settings class, read from ``AGENT_WORKER_*``.

Nothing reads the environment at import time; ``get_settings()`` builds the value
once per process (tests call ``get_settings.cache_clear()`` after changing it).
The README's configuration table is generated from the field descriptions.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_worker.authorization import DEFAULT_GRANTS


class Settings(BaseSettings):
    """Every knob of agent-worker, with why it exists."""

    model_config = SettingsConfigDict(env_prefix="AGENT_WORKER_", extra="ignore")

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
        3.0, gt=0, description="How often a running lap renews its lease (< lease TTL / 2)."
    )
    sweep_interval_seconds: float = Field(
        2.0, gt=0, description="How often celery beat runs the sweeper."
    )
    queued_overdue_seconds: float = Field(
        60.0,
        gt=0,
        description="Longest wait between re-sends of a queued lap nobody claims. The first "
        "re-send comes one lease TTL after the send (the hand-off is covered like a lease: "
        "Redis or a dying worker may have lost the message), later ones back off, doubling, "
        "up to this; never to a version no live worker serves. Duplicates are harmless: the "
        "claim is fenced.",
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
        "laps per process waiting on their model calls (IO-bound fleets, see README); no "
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
    max_input_bytes: int = Field(
        256_000, gt=0, description="Largest accepted run input (JSON bytes)."
    )
    max_model_output_bytes: int = Field(
        256_000, gt=0, description="Largest accepted model response (JSON bytes)."
    )
    max_tool_result_bytes: int = Field(
        256_000,
        gt=0,
        description="Largest tool result or signal payload (JSON bytes). A larger tool result "
        "reaches the model as a tool error and the ledger keeps only its size and a prefix; a "
        "larger signal payload is refused to the sender.",
    )
    max_json_depth: int = Field(
        64, ge=1, le=500, description="Deepest nesting accepted in any JSON value from outside "
        "(run input, model tool arguments, tool results, signal payloads)."
    )
    max_signal_name_chars: int = Field(
        100, ge=1, le=200, description="Longest signal name (an identifier)."
    )
    max_pending_signals: int = Field(
        100, ge=1, description="Undelivered signals one run may hold; more are refused."
    )
    max_approval_comment_chars: int = Field(
        4000, ge=1, description="Longest approval or rejection comment."
    )
    max_cancel_reason_chars: int = Field(2000, ge=1, description="Longest cancel reason.")
    max_principal_chars: int = Field(
        200, ge=1, le=200, description="Longest principal id a client acts as (stored as `by`: "
        "who decided, cancelled or retried, and in the audit log)."
    )
    principal_id: str = Field(
        "",
        description="Who the module-level functions and the CLI act as (recorded as `by` and "
        "in the audit log); empty: `local:<OS user>`.",
    )
    principal_tenant: str = Field(
        "*",
        description="Tenant of that principal; `*` (every tenant, admins only) is the "
        "single-tenant default. A multi-tenant deployment sets its tenant here.",
    )
    principal_roles: str = Field(
        "admin",
        description="Comma-separated roles and groups of that principal (submitter, approver, "
        "operator, admin, or a group an agent's `approval_owner` names).",
    )
    role_grants: dict[str, list[str]] = Field(
        DEFAULT_GRANTS,
        description="JSON mapping of role to the actions it allows (read, start, signal, "
        "cancel, approve, reject, retry, fork, resolve, raise_budget, edit_state, audit, "
        "share).",
    )
    web_tokens: str = Field(
        "",
        description="Bearer tokens of the web endpoints (server-sent events, console), as JSON "
        "mapping each token's SHA-256 hex digest (never the token) to its principal: "
        '{"<sha256>": {"id": "acme:ci", "tenant": "acme", "roles": ["submitter"]}}.',
    )
    web_proxy_user_header: str = Field(
        "",
        description="Request header in which a trusted reverse proxy names the user it "
        "authenticated (e.g. X-Forwarded-User); empty: no proxy is trusted. Set it only when "
        "every request comes through that proxy and it overwrites the client's copies.",
    )
    web_proxy_tenant_header: str = Field(
        "X-Forwarded-Tenant",
        description="With web_proxy_user_header: the header naming that user's tenant "
        "(required on every request).",
    )
    web_proxy_roles_header: str = Field(
        "X-Forwarded-Roles",
        description="With web_proxy_user_header: the header listing that user's roles and "
        "groups, comma-separated.",
    )
    max_labels: int = Field(
        16, ge=1, le=64, description="Most labels one run may carry (`start_run(labels=...)`)."
    )
    max_label_chars: int = Field(
        100, ge=1, le=200, description="Longest label key (an identifier) or value (text "
        "without control characters)."
    )
    max_plan_items: int = Field(
        50, ge=1, description="Most items in the plan an agent (or an operator) sets."
    )
    max_state_text_chars: int = Field(
        1000, ge=1, description="Longest plan item, next planned action or operator note."
    )
    max_facts: int = Field(
        50, ge=1, description="Most pinned facts of a run; they are in every lap's system "
        "context, so they are bounded."
    )
    max_facts_bytes: int = Field(
        16_000, ge=1, description="Largest size of a run's pinned facts (JSON bytes)."
    )
    max_child_depth: int = Field(
        4, ge=0, description="Deepest nesting of child runs (a top-level run is depth 0; "
        "0 forbids children)."
    )
    max_children_per_call: int = Field(
        1000, ge=1, description="Most child runs one tool call (or one API call) may start."
    )
    max_children_per_run: int = Field(
        10_000, ge=1, description="Most child runs one parent may start over its life."
    )
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

    # --- the run console (agent_worker.console, issue 20) ---------------------
    console_bind: str = Field(
        "127.0.0.1", description="Run console: the address it listens on (`--host` overrides)."
    )
    console_port: int = Field(
        8090, description="Run console: the port it listens on (`--port` overrides)."
    )
    console_users: str = Field(
        "",
        description="Run console: its users, as a JSON list (or the path of a JSON file) of "
        "`{id, tenant, roles, password_hash}`; hashes from `agent-worker console "
        "hash-password`. Empty: nobody can log in with a password.",
    )
    console_secret: str = Field(
        "",
        description="Run console: the key that signs session cookies. Empty: one is generated "
        "at start, so a restart logs everybody out (set it when several console processes "
        "serve one address).",
    )
    console_session_hours: float = Field(
        12.0, gt=0, description="Run console: how long a login lasts."
    )
    console_proxy_header: str = Field(
        "",
        description="Run console: the header a trusted reverse proxy sets to the id of the "
        "user it authenticated (single sign-on); the user must be in `CONSOLE_USERS`. Empty: "
        "off. Set it only when nothing but the proxy can reach the console.",
    )
    console_flower_url: str = Field(
        "http://127.0.0.1:5555",
        description="Run console: Flower's address, linked from the header and from each run.",
    )
    console_metrics_url: str = Field(
        "http://127.0.0.1:9100/metrics",
        description="Run console: the metrics address linked from the header.",
    )
    console_page_size: int = Field(
        50, ge=1, le=1000, description="Run console: rows per page of every long list."
    )
    console_poll_seconds: float = Field(
        2.0, gt=0, description="Run console: how often a moving run's page refreshes itself."
    )

    @field_validator("provider_concurrency", "provider_tokens_per_minute")
    @classmethod
    def _provider_caps(cls, value: str, info: ValidationInfo) -> str:
        """Refused at start, not at the first send: raises ``ConfigurationError``."""
        from agent_worker.fairshare import provider_caps  # imports this module

        provider_caps(value, f"AGENT_WORKER_{(info.field_name or '').upper()}")
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()


def config_table() -> str:
    """The README's configuration table, generated from the field descriptions."""
    rows = ["| variable | default | what it is for |", "|---|---|---|"]
    for name, f in Settings.model_fields.items():
        default = "" if f.default in ("", None) else f"`{f.default}`"
        rows.append(f"| `AGENT_WORKER_{name.upper()}` | {default} | {f.description} |")
    return "\n".join(rows)
