"""Renew the leases of every lap a worker process holds in one statement.

Why: the heartbeat renews each lap in flight that has run longer than the
heartbeat interval. A ``threads`` worker holds hundreds of laps, and when the
machine is busy they all run past the interval together: one transaction per
lap per interval (a connection checkout, an UPDATE, a commit) was a cost that
grew with the very load that caused it. One UPDATE of all of them per
interval costs the same round trip whatever their number.

The fence is the single renewal's, row by row: a lease is extended only where
the run is still at that lap and held by that lap attempt's owner (owners are
unique per attempt), so a lap that lost its run to the sweeper is reported
``lost`` and extends nothing, and a cancelled run is reported ``cancelled``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import Connection, tuple_, update

from agent_worker.store.dbtime import db_time
from agent_worker.store.rows import runs
from agent_worker.store.sqlbase import SqlBase

LeaseState = Literal["ok", "lost", "cancelled"]

#: Leases per statement: bounds the statement's size (three binds a lease).
CHUNK = 500


class SqlLeaseBatch(SqlBase):
    """``renew_leases`` for ``SqlStore``."""

    def renew_leases(
        self, leases: Sequence[tuple[str, int, str]], *, now: datetime, lease_seconds: float
    ) -> dict[str, LeaseState]:
        """Extend each ``(run_id, lap, owner)`` lease still held; the state of
        each lap by its owner, as ``renew_lease`` would say it one by one."""
        out: dict[str, LeaseState] = {owner: "lost" for _, _, owner in leases}
        for start in range(0, len(leases), CHUNK):
            chunk = list(leases[start:start + CHUNK])

            def tx(conn: Connection, chunk: list[tuple[str, int, str]] = chunk) -> None:
                rows = conn.execute(
                    update(runs)
                    .where(tuple_(runs.c.id, runs.c.next_lap, runs.c.lease_owner).in_(chunk))
                    .values(lease_expires_at=db_time(now + timedelta(seconds=lease_seconds),
                                                     lease_seconds))
                    .returning(runs.c.lease_owner, runs.c.cancel_requested_at)
                ).all()
                for row in rows:
                    out[row.lease_owner] = "ok" if row.cancel_requested_at is None else "cancelled"

            self._tx(tx)
        return out
