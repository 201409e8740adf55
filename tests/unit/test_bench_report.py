"""The benchmark page reads honestly on a shared machine:
its headline is ratios against peers from the same run, paired repeat by
repeat, with their spread; every table of absolute figures carries its date
and load; the load of each phase is printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.headline import paired
from bench.report import BEGIN, render


def _system(ms: list[float], wal_min: float) -> dict[str, Any]:
    s = sorted(ms)
    return {"20": {"ms_per_lap": {"median": s[len(s) // 2], "min": s[0], "max": s[-1],
                                  "n": len(s)},
                   "ms_per_lap_samples": ms,
                   "wal_bytes_per_lap": {"median": wal_min * 2, "min": wal_min,
                                         "max": wal_min * 3, "n": len(s)},
                   "disk_bytes_per_lap": 3000.0, "row_bytes_per_lap": 2400.0}}


def _results() -> dict[str, Any]:
    return {
        "meta": {"date": "2026-12-01 02:00 UTC", "commit": "abc1234", "command":
                 "python -m bench.run --quick", "machine": {"cpu": "x", "cores": 2,
                                                            "memory": "1 kB", "kernel": "k",
                                                            "python": "3"},
                 "postgres": {}, "packages": {}, "loadavg_start": [1.0, 2.0, 3.0],
                 "loadavg_end": [4.0, 5.0, 6.0], "config": {"sizes": [20], "quick": True,
                                                            "tp_runs": 1, "tp_laps": 1,
                                                            "processes": [1],
                                                            "floor_samples": 1}},
        "errors": {},
        # In-process is twice DBOS in every repeat, though the load halves the
        # second repeat's figures for both: the paired ratio is 2.00 flat.
        "ours": _system([4.0, 2.0, 8.0], 5000), "dbos": _system([2.0, 1.0, 4.0], 3000),
        "celery": _system([12.0, 3.0, 8.0], 5000), "bare_insert": _system([1.0, 1.0, 1.0], 2000),
        "seconds": {"overhead": 12.0}, "loadavg_start": {"overhead": [7.5, 6.0, 5.0]},
        "loadavg": {"overhead": [9.5, 7.0, 5.5]},
    }


def test_ratios_pair_the_repeats() -> None:
    r = _results()
    assert paired(r, "ours", "dbos", 20) == (2.0, 2.0, 2.0)
    assert paired(r, "celery", "ours", 20) == (1.5, 1.0, 3.0)
    del r["ours"]["20"]["ms_per_lap_samples"]  # older results: the ratio of the medians
    assert paired(r, "ours", "dbos", 20) == (2.0, 2.0, 2.0)


def test_page_prints_headline_ratios_spread_and_load(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "_plot", lambda *_: None)  # matplotlib: seconds, not asserted
    doc = tmp_path / "BENCHMARKS.md"
    render(_results(), doc, tmp_path / "plot.png")
    page = doc.read_text().split(BEGIN, 1)[1]
    head = page.split("### Headline", 1)[1].split("###", 1)[0]
    assert "| ms/lap: ours in-process / DBOS steps | 2.00x |" in head
    assert "| ms/lap: ours via Celery / ours in-process | 1.50x [1.00-3.00] |" in head
    assert "| WAL/lap: ours in-process / the bare-INSERT floor (minimum over repeats) | 2.50x |" \
        in head
    stamp = ("Measured 2026-12-01 02:00 UTC on 2 cores; load average (1/5/15 min) "
             "7.5/6.0/5.0 at the phase's start, 9.5/7.0/5.5 at its end.")
    overhead = page.split("### Framework overhead per lap", 1)[1].split("###", 1)[0]
    assert stamp in head and stamp in overhead
    assert "| 20 | 4.00 [2.00-8.00] |" in overhead, "the spread beside the median"
    assert "| overhead | 12 | 7.5/6.0/5.0 | 9.5/7.0/5.5 |" in page
