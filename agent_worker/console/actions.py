"""Actions on a run: a confirmation page that says what each will do to the
world, then the POST that does it through the API acting as the visitor.

The buttons are shown only for verbs the authorizer allows (``run.allowed_
actions``) and that can apply to the run as it stands (``console.applicable``;
the confirmation page refuses an inapplicable one with the 409 page), but
nothing here relies on that: the POST goes straight to the API, which checks
the role (403 page, audit entry) and, under the run's row lock, the status: a
run that finished between the confirmation and the POST is refused there
(409 page), whatever the form said.
"""

from __future__ import annotations

from starlette.responses import RedirectResponse, Response

from agent_worker.console.applicable import require_applicable, waited_effect
from agent_worker.console.context import Ctx, form_json
from agent_worker.console.run import RUN_VERBS
from agent_worker.core.authorization import Action
from agent_worker.core.errors import InvalidInputError, NotFoundError
from agent_worker.store.base import EffectRecord, RunRecord


def _verb(ctx: Ctx) -> Action:
    verb = str(ctx.request.path_params["verb"])
    found = next((v for v in RUN_VERBS if v == verb), None)
    if found is None:
        raise NotFoundError(f"unknown action {verb[:40]!r}")
    return found


def consequences(verb: str, run: RunRecord, effects: list[EffectRecord]) -> list[str]:
    """What ``verb`` will do to the world, in sentences, for the confirmation page."""
    undo = [e for e in effects if e.kind == "compensatable" and e.status == "applied"]
    kept = [e for e in effects if e.kind == "irreversible" and e.status == "applied"]
    if verb == "cancel":
        lines = ["The run stops at its next lap boundary; a lap in flight finishes first."]
        lines.append(f"{len(undo)} applied compensatable effect(s) will be undone, newest "
                     f"first: {', '.join(e.key + ' ' + e.tool_name for e in undo)}."
                     if undo else "No applied effect will be undone (none is compensatable).")
        if kept:
            lines.append(f"{len(kept)} irreversible effect(s) already applied stay applied.")
        return lines
    if verb == "signal":
        return ["The signal is stored durably and delivered into one lap; a run waiting "
                "for this name resumes, the model sees the payload.",
                "Nothing outside runs until the model acts on it."]
    if verb == "retry":
        return [f"The run resumes from its last checkpoint (lap {run.lap}) and replays lap "
                f"{run.next_lap}.",
                "Effects already applied are reused from the ledger, not sent again; calls "
                "that never landed are made (idempotent ones with the same key)."]
    if verb == "fork":
        return ["A new run starts from this run's state after the lap you choose; this run "
                "is untouched.",
                "The new run's tool calls get new keys: what it does from there acts on the "
                "world again (a refund in the new run is a new refund)."]
    if verb == "raise_budget":
        return [f"The run's limits become the ones you give (blank: unchanged); it paused "
                f"because {run.error_message or 'it reached its budget'}.",
                "The run resumes from its last checkpoint and may spend up to the new "
                "limits: more model calls, more tokens, more cost.",
                "The change is recorded in the audit log with your name."]
    return ["You record whether an effect of unknown outcome landed.",
            "Applied: the run continues with the result you give, the tool is not called "
            "again. Not applied: the run calls the tool again with the same key."]


#: The limits the raise form sends, each a number (blank: unchanged).
LIMIT_FIELDS = ("max_laps", "max_input_tokens", "max_output_tokens", "max_cost",
                "max_wall_seconds")


def limits_of(form: dict[str, str]) -> dict[str, str]:
    """The limits a raise form gives; the API's ``Budget`` validates each
    (a word or a negative number is its 400)."""
    given = {k: (form.get(k) or "").strip() for k in LIMIT_FIELDS}
    limits = {k: v for k, v in given.items() if v}
    if not limits:
        raise InvalidInputError("give at least one new limit")
    return limits


def confirm(ctx: Ctx) -> Response:
    verb = _verb(ctx)
    run = ctx.aw.get_run(ctx.request.path_params["run_id"])
    require_applicable(verb, run)
    effects = ctx.aw.effects(run.id)
    # The one effect the API will take a verdict on: the one the run waits on.
    waited = waited_effect(run)
    return ctx.render("confirm.html", verb=verb, run=run,
                      consequences=consequences(verb, run, effects),
                      unknown=[e for e in effects if e.key == waited],
                      selected=ctx.query.get("key") or "",
                      currency=ctx.console.settings.console_currency)


def act(ctx: Ctx) -> Response:
    verb = _verb(ctx)
    aw, f = ctx.aw, ctx.form
    run_id = ctx.request.path_params["run_id"]
    target = run_id
    if verb == "cancel":
        aw.cancel(run_id, reason=(f.get("reason") or "").strip() or "cancelled from the console")
    elif verb == "signal":
        aw.send_signal(run_id, (f.get("name") or "").strip(),
                       form_json(f.get("payload"), "payload"))
    elif verb == "retry":
        aw.retry(run_id)
    elif verb == "fork":
        lap = (f.get("lap") or "").strip()
        if not lap.isdigit():
            raise InvalidInputError("lap must be a whole number")
        target = aw.fork(run_id, int(lap), new_run_id=(f.get("new_run_id") or "").strip()
                         or None).id
    elif verb == "raise_budget":
        aw.raise_budget(run_id, **limits_of(f))
    else:
        key = (f.get("key") or "").strip()
        if not key.startswith(f"{run_id}:"):
            raise NotFoundError(f"unknown effect {key[:80]!r} of run {run_id}")
        if f.get("applied") not in ("yes", "no"):
            raise InvalidInputError("say whether the effect landed (applied yes or no)")
        aw.resolve_effect(key, applied=f.get("applied") == "yes",
                          result=form_json(f.get("result"), "result"))
    return RedirectResponse(f"/runs/{target}?done={verb}", status_code=303)


__all__ = ["LIMIT_FIELDS", "act", "confirm", "consequences", "limits_of"]
