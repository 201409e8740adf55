"""What this process last committed for a run, so its next lap need not read
its message window back (the claim's checkpoint and 40-message window were a
third of an in-process lap, although this process had written those rows one
lap earlier). The claim is one statement either way and returns the
checkpoint itself (``store.statements.CLAIM``); a hit spares the window read
that would follow it.

An entry is only ever *offered*; the claim decides. After this process's
fenced commit of lap ``L`` succeeds, the entry holds the checkpoint it wrote
and the message window lap ``L + 1`` reads. The next claim of the run uses it
only if the claim's own row says nothing was written since:

- ``next_lap`` is ``L + 1`` (the claim is fenced on it): only a lap commit
  advances ``next_lap`` and a lap's checkpoint is written once (its key is
  ``(run_id, lap)``), so the latest checkpoint is the one this process wrote;
  another worker's commit (a redelivered lap, a newer version migrating the
  checkpoint) moves ``next_lap`` on for good;
- the run's ``created_at`` is the same (a run deleted and created again under
  the same id is another run);
- the run's last message is the last one this process wrote: a journaled
  model output of an earlier attempt of lap ``L + 1`` (on another worker) would
  be this lap's to replay, so the claim then loads everything;
- the checkpoint carries no pending calls (their ledger rows are loaded from
  the database, always).

Anything else (a miss, a release, a pause, a lost lease, a failed commit)
drops or bypasses the entry and the claim reads the database as before.
Operators' edits are rows of their own (``store.state``) and every fact on the
run row comes from the claim itself, so neither can be stale here. Entries are
per store object (per process), bounded, and least recently used goes first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_worker.core.messages import Message
from agent_worker.store.base import StoredMessage

#: Runs remembered per store object (at least: ``runs_to_keep``). An entry
#: holds a checkpoint and a window (40 messages by default), tens of KB for
#: typical messages; a process whose laps of one run rarely land on it again
#: gains nothing from more.
DEFAULT_RUNS = 256


def runs_to_keep(laps_at_once: int) -> int:
    """Runs remembered by a process that runs ``laps_at_once`` laps at once.

    Why twice that: a lap's claim takes an entry and its commit extends it,
    so every lap in flight holds one, and each run that committed here holds
    one until its next lap comes back. The least recently used goes first
    and laps come back in about the order they left, so with fewer entries
    than that the entry of each lap is pushed out before it is used again.
    Two threads workers of 275 laps at once sharing one queue served 40% of
    their claims from 256 entries, 58% from 550 (a claim can only hit on
    the worker that committed the run's lap before it; BENCHMARKS.md, "A
    lap cache for the laps in flight")."""
    return max(DEFAULT_RUNS, 2 * laps_at_once)


@dataclass(frozen=True)
class Known:
    """A run as lap ``lap`` starts it (``owner`` set once this process claimed
    that lap; ``None`` right after this process committed the lap before)."""

    created_at: datetime
    lap: int
    owner: str | None
    window_messages: int
    state: dict[str, Any]
    window: tuple[StoredMessage, ...]


class LapCache:
    """A bounded map run id -> ``Known``, safe to share between threads."""

    def __init__(self, max_runs: int = DEFAULT_RUNS) -> None:
        self.max_runs = max_runs
        self._entries: OrderedDict[str, Known] = OrderedDict()
        self._lock = threading.Lock()

    def offer(self, run_id: str, lap: int, window_messages: int) -> Known | None:
        """The entry lap ``lap`` may start from, if this process committed the
        lap before it with the same window size and no call left pending."""
        with self._lock:
            known = self._entries.get(run_id)
        if (known is None or known.owner is not None or known.lap != lap
                or known.window_messages != window_messages
                or known.state.get("pending_calls")):
            return None
        return known

    def claimed(self, run_id: str, known: Known) -> None:
        """Remember what lap ``known.lap`` was handed, for its commit to extend."""
        if self.max_runs <= 0:
            return
        with self._lock:
            self._entries[run_id] = known
            self._entries.move_to_end(run_id)
            while len(self._entries) > self.max_runs:
                self._entries.popitem(last=False)

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._entries.pop(run_id, None)

    def committed(self, run_id: str, lap: int, owner: str, state: dict[str, Any],
                  bodies: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Lap ``lap`` committed (fenced) under ``owner``: the next lap starts
        from ``state`` and the window extended by the messages the commit
        stored (``(seq, body)``, bodies as ``store.rows.message_body`` wrote
        them). Without this process's claim of that very lap to extend,
        nothing is remembered."""
        with self._lock:
            known = self._entries.pop(run_id, None)
        if known is None or known.owner != owner or known.lap != lap:
            return
        count = int(state.get("message_count", 0))
        start, summary = max(count - known.window_messages, 0), state.get("summary_seq")
        # As the database would return them: the stored JSON form, parsed.
        fresh = [StoredMessage(seq, lap, Message.model_validate(body)) for seq, body in bodies]
        window = tuple(m for m in (*known.window, *fresh)
                       if m.seq < count and (m.seq >= start or m.seq == summary))
        self.claimed(run_id, Known(known.created_at, lap + 1, None, known.window_messages,
                                   state, window))


__all__ = ["DEFAULT_RUNS", "Known", "LapCache", "runs_to_keep"]
