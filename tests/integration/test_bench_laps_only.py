"""``bench.scale`` times the laps alone (``InProcess(laps_only=True)``): the
in-process worker's sweeper pass at a run's end is timed by its own probe, and
spread over the run's laps it was most of what a seeded database added to a
lap (BENCHMARKS.md, goal 4). Both ways run the whole run; only the pass goes."""

from __future__ import annotations

import pytest

from bench.ours import InProcess
from bench.workload import run_id

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("laps_only", "passes"), [(True, 0), (False, 1)])
def test_laps_only_leaves_out_the_sweeper_pass_at_the_end(
        own_database_url: str, laps_only: bool, passes: int) -> None:
    system = InProcess(own_database_url, laps_only=laps_only)
    try:
        swept: list[int] = []
        sweep = system.w.sweep

        def counted() -> int:
            swept.append(1)
            return sweep()

        system.w.sweep = counted  # type: ignore[method-assign]
        assert system.run(run_id("lo", 5, 0), 5) > 0  # check_finished: all 5 laps ran
        assert len(swept) == passes
    finally:
        system.close()
