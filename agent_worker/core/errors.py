"""One exception tree for everything agent-worker raises.

Each class carries a stable ``code`` that is stored on the run row when the error
ends a run, so operators and scripts can match on it without parsing messages.
Control-flow signals that tool code must not swallow (lease lost, run cancelled)
derive from ``BaseException`` and are caught only at the lap task's edge.
"""

from __future__ import annotations


class AgentWorkerError(Exception):
    """Root of every error agent-worker raises on purpose."""

    code = "agent_worker_error"
    retriable = False


# --- input: the caller or the model handed us something we refuse -------------


class InvalidInputError(AgentWorkerError):
    """Raised when application input is malformed; nothing has been written."""

    code = "invalid_input"


class StateLimitError(InvalidInputError):
    """Raised when a plan, fact, next action or operator note is malformed or
    over its bound (an agent gets it as a tool error, an operator as an error)."""

    code = "state_limit"


class UnknownAgentError(InvalidInputError):
    """Raised when no registered agent has the requested name (and version)."""

    code = "unknown_agent"


class NotFoundError(InvalidInputError):
    """Raised when a named run, approval or effect does not exist."""

    code = "not_found"


class UnknownRunError(NotFoundError):
    """Raised when a run id does not exist."""

    code = "unknown_run"


class PayloadTooLargeError(InvalidInputError):
    """Raised when an input, model output or tool result exceeds its byte limit."""

    code = "payload_too_large"


class NestingTooDeepError(InvalidInputError):
    """Raised when a JSON value nests deeper than ``max_json_depth`` (instead of a
    ``RecursionError`` from deep inside a parser or serializer)."""

    code = "nesting_too_deep"


class InvalidScheduleError(InvalidInputError):
    """Raised when a schedule's cron expression, time zone or policy is invalid."""

    code = "invalid_schedule"


class ScheduleExistsError(InvalidInputError):
    """Raised when a schedule of that name exists already (names are unique)."""

    code = "schedule_exists"


class UnknownScheduleError(NotFoundError):
    """Raised when no schedule has that name."""

    code = "unknown_schedule"

class RunIdUnavailableError(InvalidInputError):
    """Raised when ``start_run`` names a run id that is taken by a run the caller
    may not see (run ids are global): nothing about that run is revealed."""

    code = "run_id_unavailable"


class RunConflictError(InvalidInputError):
    """Raised when ``start_run`` names a run id that exists with another agent
    or another input: a retried start returns the run only when it repeats
    the original; nothing is written."""

    code = "run_conflict"


class PermissionDeniedError(AgentWorkerError):
    """Raised when the acting principal may not do what it asked (its roles, the
    application's authorizer or an approval's owner say no); the refusal is
    recorded in the audit log."""

    code = "permission_denied"


class AuthenticationError(AgentWorkerError):
    """Raised when a web request carries no credentials we accept (no bearer
    token, an unknown one, or no trusted proxy's headers): HTTP 401. Unlike
    ``PermissionDeniedError`` nobody is known, so nothing is audited."""

    code = "unauthenticated"


class InvalidStateError(AgentWorkerError):
    """Raised when an operation does not fit the run's current status."""

    code = "invalid_state"


class ChildLimitError(InvalidInputError):
    """Raised when starting child runs would pass a limit (depth, children per
    call or per run); nothing is started. A tool's request comes back to the
    model as a tool error."""

    code = "child_limit"


class AlreadyDecidedError(InvalidStateError):
    """Raised when an approval was already decided (or timed out)."""

    code = "already_decided"


class ReplayRefusedError(InvalidStateError):
    """Raised when a verb would resume history that was undone (compensated
    effects) or deleted (pruned by retention): replaying it would act as if the
    undone still stood, or repeat effects whose ledger is gone."""

    code = "replay_refused"


class AgentDefinitionError(InvalidInputError, ValueError):
    """Raised when an agent is defined in a way that would break a guarantee
    (e.g. an irreversible tool that an approval timeout would auto-approve)."""

    code = "agent_definition"


# --- model ---------------------------------------------------------------------


class ModelError(AgentWorkerError):
    """Raised by a model client; ``retriable`` says whether the lap may try again."""

    code = "model_error"


class TransientModelError(ModelError):
    """Raised when the provider failed in a way worth retrying (429, 5xx, reset)."""

    code = "model_transient"
    retriable = True


class MalformedModelOutputError(ModelError):
    """Raised when the model's response cannot be understood or used. Retriable:
    sampling again often gives a usable answer; the attempt limit bounds it."""

    code = "malformed_model_output"
    retriable = True


