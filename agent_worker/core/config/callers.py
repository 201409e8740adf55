"""Settings that bound what callers send (inputs, payloads, labels, run state,
child runs) and say whom a client acts as (principals, roles, the web
proxy's headers)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from agent_worker.core.authorization import DEFAULT_GRANTS


class CallerSettings(BaseSettings):
    """Bounds on what comes from outside, and who acts."""

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


__all__ = ["CallerSettings"]
