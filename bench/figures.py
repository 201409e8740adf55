"""Reading ``results.json``: the few accessors every part of the report uses
(``bench.report`` and ``bench.headline``)."""

from __future__ import annotations

import math
from typing import Any


def dig(d: Any, *path: Any) -> Any:
    """``d[path[0]][path[1]]...`` with keys as strings, or ``None`` if absent."""
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(str(p))
    return d


def med(d: Any, *path: Any) -> float | None:
    """The median of the summary at ``path`` (or the bare number there)."""
    v = dig(d, *path)
    if isinstance(v, dict):
        v = v.get("median")
    return float(v) if isinstance(v, int | float) and not math.isnan(v) else None


def sizes_of(r: dict[str, Any]) -> list[int]:
    """The run lengths the results were measured at."""
    return [int(n) for n in r["meta"]["config"]["sizes"]]


def load_text(v: Any) -> str:
    """A load-average triple as ``1.0/2.0/3.0``."""
    return "/".join(f"{x:.1f}" for x in v) if isinstance(v, list | tuple) else "?"


def cell(d: Any, *path: Any, digits: int = 2, scale: float = 1.0) -> str:
    """``median [min-max]`` of a summary, or the bare number, or a dash."""
    v = dig(d, *path)
    if isinstance(v, dict) and "median" in v:
        if not v.get("n"):
            return "-"
        m, lo, hi = (v[k] * scale for k in ("median", "min", "max"))
        if v["n"] == 1 or math.isclose(lo, hi):
            return f"{m:,.{digits}f}"
        return f"{m:,.{digits}f} [{lo:,.{digits}f}-{hi:,.{digits}f}]"
    if isinstance(v, int | float):
        return f"{v * scale:,.{digits}f}"
    return "-"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


__all__ = ["cell", "dig", "load_text", "med", "ratio", "sizes_of"]
