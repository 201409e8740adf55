"""``bench.io_sidebyside`` pairs each round's two runs: the gap is ours minus
the baseline's, its median and range over the rounds, and how many rounds
ours was higher in."""

from __future__ import annotations

from bench.io_sidebyside import paired


def test_gaps_are_taken_round_by_round_not_between_medians() -> None:
    baseline = [{"ratio": 0.60}, {"ratio": 0.70}, {"ratio": 0.50}]
    ours = [{"ratio": 0.62}, {"ratio": 0.71}, {"ratio": 0.47}]
    assert paired(baseline, ours, "ratio") == "+0.01 [-0.03 to +0.02], 2 of 3"
