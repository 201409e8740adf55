"""A run's timeline: one row per lap of the page's window, the time in the
model, each tool call and the commit, and the gap before the lap labelled
by its cause.

Everything comes from what the store records already; nothing is recorded
for the timeline's sake but one event kind (``admitted``, a lap that waited
for a fair-share slot, ``store.admitting``):

- a lap's own time is its ``lap_committed`` event: committed at its time,
  its trace holding each step's milliseconds since the lap started, so the
  lap started at the commit's time less the trace's last mark;
- a gap starts at the previous commit (or the run's creation) and ends when
  the lap's successful attempt started. Its cause follows the events in
  between, in order (``GapCause``): the previous lap's commit paused the run
  (waiting, sleeping); ``woken`` says what arrived (an approval, a signal, the
  children, a timer); ``recovered`` is the sweeper taking a run whose lease
  expired (its worker died mid-lap); ``retry`` an attempt that failed, the
  backoff after it; ``admitted`` the end of a wait for a slot; what is left
  is the time a lap's message waited for a worker (queued).

Bars are drawn on a logarithmic length scale: a gap of an hour beside a lap
of 40 ms stays readable, and each row says its exact durations. The window
is the laps pager's (50 laps a page), so a 500-lap run draws one page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent_worker.console.views import duration
from agent_worker.core.vocabulary import TERMINAL, WaitingFor
from agent_worker.store.admitting import THROTTLED
from agent_worker.store.base import EventRecord, RunRecord
from agent_worker.store.runpanels import GapEvents

#: What each cause reads as on the page.
LABELS: dict[str, str] = {
    "queued": "queued", "approval": "waiting for approval", "signal": "waiting for a signal",
    "timer": "waiting for a timer", "children": "waiting for child runs",
    "budget": "paused on its budget", "effect": "waiting for a verdict on an effect",
    "attention": "needs attention", "recovered": "lease expired, recovered",
    "failed": "attempt failed", "backoff": "retry backoff",
    "throttled": "throttled by fair share", "waiting": "waiting", "running": "lap in flight"}
#: The bar colours (SVG presentation attributes: the console's policy forbids
#: inline styles, not these).
COLOURS: dict[str, str] = {
    "queued": "#c9ced6", "approval": "#e0a030", "signal": "#d9c040", "timer": "#9fb4d9",
    "children": "#7fb8a8", "budget": "#d98060", "effect": "#d9607a", "attention": "#c04050",
    "recovered": "#b03030", "failed": "#e06060", "backoff": "#f0a0a0", "throttled": "#a070c0",
    "waiting": "#e0c080", "running": "#60a060",
    "model": "#3f6fb5", "replayed": "#9db5da", "tool": "#2f9e6a", "tool-error": "#c03535",
    "commit": "#555555"}
#: What a run's wait or status says the trailing gap is.
_WAIT_CAUSE = {"approval": "approval", "signal": "signal", "effect": "effect",
               "attention": "attention", "budget": "budget", "children": "children"}

ROW_HEIGHT = 20
LABEL_WIDTH = 64
#: Pixels per tenfold of time: 1 ms is a sliver, 1 s about 80 px, an hour 220.
PX_PER_DECADE = 40.0


def span_px(ms: float) -> float:
    """A bar's length for ``ms`` milliseconds (logarithmic; at least 2 px)."""
    return max(2.0, round(PX_PER_DECADE * math.log10(1 + max(ms, 0.0) / 10), 1))


@dataclass(frozen=True)
class Segment:
    """A stretch of a gap with one cause."""

    cause: str
    start: datetime
    end: datetime

    @property
    def ms(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds() * 1000)


