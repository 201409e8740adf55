"""One sweeper pass: re-send what Postgres says should be running and is not.

The beat task (``tasks.sweeper``), the public API's ``AgentWorker.sweep`` and
the in-process worker all call this, so the rule for what is due lives in the
engine beside the lap it recovers, not in the API a face calls.
"""

from __future__ import annotations

from agent_worker.runtime import QueueReader, Runtime
from agent_worker.store.queued import QueuedMessages


def sweep(rt: Runtime) -> int:
    """Recover expired leases, wake due timers, time out approvals and re-send
    lost hand-offs (``Store.sweep``), then send the laps found; returns how
    many it sent. A lap goes to its version's queue by name and a recovered
    lap keeps its admission slot, so a worker that has not registered a run's
    agent recovers it as well as one that has (only a woken run of such an
    agent, when a cap is in force, waits for a process that knows its caps).

    A hand-off is lost when its queue holds fewer messages than runs wait on
    one (``store.handoffs``): the oldest are re-sent once counted missing at
    two sweeps a heartbeat interval apart, and a backlog, however long it
    waits, is never sent twice. A dispatcher that cannot read its broker
    (``QueueReader``) falls back to age: a message nobody claims within
    ``lease_ttl_seconds`` is re-sent, backing off to
    ``queued_overdue_seconds``. Admission runs with the send, so runs waiting
    for a slot that has freed are admitted here within one sweep interval."""
    s = rt.settings
    reader = rt.dispatcher
    queued = (QueuedMessages(read=reader.queued, gone_seconds=s.heartbeat_interval_seconds)
              if isinstance(reader, QueueReader) else None)
    due = rt.store.sweep(now=rt.clock.now(), handoff_seconds=s.lease_ttl_seconds,
                         resend_max_seconds=s.queued_overdue_seconds, queued=queued)
    return rt.send_all(due, sweep=True)


__all__ = ["sweep"]
