"""``bench.capacity`` names, per model latency, the most runs a machine kept at
the target share of the ideal lap rate: by the median of the passes, and
only as far as every smaller count kept it too."""

from __future__ import annotations

from bench.capacity import capacity, table


def test_the_most_runs_at_the_target_by_the_median_of_the_passes() -> None:
    ratios = {(200, 1.0): [0.85, 0.90], (300, 1.0): [0.78, 0.81, 0.82],
              (400, 1.0): [0.72, 0.73], (500, 2.0): [0.84, 0.83], (800, 2.0): [0.71, 0.76]}
    assert capacity(ratios, 0.8) == {1.0: 300, 2.0: 500}
    assert capacity(ratios, 0.7) == {1.0: 400, 2.0: 800}


def test_a_count_that_passes_above_a_failing_one_is_not_capacity() -> None:
    ratios = {(200, 1.0): [0.79], (300, 1.0): [0.83], (100, 2.0): [0.5]}
    assert capacity(ratios, 0.8) == {1.0: None, 2.0: None}


def test_the_table_has_a_row_per_point_with_medians_and_ranges() -> None:
    def result(ratio: float) -> dict[str, float]:
        return {"ratio": ratio, "steady_ratio": ratio + 0.1, "machine_cpu_ms_per_lap": 5.0,
                "machine_busy": 0.8, "kb_per_inflight_lap": 280.4}

    rows = table({(500, 2.0): [result(0.84), result(0.82)], (300, 1.0): [result(0.8)]})
    assert len(rows) == 4
    assert rows[2].startswith("| 300 | 1 s | 300 | 0.80 (0.80-0.80) | 0.90 (0.90-0.90) |")
    assert rows[3].startswith("| 500 | 2 s | 250 | 0.83 (0.82-0.84) |")
    assert rows[3].endswith("| 280 (280-280) |")