class ModelOutputTooLargeError(MalformedModelOutputError):
    """Raised when the model's response exceeds ``max_model_output_bytes``."""

    code = "model_output_too_large"


class ContextLengthError(ModelError):
    """Raised when the request exceeds the model's context window."""

    code = "context_length"


class ModelRefusalError(ModelError):
    """Raised when the provider refused to answer."""

    code = "model_refusal"


# --- store ---------------------------------------------------------------------


class StoreError(AgentWorkerError):
    """Raised for persistence problems."""

    code = "store_error"


class RetriableStoreError(StoreError):
    """Raised when the database was briefly unavailable or a transaction conflicted."""

    code = "store_unavailable"
    retriable = True


class CheckpointVersionError(StoreError):
    """Raised when a checkpoint's schema version is unknown or newer than this code."""

    code = "checkpoint_version"


class IdempotencyConflictError(StoreError):
    """Raised when one idempotency key is reused with different arguments."""

    code = "idempotency_conflict"


# --- effects -------------------------------------------------------------------


class EffectError(AgentWorkerError):
    """Raised for side-effect ledger problems."""

    code = "effect_error"


class EffectUnknownError(EffectError):
    """Raised when a non-idempotent call may or may not have landed; a human decides."""

    code = "effect_unknown"


class CompensationError(EffectError):
    """Raised when a saga compensation keeps failing."""

    code = "compensation_failed"


class EffectTimeoutError(EffectError):
    """Raised when an idempotent call timed out on every attempt: its effect stays
    pending (it may still land) and the lap is retried, whose replay asks the
    tool's lookup or calls again with the same key."""

    code = "effect_timeout"
    retriable = True


class ToolError(AgentWorkerError):
    """Raised by tool code to report a failure the model should see and handle."""

    code = "tool_error"


class RetryableToolError(ToolError):
    """Raised by tool code for a transient failure that did not apply the effect
    (the provider answered 429 or 503 before acting, a connection was refused):
    the engine calls the tool again, with the same idempotency key, up to the
    tool's ``retries``; after the last one the model sees it like a ``ToolError``."""

    code = "tool_retryable"
    retriable = True


class ToolTimeoutError(ToolError):
    """Raised when a tool call outlives its ``timeout``; a read's timeout reaches
    the model as a tool error, an effectful one is settled by the ledger's rules."""

    code = "tool_timeout"


class TaskFailedError(AgentWorkerError):
    """Raised by an agent's own code (a scripted model step, a tool) when the task
    cannot be done at all, e.g. every refund failed: the run ends ``failed`` with
    this code instead of ``succeeded`` with a result that claims otherwise."""

    code = "task_failed"


# --- budget --------------------------------------------------------------------


class BudgetExceededError(AgentWorkerError):
    """Raised when a run would exceed its laps, tokens, cost or deadline."""

    code = "budget_exceeded"


class LapFailedError(AgentWorkerError):
    """Raised when a lap keeps failing past the retry limit (dead-letter)."""

    code = "lap_failed"


class AgentVersionError(AgentWorkerError):
    """Raised when no served version of the agent can resume the run."""

    code = "agent_version"


# --- configuration: refused at process start ------------------------------------


class ConfigurationError(AgentWorkerError):
    """Raised when a process is started with a configuration it must not run with."""

    code = "configuration"


class PlaceholderSecretError(ConfigurationError):
    """Raised when a configured password is empty or a placeholder (``CHANGE_ME``)."""

    code = "placeholder_secret"


# --- control flow: never swallowed by tool code --------------------------------


class LapInterrupted(BaseException):
    """Base of signals that stop a lap mid-way; caught at the lap task's edge."""


class LeaseLost(LapInterrupted):
    """Raised when another worker owns the run now; this lap must not commit."""


class RunCancelled(LapInterrupted):
    """Raised when the run was cancelled while this lap was in flight."""


# --- the run console: who is at the browser ---------------------------------------


class ConsoleAuthError(PermissionDeniedError):
    """Raised when the run console cannot tell who is at the browser: a wrong
    password, an expired or forged session, a proxy header naming nobody."""

    code = "console_auth"


class CsrfRefusedError(PermissionDeniedError):
    """Raised when a console form arrives without this session's CSRF token
    (a forged cross-site POST); nothing is done."""

    code = "csrf_refused"


class SessionCheckError(ConsoleAuthError):
    """Raised when the run console cannot reach the store of logged-out sessions
    (Redis) to check or record one: the session is refused, never trusted
    unchecked, and a logout that could not be recorded says so."""

    code = "session_unchecked"