@dataclass
class GapCause:
    """Walks the events of one gap in order, closing a segment at each event
    that changes why the run is not running a lap."""

    state: str
    at: datetime
    segments: list[Segment] = field(default_factory=list)

    def close(self, cause: str, at: datetime, then: str) -> None:
        at = max(at, self.at)
        self.segments.append(Segment(cause, self.at, at))
        self.state, self.at = then, at

    def see(self, e: EventRecord) -> None:
        data, kind, at = e.data or {}, e.kind, e.created_at
        if kind == "woken":
            arrived = str(data.get("arrived") or "")
            wait = arrived.partition(":")[0]
            if self.state == "queued":  # a decision already woke it (its own event)
                self.close("queued", at, "queued")
            else:
                self.close(_WAIT_CAUSE.get(wait, "timer" if not arrived else self.state), at,
                           "queued")
        elif kind in ("approval_decided", "approval_timed_out"):
            self.close("approval" if self.state in ("waiting", "approval") else self.state,
                       at, "queued")
        elif kind == "signal_received" and self.state in ("waiting", "signal"):
            self.close("signal", at, "queued")
        elif kind == "recovered":
            self.close("recovered", at, "queued")
        elif kind == "retry":
            self.close("failed", at, "backoff")
        elif kind == "admitted":
            self.close("throttled", at, "queued")
        elif kind == "budget_pause":
            self.close(self.state, at, "budget")
        elif kind == "effect_unknown":
            self.close(self.state, at, "effect")
        elif kind == "needs_attention":
            self.close(self.state, at, "attention")
        elif kind in ("budget_raised", "effect_resolved", "retried", "requeued"):
            self.close(self.state, at, "queued")

    def end(self, at: datetime) -> list[Segment]:
        self.close(self.state, at, self.state)
        # An instant of queueing says nothing; an instant's retry or recovery does.
        kept = [s for s in self.segments if s.ms > 0 or s.cause != "queued"]
        return kept or self.segments[-1:]


def _paused_state(commit: EventRecord | None) -> str:
    paused = (commit.data or {}).get("paused") if commit is not None else None
    return {"sleeping": "timer", "waiting": "waiting"}.get(str(paused), "queued")


def main_cause(segments: Sequence[Segment]) -> str:
    """The cause a gap is labelled by: its longest stretch that is not plain
    queueing (a recovery or a wait is the news), else ``queued``."""
    notable = [s for s in segments if s.cause != "queued"]
    return max(notable, key=lambda s: s.ms).cause if notable else "queued"


def _trace(commit: EventRecord | None) -> list[dict[str, Any]]:
    return list(((commit.data or {}).get("trace") or []) if commit is not None else [])


def lap_ms(commit: EventRecord | None) -> float:
    """The lap's milliseconds up to its commit: the trace's last mark, taken
    just before the commit's own statement (0 without a trace)."""
    trace = _trace(commit)
    return float(trace[-1]["ms"]) if trace else 0.0


def lap_start(commit: EventRecord) -> datetime:
    """When the lap's committing attempt started: its commit's time less ``lap_ms``."""
    return commit.created_at - timedelta(milliseconds=lap_ms(commit))


def _bars(commit: EventRecord) -> list[dict[str, Any]]:
    """The lap's model, tool and commit bars, as fractions of the lap's time."""
    trace, total = _trace(commit), lap_ms(commit)
    if total <= 0:
        return []
    bars: list[dict[str, Any]] = []
    done = 0.0
    tool_n = 0
    for mark in trace:
        at = float(mark["ms"])
        step = mark.get("step")
        if step == "model":
            bars.append(_bar("replayed" if mark.get("replayed") else "model", 0.0, at, total,
                             "model (replayed from the journal)" if mark.get("replayed")
                             else "model"))
        elif step == "tool":
            took = float(mark.get("call_ms", at - done))
            bars.append(_bar("tool-error" if mark.get("error") else "tool",
                             max(0.0, at - took), took, total, str(mark.get("name") or "tool"),
                             lane=tool_n % 2))
            tool_n += 1
        elif step == "commit":
            bars.append(_bar("commit", done, at - done, total, "commit"))
        done = at
    return bars


def _bar(kind: str, start: float, ms: float, total: float, name: str,
         lane: int | None = None) -> dict[str, Any]:
    return {"kind": kind, "from": start / total, "part": max(ms, 0.0) / total,
            "ms": round(ms, 1), "name": name, "colour": COLOURS[kind], "lane": lane}


@dataclass(frozen=True)
class Row:
    """One lap's row: the gap before it, then the lap."""

    lap: int
    attempt: int
    gap: list[Segment]
    cause: str
    start: datetime
    commit: EventRecord | None
    bars: list[dict[str, Any]]

    @property
    def gap_ms(self) -> float:
        return sum(s.ms for s in self.gap)

    @property
    def lap_ms(self) -> float:
        return lap_ms(self.commit)


