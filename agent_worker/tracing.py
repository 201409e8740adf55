"""OpenTelemetry traces of laps: one span per lap attempt, with child spans
for the claim, the model call, each tool call and the commit.

Why the span ids are derived, not random: a lap runs in many processes over
its life (a SIGKILLed attempt, its replay on another worker), and a span is
exported only when it ends, so a killed attempt's lap span never leaves its
process, while its children that had ended (the claim, the model call) did.
Each attempt's lap span therefore gets the id ``hash(run, lap, attempt)``: the
next attempt, seeing ``lap_attempts > 1`` with no retry recorded for the
earlier one, emits that lost attempt's span itself (marked
``agent_worker.lap.lost``), and the orphaned children hang under it. The trace
id is the caller's (the W3C ``traceparent`` captured by ``start_run`` and
stored in the ``run_created`` event), else derived from the run id, so every
lap of a run on every worker lands in one trace.

A lap whose attempts were reset (a budget pause, an unknown effect, a
failure that starts the ending) numbers them from 1 again, so two spans of
one lap may share an id in that rare case; a lap span that ended as ``lost``
(its lease lapsed while it still ran) may also be emitted again as lost by
the next attempt. Both are cosmetic: no lap is traced as committed twice.

Off by default (``AGENT_WORKER_TRACE_EXPORT`` empty): ``lap_trace`` hands out a
shared no-op whose hooks do nothing; ``bench/tracing_overhead.py`` measures it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags

from agent_worker.core.checkpoint import PendingCall
from agent_worker.core.errors import ConfigurationError, InvalidInputError
from agent_worker.core.messages import Message, ModelResponse
from agent_worker.runtime import Runtime
from agent_worker.store.base import RunRecord
from agent_worker.store.sqlbase import SqlBase
from agent_worker.store.tracectx import lap_retries, run_traceparent
from agent_worker.tracing_export import span_processor

log = logging.getLogger("agent_worker.tracing")

T = TypeVar("T")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def check_traceparent(value: str) -> str:
    """A W3C ``traceparent`` from a caller, or ``InvalidInputError``."""
    found = _TRACEPARENT.fullmatch(value) if isinstance(value, str) else None
    if (found is None or found[1] == "ff" or set(found[2]) == {"0"}
            or set(found[3]) == {"0"}):
        raise InvalidInputError("traceparent must be a W3C trace context header: "
                                "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>")
    return value


def current_traceparent() -> str | None:
    """The caller's active span as a ``traceparent``, if it has one (through
    the OpenTelemetry API: whatever SDK the application configured)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# --- no-op hooks: what the lap engine calls when tracing is off ---------------

class StepSpan:
    """A child span's handle; the no-op base ignores everything."""

    def model_response(self, response: ModelResponse) -> None:
        """Name the model span after the model; record usage (gen_ai.*)."""

    def tool_result(self, message: Message | None) -> None:
        """Mark the tool span failed if the tool's result is an error."""


class _Same(Generic[T]):
    """A reusable context manager handing out one value: the no-op hooks
    allocate nothing per lap (a ``@contextmanager`` builds a generator)."""

    def __init__(self, value: T) -> None:
        self.value = value

    def __enter__(self) -> T:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None


_NO_STEP = StepSpan()
_NO_STEP_CM = _Same(_NO_STEP)


class LapTrace:
    """The hooks the lap engine calls; this base class is the no-op."""

    def claimed(self, run: RunRecord) -> None:
        pass

    def step(self, name: str, **attributes: Any) -> AbstractContextManager[StepSpan]:
        """A child span of the lap (the model call, the commit)."""
        return _NO_STEP_CM

    def tool_step(self, run_id: str, pc: PendingCall) -> AbstractContextManager[StepSpan]:
        """A tool call's span, with the gen_ai.* tool attributes and its effect key."""
        return _NO_STEP_CM

    def end(self, outcome: str) -> None:
        pass


NOOP = LapTrace()
_NO_LAP_CM = _Same(NOOP)
_current: ContextVar[LapTrace] = ContextVar("agent_worker_lap_trace", default=NOOP)


