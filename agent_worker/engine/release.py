"""How a lap that stops early lets go of its run (``engine.lap``): every
way out but a commit goes through ``release``, a fenced write that retries
with backoff, pauses, fails, or ends the run after running its compensations.
A release that lands sends what is due next; none is sent before it lands.
"""

from __future__ import annotations

import logging
import random
import traceback
from datetime import timedelta
from typing import Any, Literal, cast

from agent_worker import fairshare
from agent_worker.agent import Agent
from agent_worker.core.errors import AgentWorkerError, CheckpointVersionError
from agent_worker.core.redaction import Redactor, redact_secrets
from agent_worker.core.untrusted import clean, reduced
from agent_worker.core.vocabulary import TERMINAL, RunStatus, WaitingFor
from agent_worker.engine import admit, children
from agent_worker.engine.saga import compensate, give_up, reconcile
from agent_worker.runtime import Runtime
from agent_worker.store.base import Claim, DueLap, RunRecord, RunUpdate

#: The lap's own logger: these records are the lap's, wherever the code sits.
log = logging.getLogger("agent_worker.lap")
#: What a lap reports to its caller (the Celery task, the in-process runner).
Outcome = Literal["skipped", "committed", "paused", "retrying", "failed", "lost", "finished",
                  "unserved"]


def release(rt: Runtime, claim: Claim, update: RunUpdate, event: dict[str, Any], *,
             reset_attempts: bool = False, fence_cancel: bool = True) -> bool:
    ok = rt.store.release(claim.run.id, claim.lap, owner=claim.owner, now=rt.clock.now(),
                          outcome=update, event=event, reset_attempts=reset_attempts,
                          fence_cancel=fence_cancel)
    if ok and update.enqueue and update.status == "queued" and update.wake_at is None:
        rt.send_all([_due(claim, claim.lap)])
    elif ok:
        rt.send_all([])  # the run gave its slot back: admission hands it on
    if ok and update.status in TERMINAL:
        children.wake_parent(rt, claim.run)
    return ok


def _due(claim: Claim, lap: int) -> DueLap:
    return DueLap(claim.run.id, lap, claim.run.agent_name, claim.run.agent_version)


def resend_orphan(rt: Runtime, claim: Claim) -> RunRecord | None:
    """After losing the lease, make sure the run is not left without a message:
    if our COMMIT landed but its reply was lost (the retry then hit the fence),
    send the next lap; if our claim itself was lost (a database crash) and nobody
    holds the run, send this lap again. Duplicates are harmless (the claim is
    fenced); a missing send would wait for the overdue sweep."""
    run = rt.store.get_run(claim.run.id)
    if run is None or run.status != "queued" or run.lease_owner:
        return run
    if run.next_lap >= claim.lap:
        # To the run's current pin: a migrating commit may have moved it.
        rt.send_all([DueLap(run.id, run.next_lap, run.agent_name, run.agent_version)])
    return run


def handle_error(rt: Runtime, claim: Claim, e: Exception, redact: Redactor | None) -> Outcome:
    """Record ``e`` and release the lease; never raises. If recording fails
    (a database error on the text, a hostile ``__str__``, the redactor itself),
    the error is recorded again in a reduced form: its code and a short cleaned
    message, no traceback. If even that fails the lease is left to lapse and the
    sweeper re-sends the lap; the exception still never reaches the caller (the
    Celery task or ``InProcessWorker.run_until_idle``)."""
    # Logged without tracebacks: the failure's context is ``e`` itself, whose
    # text is neither cleaned nor redacted.
    try:
        return _record_error(rt, claim, e, _error_texts(e, redact))
    except Exception as failure:
        log.error("run %s lap %s: recording the error failed (%s); recording it reduced",
                  claim.run.id, claim.lap, _brief(failure))
        texts = (_brief(e), None)
        try:
            return _record_error(rt, claim, e, texts)
        except Exception as again:
            log.error("run %s lap %s: recording the reduced error failed too (%s); the "
                      "lease will lapse and the sweeper re-send the lap", claim.run.id,
                      claim.lap, _brief(again))
            return "retrying"


def _brief(e: BaseException) -> str:
    """Type and short message; through the default redactor, which is ours and
    cannot be what failed (the agent's own may be)."""
    return reduced(redact_secrets(f"{type(e).__name__}: {admit.describe(e)}"))


def _error_texts(e: Exception, redact: Redactor | None) -> tuple[str, str | None]:
    """(message, detail) of ``e`` as stored: cleaned and redacted."""
    texts = [admit.describe(e), "".join(traceback.format_exception(e))]
    message, detail = clean(texts, max_depth=1, redact=redact)
    return reduced(str(message), 4000), reduced(str(detail), 20_000)


