"""The parts of the generated report that make its figures readable on a shared
machine: the headline table of ratios against peers
measured in the same run, the load every phase ran under, and the date and
load stamped on each table of absolute figures.

Absolute milliseconds on this machine move with whatever else runs on it;
ratios between systems that took turns run by run (``interleaved_runs``)
mostly do not. So the headline is ratios, each paired repeat by repeat (the
i-th run of one system against the i-th run of the other, which met the same
load) with the median and the [min-max] of those paired ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from bench.figures import cell, dig, load_text, med, sizes_of

PEERS = (("langgraph_delta", "LangGraph DeltaChannel"), ("langgraph", "LangGraph PostgresSaver"),
         ("dbos", "DBOS steps"), ("bare_insert", "the bare-INSERT floor"))
"""What ours in-process is divided by in the headline, in order."""


def paired(r: dict[str, Any], a: str, b: str, n: int) -> tuple[float, float, float] | None:
    """Median, min and max of ``a``'s ms/lap over ``b``'s, repeat by repeat, at
    run length ``n``; the ratio of the medians when the repeats were not kept."""
    xs = dig(r.get(a), n, "ms_per_lap_samples")
    ys = dig(r.get(b), n, "ms_per_lap_samples")
    if isinstance(xs, list) and isinstance(ys, list) and xs and len(xs) == len(ys):
        ratios = sorted(x / y for x, y in zip(xs, ys, strict=True) if y)
        if ratios:
            return statistics.median(ratios), ratios[0], ratios[-1]
    x, y = med(r.get(a), n, "ms_per_lap"), med(r.get(b), n, "ms_per_lap")
    return (x / y, x / y, x / y) if x is not None and y else None


def _ratio_cell(got: tuple[float, float, float] | None) -> str:
    if got is None:
        return "-"
    m, lo, hi = got
    return f"{m:.2f}x" if abs(hi - lo) < 0.005 else f"{m:.2f}x [{lo:.2f}-{hi:.2f}]"


def _bytes_ratio(r: dict[str, Any], a: str, b: str, n: int, field: str,
                 pick: str = "median") -> tuple[float, float, float] | None:
    x, y = dig(r.get(a), n, field), dig(r.get(b), n, field)
    x = x.get(pick) if isinstance(x, dict) else x
    y = y.get(pick) if isinstance(y, dict) else y
    if isinstance(x, int | float) and isinstance(y, int | float) and y:
        return (x / y, x / y, x / y)
    return None


def headline(r: dict[str, Any]) -> list[str]:
    """The ratios table: ours against each peer measured in this run."""
    sizes = sizes_of(r)
    if not r.get("ours"):
        return []
    rows = [(f"ms/lap: ours in-process / {label}",
             [paired(r, "ours", key, n) for n in sizes]) for key, label in PEERS]
    rows.append(("ms/lap: ours via Celery / ours in-process",
                 [paired(r, "celery", "ours", n) for n in sizes]))
    rows.append(("WAL/lap: ours in-process / the bare-INSERT floor (minimum over repeats)",
                 [_bytes_ratio(r, "ours", "bare_insert", n, "wal_bytes_per_lap", "min")
                  for n in sizes]))
    rows += [(f"disk/lap: ours in-process / {label}",
              [_bytes_ratio(r, "ours", key, n, "disk_bytes_per_lap") for n in sizes])
             for key, label in PEERS]
    rows = [(label, cells) for label, cells in rows if any(c is not None for c in cells)]
    return ["### Headline: ratios against peers measured in the same run", "",
            "Below 1x, ours costs less. Time ratios pair the runs repeat by repeat (the "
            "systems took turns, so each pair met the same load): median [min-max] of the "
            "paired ratios. Byte ratios divide the medians (disk: one figure per batch). "
            f"{when(r, 'overhead')}", "",
            "| ratio | " + " | ".join(f"N={n}" for n in sizes) + " |",
            "|---" * (len(sizes) + 1) + "|",
            *(f"| {label} | " + " | ".join(_ratio_cell(c) for c in cells) + " |"
              for label, cells in rows), ""]


def measured_at(r: dict[str, Any], key: str) -> str:
    """When phase ``key``'s figures were measured: the last re-measurement
    that covered it, else the run's own date."""
    for u in reversed(r["meta"].get("updates", [])):
        covered = u.get("measured", [])
        if key in covered or (key == "overhead" and "ours" in covered):
            return str(u["date"])
    return str(r["meta"]["date"])


def when(r: dict[str, Any], key: str) -> str:
    """The stamp for a table of absolute figures from phase ``key``."""
    start, end = dig(r, "loadavg_start", key), dig(r, "loadavg", key)
    cores = r["meta"]["machine"].get("cores", "?")
    if start is None and end is None:
        return f"Measured {measured_at(r, key)} on {cores} cores (load not recorded)."
    return (f"Measured {measured_at(r, key)} on {cores} cores; load average (1/5/15 min) "
            f"{load_text(start)} at the phase's start, {load_text(end)} at its end.")


def load_table(r: dict[str, Any]) -> list[str]:
    """Each phase's duration and the load at its start and end."""
    seconds = r.get("seconds") or {}
    if not seconds:
        return []
    m = r["meta"]
    lines = ["### Load while measuring", "",
             f"{m['machine'].get('cores', '?')} cores. The load average is the machine's "
             "(1, 5 and 15 minutes), other users' work included; a figure measured at a "
             "load well above the core count is the machine's, not the system's.", "",
             "| phase | seconds | load at start | load at end |", "|---|---|---|---|"]
    lines += [f"| {k} | {v:.0f} | {load_text(dig(r, 'loadavg_start', k))} | "
              f"{load_text(dig(r, 'loadavg', k))} |" for k, v in seconds.items()]
    return [*lines, ""]


def wal_table(r: dict[str, Any], systems: Iterable[tuple[str, str]]) -> list[str]:
    """WAL bytes per lap of each of ``systems`` (key, label): median [min-max]
    over the repeats."""
    shown = [(k, label) for k, label in systems if dig(r.get(k), sizes_of(r)[0],
                                                        "wal_bytes_per_lap")]
    if not shown:
        return []
    lines = ["### WAL written per lap (bytes)", "",
             "The advance of the server's WAL insert position over each run, divided by N: "
             "what a standby or an archive receives per lap. The server is shared, so other "
             "sessions can only add to a figure; the minimum is the closest to the system's "
             f"own. {when(r, 'overhead')}", "",
             "| N | " + " | ".join(label for _, label in shown) + " |",
             "|---" * (len(shown) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(cell(r.get(k), n, "wal_bytes_per_lap", digits=0)
                                       for k, _ in shown) + " |" for n in sizes_of(r)]
    return [*lines, ""]


__all__ = ["PEERS", "headline", "load_table", "measured_at", "paired", "wal_table", "when"]