def current() -> LapTrace:
    """The trace of the lap running in this context (the no-op outside one)."""
    return _current.get()


def lap_trace(rt: Runtime, run_id: str, lap: int) -> AbstractContextManager[LapTrace]:
    """Trace one lap attempt; the no-op unless ``trace_export`` is set."""
    if not rt.settings.trace_export:
        return _NO_LAP_CM
    try:
        tracer = _tracer(rt.settings.trace_export)
    except ConfigurationError as e:
        # Nothing escapes run_lap: a misconfigured exporter costs the traces,
        # never the lap (logged on every lap, so it is not missed).
        log.error("lap tracing is off: %s", e)
        return _NO_LAP_CM
    return _traced(_OtelLapTrace(rt, run_id, lap, tracer))


@contextmanager
def _traced(tr: _OtelLapTrace) -> Iterator[LapTrace]:
    token = _current.set(tr)
    try:
        yield tr
    except BaseException as e:
        tr.end(f"raised {type(e).__name__}")
        raise
    finally:
        _current.reset(token)
        tr.end("ended")


# --- the real thing -----------------------------------------------------------

_forced_span: ContextVar[int | None] = ContextVar("agent_worker_span_id", default=None)
_forced_trace: ContextVar[int | None] = ContextVar("agent_worker_trace_id", default=None)


class _DerivedIds(RandomIdGenerator):
    """Random ids, except where a lap span asks for its derived ones."""

    def generate_span_id(self) -> int:
        return _forced_span.get() or super().generate_span_id()

    def generate_trace_id(self) -> int:
        return _forced_trace.get() or super().generate_trace_id()