def rows(run: RunRecord, commits: Sequence[EventRecord], gaps: GapEvents,
         now: datetime) -> list[Row]:
    """The window's rows, oldest first, and a last row for the gap the run is
    in now when the window ends at its latest lap and it has not finished."""
    ordered = sorted((c for c in commits if c.lap is not None), key=lambda c: c.lap or 0)
    pending = list(gaps.events)
    previous = gaps.before
    out: list[Row] = []
    for commit in ordered:
        start = lap_start(commit)
        begin = previous.created_at if previous is not None else run.created_at
        segments = _walk(previous, begin, [e for e in pending
                                           if e.created_at <= commit.created_at], start)
        pending = [e for e in pending if e.created_at > commit.created_at]
        out.append(Row(commit.lap or 0, int((commit.data or {}).get("attempt") or 1), segments,
                       main_cause(segments), start, commit, _bars(commit)))
        previous = commit
    if run.status not in TERMINAL and (not ordered or (ordered[-1].lap or 0) == run.lap):
        begin = previous.created_at if previous is not None else run.created_at
        segments = _walk(previous, begin, pending, max(now, begin), final=_now_state(run))
        out.append(Row(run.next_lap, run.lap_attempts, segments, main_cause(segments),
                       max(now, begin), None, []))
    return out


def _walk(previous: EventRecord | None, begin: datetime, seen: Sequence[EventRecord],
          until: datetime, final: str | None = None) -> list[Segment]:
    walker = GapCause(_paused_state(previous), begin)
    for e in seen:
        walker.see(e)
    if final is not None and not (final == "queued" and walker.state == "backoff"):
        walker.state = final  # what the run row says now outranks an older pause
    return walker.end(until)


def _now_state(run: RunRecord) -> str:
    """What the run does now, for the gap it is in."""
    if run.status == "running":
        return "running"
    if run.status == "sleeping":
        return "timer"
    if run.status == "waiting" and run.waiting_for:
        try:
            return _WAIT_CAUSE.get(WaitingFor.parse(run.waiting_for).kind, "waiting")
        except ValueError:
            return "waiting"
    if run.status == "queued" and run.admitted_lap == THROTTLED:
        return "throttled"
    return "queued"


def picture(run: RunRecord, commits: Sequence[EventRecord], gaps: GapEvents,
            now: datetime) -> dict[str, Any]:
    """The SVG's geometry and the rows' words, newest lap first (as the
    laps table below it)."""
    drawn: list[dict[str, Any]] = []
    width = 0.0
    for i, row in enumerate(reversed(rows(run, commits, gaps, now))):
        gap_w = span_px(row.gap_ms)
        lap_w = span_px(row.lap_ms) if row.commit is not None else 0.0
        x, parts = float(LABEL_WIDTH), list[dict[str, Any]]()
        total = row.gap_ms or 1.0
        for s in row.gap:
            w = gap_w * (s.ms / total if row.gap_ms else 1.0 / len(row.gap))
            parts.append({"x": round(x, 1), "w": round(max(w, 0.5), 1),
                          "colour": COLOURS[s.cause], "cause": s.cause,
                          "label": LABELS[s.cause], "took": took(s.ms)})
            x += w
        lap_x = LABEL_WIDTH + gap_w + 2
        bars = [{**b, "x": round(lap_x + b["from"] * lap_w, 1),
                 "w": round(max(b["part"] * lap_w, 1.0), 1)} for b in row.bars]
        text = (f"{took(row.gap_ms)} {LABELS[row.cause]}"
                + (f" · lap {took(row.lap_ms)}" if row.commit is not None else ""))
        if row.attempt > 1:
            text += f" · attempt {row.attempt}"
        width = max(width, lap_x + lap_w + 8 + 7.2 * len(text))
        drawn.append({"lap": row.lap, "y": i * ROW_HEIGHT, "gap": parts, "bars": bars,
                      "cause": row.cause, "label": LABELS[row.cause], "text": text,
                      "text_x": round(lap_x + lap_w + 6, 1), "committed": row.commit is not None,
                      "attempt": row.attempt})
    used = sorted({p["cause"] for r in drawn for p in r["gap"]}
                  | {b["kind"] for r in drawn for b in r["bars"]})
    return {"rows": drawn, "height": len(drawn) * ROW_HEIGHT, "width": round(width, 1),
            "row_height": ROW_HEIGHT, "legend": [
                {"key": k, "colour": COLOURS[k], "label": LABELS.get(k, _BAR_NAMES.get(k, k))}
                for k in used]}


_BAR_NAMES = {"model": "model", "replayed": "model, replayed", "tool": "tool call",
              "tool-error": "tool call, error", "commit": "commit"}


def took(ms: float) -> str:
    """``85 ms``, ``1.2 s``, then the console's wall-clock spans."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return duration(ms / 1000)


__all__ = ["COLOURS", "LABELS", "GapCause", "Row", "Segment", "lap_ms", "lap_start",
           "main_cause", "picture", "rows", "span_px", "took"]
