"""One sweeper pass: re-send what Postgres says should be running and is not.

The beat task (``tasks.sweeper``), the public API's ``AgentWorker.sweep`` and
the in-process worker all call this, so the rule for what is due lives in the
engine beside the lap it recovers, not in the API a face calls.
"""

from __future__ import annotations

from agent_worker.runtime import Runtime


def sweep(rt: Runtime) -> int:
    """Recover expired leases, wake due timers, time out approvals and re-send
    unclaimed hand-offs (``Store.sweep``), then send the laps found; returns
    how many it sent. A lease counts as a hand-off's cover, so a message nobody
    claims within ``lease_ttl_seconds`` is re-sent, backing off to
    ``queued_overdue_seconds``. Admission runs with the send, so runs waiting
    for a slot that has freed are admitted here within one sweep interval."""
    s = rt.settings
    due = rt.store.sweep(now=rt.clock.now(), handoff_seconds=s.lease_ttl_seconds,
                         resend_max_seconds=s.queued_overdue_seconds)
    return rt.send_all(due, sweep=True)


__all__ = ["sweep"]