def _derive(bits: int, *parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:bits // 8], "big") or 1


def lap_span_id(run_id: str, lap: int, attempt: int) -> int:
    """The span id of attempt ``attempt`` of lap ``lap`` (see module docstring)."""
    return _derive(64, run_id, lap, attempt)


class _OtelLapTrace(LapTrace):
    def __init__(self, rt: Runtime, run_id: str, lap: int, tracer: trace.Tracer) -> None:
        self.rt, self.run_id, self.lap, self.tracer = rt, run_id, lap, tracer
        self.started = time.time_ns()
        self.span: Span | None = None
        self.attributes: dict[str, Any] = {}
        self.db = "sqlite"

    def claimed(self, run: RunRecord) -> None:
        """Start the lap span (from before the claim) and record the claim.
        A failure here costs the lap's trace, never the lap."""
        try:
            self._claimed(run)
        except Exception as e:
            log.warning("run %s lap %s: tracing the lap failed: %s", run.id, self.lap,
                        type(e).__name__)

    def _claimed(self, run: RunRecord) -> None:
        store = self.rt.store
        engine = store.engine if isinstance(store, SqlBase) else None
        parent = run_traceparent(engine, run.id) if engine is not None else None
        self.attributes = {
            "agent_worker.run_id": run.id, "agent_worker.lap": self.lap,
            "agent_worker.agent": run.agent_name, "agent_worker.agent_version": run.agent_version,
            "agent_worker.tenant": run.tenant or "", "agent_worker.attempt": run.lap_attempts,
            "gen_ai.agent.name": run.agent_name, "gen_ai.conversation.id": run.id}
        ctx = _parent_context(parent)
        trace_token = _forced_trace.set(None if parent else _derive(128, run.id))
        try:
            if run.lap_attempts > 1 and engine is not None:
                retried = lap_retries(engine, run.id, self.lap)
                for attempt in range(1, run.lap_attempts):
                    if attempt not in retried:
                        self._lost(ctx, attempt)
            span_token = _forced_span.set(lap_span_id(run.id, self.lap, run.lap_attempts))
            try:
                self.span = self.tracer.start_span(
                    f"lap {run.agent_name}", context=ctx, start_time=self.started,
                    attributes=self.attributes)
            finally:
                _forced_span.reset(span_token)
        finally:
            _forced_trace.reset(trace_token)
        db = "postgresql" if engine is not None and engine.dialect.name == "postgresql" \
            else "sqlite"
        self.db = db
        claim = self.tracer.start_span("claim", context=trace.set_span_in_context(self.span),
                                       start_time=self.started,
                                       attributes={"db.system.name": db})
        claim.end()

    def _lost(self, ctx: Any, attempt: int) -> None:
        token = _forced_span.set(lap_span_id(self.run_id, self.lap, attempt))
        try:
            span = self.tracer.start_span(
                f"lap {self.attributes['agent_worker.agent']}", context=ctx,
                start_time=self.started,
                attributes={**self.attributes, "agent_worker.attempt": attempt,
                            "agent_worker.lap.lost": True})
        finally:
            _forced_span.reset(token)
        span.set_status(Status(StatusCode.ERROR, "attempt lost: its worker died or its "
                                                 "lease lapsed before it committed"))
        span.end(end_time=self.started)

    def step(self, name: str, **attributes: Any) -> AbstractContextManager[StepSpan]:
        if self.span is None:
            return _NO_STEP_CM
        return self._step(self.span, name, attributes)

    @contextmanager
    def _step(self, lap: Span, name: str, attributes: dict[str, Any]) -> Iterator[StepSpan]:
        with self.tracer.start_as_current_span(
                name, context=trace.set_span_in_context(lap),
                attributes=attributes, record_exception=True) as span:
            yield _OtelStep(span)

    def tool_step(self, run_id: str, pc: PendingCall) -> AbstractContextManager[StepSpan]:
        return self.step(f"execute_tool {pc.call.name}", **{
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": pc.call.name,
            "gen_ai.tool.call.id": pc.call.id,
            "agent_worker.effect_key": f"{run_id}:{pc.lap}:{pc.index}"})

    def end(self, outcome: str) -> None:
        if self.span is None:
            return
        span, self.span = self.span, None
        span.set_attribute("agent_worker.outcome", outcome)
        if outcome in ("failed", "lost") or outcome.startswith("raised"):
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()


class _OtelStep(StepSpan):
    def __init__(self, span: Span) -> None:
        self.span = span

    def model_response(self, response: ModelResponse) -> None:
        self.span.update_name(f"chat {response.model}")
        self.span.set_attributes({
            "gen_ai.request.model": response.model, "gen_ai.response.model": response.model,
            "gen_ai.usage.input_tokens": response.usage.input_tokens,
            "gen_ai.usage.output_tokens": response.usage.output_tokens,
            "gen_ai.response.finish_reasons": [str(response.stop_reason or "")]})

    def tool_result(self, message: Message | None) -> None:
        if message is not None and message.is_error:
            self.span.set_status(Status(StatusCode.ERROR, "the tool returned an error"))


def _parent_context(traceparent: str | None) -> Any:
    if traceparent is None:
        return trace.set_span_in_context(trace.INVALID_SPAN)
    found = _TRACEPARENT.fullmatch(traceparent)
    if found is None:
        return trace.set_span_in_context(trace.INVALID_SPAN)
    parent = SpanContext(int(found[2], 16), int(found[3], 16), is_remote=True,
                         trace_flags=TraceFlags(int(found[4], 16)))
    return trace.set_span_in_context(NonRecordingSpan(parent))


_lock = threading.Lock()
_tracers: dict[tuple[int, str], trace.Tracer] = {}


def _tracer(export: str) -> trace.Tracer:
    """This process's tracer for ``export``, built on first use: after the
    fork of a pool child, never before (an exporter's thread does not survive
    a fork). Not installed as the global provider: the application's own
    OpenTelemetry setup, if any, stays its own."""
    key = (os.getpid(), export)
    with _lock:
        found = _tracers.get(key)
        if found is None:
            provider = TracerProvider(resource=Resource.create({"service.name": "agent-worker"}),
                                      id_generator=_DerivedIds())
            provider.add_span_processor(span_processor(export))
            found = _tracers[key] = provider.get_tracer("agent_worker")
        return found


__all__ = ["NOOP", "LapTrace", "StepSpan", "check_traceparent",
           "current", "current_traceparent", "lap_span_id", "lap_trace"]
