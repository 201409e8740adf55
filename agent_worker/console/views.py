"""Shapes and template filters of the console: paging, the lap timeline, and
how values become text.

Everything a model, a tool or a caller wrote goes through ``shown`` or
``as_json`` before a template sees it: clipped (a 1 MB tool result must not
make a page of 1 MB) and passed through ``redact_secrets`` (defence in depth:
the engine redacts tool output before storing it, but arguments and inputs
come from callers). Escaping is the template engine's (autoescape is on for
every template), so none of this produces markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Generic, TypeVar

from agent_worker.cli.common import span
from agent_worker.cli.views import LapBook
from agent_worker.core.redaction import redact_secrets
from agent_worker.store.base import EffectRecord, EventRecord, StoredMessage

T = TypeVar("T")
#: Longest text a cell shows; the rest is cut with an ellipsis.
SHOWN_CHARS = 2000


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """Text for a page: clipped, secrets masked."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return redact_secrets(text)


def as_json(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A value as indented JSON text for a page (clipped, secrets masked)."""
    return shown(json.dumps(value, indent=2, ensure_ascii=False, default=str,
                            sort_keys=True), limit)


def brief(data: dict[str, Any] | None, limit: int = 300) -> str:
    """An event's data on one line, without the lap's trace (the timeline shows it)."""
    if not data:
        return ""
    shown_data = {k: v for k, v in data.items() if k not in ("trace", "messages")}
    return shown(json.dumps(shown_data, ensure_ascii=False, default=str,
                            separators=(", ", ": ")), limit)


def when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: datetime | None) -> str:
    """``3m ago`` / ``in 5m`` (the CLI's spans): for ages and timeouts."""
    if value is None:
        return ""
    delta = datetime.now(UTC) - value
    text = span(abs(delta))
    return f"{text} ago" if delta.total_seconds() >= 0 else f"in {text}"


def money(amount: Decimal | str | float | int, currency: str) -> str:
    """``1.25 USD``; below 1, up to four decimals (model calls cost fractions
    of a cent: ``0.0042 USD``), at least two; ``<0.0001 USD`` for less."""
    value = Decimal(str(amount))
    if value == 0:
        return f"0.00 {currency}"
    if abs(value) >= 1:
        text = f"{value.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    elif abs(value) < Decimal("0.0001"):
        text = "<0.0001" if value > 0 else "-<0.0001"
    else:
        text = f"{value.quantize(Decimal('0.0001'), ROUND_HALF_UP):f}".rstrip("0")
        text += "0" * max(0, 2 - len(text.partition(".")[2]))
    return f"{text} {currency}"


def duration(seconds: float) -> str:
    """``45s``, ``2m 05s``, ``3h 20m``, ``2d 4h``: a wall-clock span to the
    second below an hour."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


FILTERS: dict[str, Callable[..., str]] = {"shown": shown, "as_json": as_json, "when": when,
                                         "ago": ago, "brief": brief}


@dataclass(frozen=True)
class Pager(Generic[T]):
    """One page of a long list, newest first; ``page`` counts from 1."""

    items: list[T]
    page: int
    pages: int
    total: int
    param: str

    @classmethod
    def of(cls, items: Sequence[T], query: Any, param: str, size: int) -> Pager[T]:
        """Page ``query[param]`` of ``items`` (oldest first in), newest first out."""
        total = len(items)
        page = page_number(query, param, total, size)
        end = total - (page - 1) * size
        chunk = list(items[max(0, end - size):end])
        chunk.reverse()
        return cls(chunk, page, pages(total, size), total, param)


def pages(total: int, size: int) -> int:
    return max(1, -(-total // size))


def page_number(query: Any, param: str, total: int, size: int) -> int:
    """The page ``query[param]`` asks for, within 1..pages (1 if not a number)."""
    raw = query.get(param) or "1"
    return min(max(int(raw), 1), pages(total, size)) if raw.isdigit() else 1


def lap_rows(run_id: str, events: Sequence[EventRecord], messages: Sequence[StoredMessage],
             effects: Sequence[EffectRecord]) -> list[dict[str, Any]]:
    """One row per lap committed in ``events``, newest first: what the model
    said and asked, what each tool returned, and where the time went (model,
    tools, commit). ``messages`` are those laps' messages."""
    book = LapBook(run_id)
    book.add_messages(messages)
    book.add_effects(effects)
    rows = []
    for event in events:
        if event.kind != "lap_committed":
            continue
        lap = book.lap(event)
        lap["durations"] = durations(lap["trace"])
        rows.append(lap)
    rows.reverse()
    return rows


def durations(trace: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Milliseconds in the model, the tools and up to the commit, from the
    lap's trace (each mark holds the milliseconds since the lap started; the
    commit's own statement is timed by the tracing spans, not here)."""
    def at(step: str) -> float | None:
        mark = next((t for t in reversed(trace) if t.get("step") == step), None)
        return None if mark is None else float(mark["ms"])

    model, tool, commit = at("model"), at("tool"), at("commit")
    before_commit = tool if tool is not None else model
    return {"model": model,
            "tools": None if tool is None else round(tool - (model or 0.0), 2),
            "commit": None if commit is None else round(commit - (before_commit or 0.0), 2),
            "total": float(trace[-1]["ms"]) if trace else None}


__all__ = ["FILTERS", "Pager", "ago", "as_json", "brief", "duration", "durations", "lap_rows",
           "money", "page_number", "pages", "shown", "when"]
