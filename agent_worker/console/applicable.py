"""Which run verbs can apply to a run as it stands now.

A finished run offered "Retry…" or "Signal…" invites a click the API then
refuses; the run page shows only the verbs that can apply, and the
confirmation page refuses the rest before asking anything. The rule is read
from the vocabulary the API and the store decide by (``TERMINAL``,
``RETRYABLE``, ``WaitingFor``), never from a list of the console's own, so
the two cannot drift.

This is a courtesy, not the check: the page is rendered at one moment and
posted at another (the run may finish in between), so the POST goes to the
API, which decides again under the run's row lock and refuses with an
``InvalidStateError`` (the 409 page that links back to the run).
"""

from __future__ import annotations

from agent_worker.core.authorization import Action
from agent_worker.core.errors import InvalidStateError
from agent_worker.core.vocabulary import RETRYABLE, TERMINAL, WaitingFor, WaitKind
from agent_worker.store.base import RunRecord


def waited_ref(run: RunRecord, kind: WaitKind) -> str | None:
    """What a waiting run waits for, when it is a ``kind`` (an effect's key,
    an approval's id); None when it waits on no such thing."""
    if run.status != "waiting" or not run.waiting_for:
        return None
    try:
        wait = WaitingFor.parse(run.waiting_for)
    except ValueError:
        return None
    return wait.ref if wait.kind == kind else None


def waited_effect(run: RunRecord) -> str | None:
    """The key of the effect a run waits for a verdict on (None if it waits on none)."""
    return waited_ref(run, "effect")


def waits_on_budget(run: RunRecord) -> bool:
    """Whether the run paused on its budget (what raising it resumes)."""
    return run.status == "waiting" and run.waiting_for == WaitingFor("budget").format()


def why_not(verb: Action, run: RunRecord) -> str | None:
    """Why ``verb`` cannot apply to ``run`` now; None when it can."""
    if verb == "fork":
        return None  # any run's kept history can start a new run
    if verb == "signal" and run.status in TERMINAL:
        return f"run {run.id} is {run.status}; it takes no more signals"
    if verb == "cancel" and run.status in TERMINAL:
        return f"run {run.id} is already {run.status}; there is nothing left to cancel"
    if verb == "cancel" and run.cancel_requested_at is not None:
        return f"run {run.id} is already being cancelled"
    if verb == "retry" and run.status not in RETRYABLE:
        return (f"run {run.id} is {run.status}; only a run that is "
                f"{' or '.join(RETRYABLE)} can be retried")
    if verb == "resolve" and waited_effect(run) is None:
        return (f"run {run.id} is {run.status}; it waits on no effect whose outcome is "
                "unknown, so there is nothing to resolve")
    if verb == "raise_budget" and not waits_on_budget(run):
        return (f"run {run.id} is {run.status}; only a run paused on its budget "
                "resumes when the budget is raised")
    return None


def applies(verb: Action, run: RunRecord) -> bool:
    return why_not(verb, run) is None


def require_applicable(verb: Action, run: RunRecord) -> None:
    """Raises ``InvalidStateError`` (the 409 page) when ``verb`` cannot apply."""
    reason = why_not(verb, run)
    if reason is not None:
        raise InvalidStateError(reason)


__all__ = ["applies", "require_applicable", "waited_effect", "waited_ref", "waits_on_budget",
           "why_not"]
