"""``bench.iobound`` tells Postgres's and Redis's CPU apart from the rest of
the machine's: two readings of the processes by name, and what each name's
processes spent between them, a process started in between counting whole."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.fleets import cpu_by_name, cpu_since


def test_a_reading_finds_this_process_by_its_name_with_its_cpu() -> None:
    name = Path("/proc/self/comm").read_text().strip()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # some CPU of our own to find
        pass
    found = cpu_by_name((name,))
    assert found[os.getpid()][0] == name
    assert found[os.getpid()][1] >= 0.05
    assert cpu_by_name(("no-such-process-name",)) == {}


def test_spent_is_by_name_and_a_new_process_counts_whole() -> None:
    before = {10: ("postgres", 1.0), 11: ("postgres", 2.0), 20: ("redis-server", 5.0)}
    after = {10: ("postgres", 1.5), 11: ("postgres", 2.25), 12: ("postgres", 0.5),
             20: ("redis-server", 5.125)}
    assert cpu_since(before, after) == {"postgres": 1.25, "redis-server": 0.125}


def test_a_reused_pid_of_another_name_counts_from_zero() -> None:
    # pid 10 was a backend, then ended; a Redis server took its number.
    assert cpu_since({10: ("postgres", 7.0)}, {10: ("redis-server", 0.5)}) == {
        "redis-server": 0.5}