def _record_error(rt: Runtime, claim: Claim, e: Exception,
                  texts: tuple[str, str | None]) -> Outcome:
    message, detail = texts
    code = e.code if isinstance(e, AgentWorkerError) else "lap_error"
    retriable = not isinstance(e, AgentWorkerError) or e.retriable
    if isinstance(e, CheckpointVersionError):
        release(rt, claim, RunUpdate(status="waiting", waiting_for=WaitingFor("attention"),
                                      error_code=code, error_message=message,
                                      error_detail=detail),
                 {"kind": "needs_attention", "error": message})
        return "paused"
    # Failing while compensating (the run is ending): retry with backoff, keeping the
    # error that ended the run; when out of attempts, stop for good instead of
    # re-queueing the ending (which would reset the attempts and loop for ever).
    run = claim.run
    ending = run.ending is not None or run.cancel_requested_at is not None
    if retriable and run.lap_attempts < rt.settings.max_lap_attempts:
        fairshare.rate_limited(rt, run.agent_name, run.agent_version, e)
        s = rt.settings
        delay = min(s.retry_backoff_seconds * 2 ** (run.lap_attempts - 1),
                    s.retry_backoff_max_seconds)
        delay *= 1 + random.random() / 4
        log.warning("run %s lap %s attempt %s failed (%s); retrying in %.1fs", run.id,
                    claim.lap, run.lap_attempts, reduced(message), delay)
        kept = ((run.error_code, run.error_message, run.error_detail) if ending
                else (code, message, detail))
        release(rt, claim, RunUpdate(
            status="queued", wake_at=rt.clock.now() + timedelta(seconds=delay),
            error_code=kept[0], error_message=kept[1], error_detail=kept[2]),
            {"kind": "retry", "attempt": run.lap_attempts, "error": message[:500]},
            fence_cancel=not ending)
        return "retrying"
    if ending:
        log.error("run %s: compensation failed for good: %s", run.id, reduced(message))
        unknown = give_up(rt, run.id, claim.owner)
        release(rt, claim, RunUpdate(
            status="failed", error_code="compensation_failed",
            error_message=f"compensation failed: {message} (the run was ending because: "
                          f"{run.error_message or run.cancel_reason})" + _naming(unknown),
            error_detail=detail),
            {"kind": "finished", "status": "failed", "error": message[:500],
             **({"unknown": unknown} if unknown else {})},
            fence_cancel=False)
        return "failed"
    log.error("run %s lap %s failed for good: %s", claim.run.id, claim.lap,
              reduced(message))
    release(rt, claim, RunUpdate(status="queued", ending="failed", enqueue=True,
                                  error_code=code, error_message=message, error_detail=detail),
             {"kind": "failing", "error": message[:500], "code": code}, reset_attempts=True)
    return "failed"


def finish_ending(rt: Runtime, agent: Agent, claim: Claim) -> Outcome:
    """Settle the ledger, undo what must be undone, then end the run as failed
    or cancelled. The run ends only with no effect ``pending`` or ``unknown``
    (``saga.reconcile``): until a human resolves an unknown one it waits on it.
    Only an ending that fails for good ends with unknown effects, named in the
    run's error and its ``finished`` event."""
    run = claim.run
    # ``ending`` is stored as text; only a lap's failure path writes it ("failed").
    ending: RunStatus = ("cancelled" if run.cancel_requested_at is not None
                         else cast("RunStatus", run.ending or "failed"))
    if run.lap_attempts > rt.settings.max_lap_attempts:
        unknown = give_up(rt, run.id, claim.owner)
        release(rt, claim, RunUpdate(
            status="failed", error_code="compensation_failed",
            error_message=f"compensation kept failing; last error: {run.error_message}"
                          + _naming(unknown),
            error_detail=run.error_detail),
            {"kind": "finished", "status": "failed", **({"unknown": unknown} if unknown else {})},
            fence_cancel=False)
        return "finished"
    children.cancel_all(rt, run)
    settled = reconcile(rt, agent, run.id, claim.owner)
    unsettled = [key for key, status in settled.items() if status == "unknown"]
    if unsettled:
        # Whether a call nobody can look up landed (and so whether to undo
        # it) is a human's decision; ending now would leave the ledger, and
        # maybe the booking, wrong. The ending resumes once `effects resolve`
        # records the verdict, one effect at a time; the event names them all.
        release(rt, claim, RunUpdate(
            status="waiting", waiting_for=WaitingFor.effect(unsettled[0]), ending=ending,
            error_code=run.error_code, error_message=run.error_message,
            error_detail=run.error_detail),
            {"kind": "effect_unknown", "key": unsettled[0], "ending": ending,
             "unknown": unsettled},
            reset_attempts=True, fence_cancel=False)
        return "paused"
    undone = compensate(rt, agent, run.id, run.tenant, claim.owner)
    release(rt, claim, RunUpdate(status=ending, ending=ending, error_code=run.error_code,
                                  error_message=run.error_message or run.cancel_reason,
                                  error_detail=run.error_detail),
             {"kind": "finished", "status": ending, "compensations": undone,
              **({"reconciled": settled} if settled else {})},
             fence_cancel=False)
    return "finished"


def _naming(unknown: list[str]) -> str:
    """The run's error's note of the effects it ends with unknown."""
    if not unknown:
        return ""
    shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10
                                        else "")
    return f"; effects of unknown outcome (check them with the vendor): {shown}"


__all__ = ["Outcome", "finish_ending", "handle_error", "release", "resend_orphan"]
