"""The lap's hot-path statements, built once with bind parameters.

Building a SQLAlchemy expression costs more than sending it; these run on
every lap, so they are constructed at import and only their parameters change.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Integer,
    String,
    Text,
    bindparam,
    cast,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)

from agent_worker.store.admitting import THROTTLED
from agent_worker.store.dbtime import db_now
from agent_worker.store.models import UTCDateTime
from agent_worker.store.rows import checkpoints, messages, runs
from agent_worker.store.state import pending_clause, state_edits
from agent_worker.vocabulary import RUNNABLE

_now = bindparam("now", type_=UTCDateTime())
_owner = bindparam("owner", type_=String())
_db_now = db_now(_now)

#: Fair share (``store.admission``): a run waiting for a slot is never claimed,
#: whatever stale or duplicate message reaches a worker.
NOT_THROTTLED = or_(runs.c.admitted_lap.is_(None), runs.c.admitted_lap != THROTTLED)

#: Take the lease if the run is at this lap, runnable, due, and not leased by a
#: live worker (or by this very attempt: a retry after a lost reply re-claims);
#: return the run and the checkpoint the lap resumes from. Expiry and due time
#: are the database's (``store.dbtime``), never the claiming worker's clock.
_TAKE_LEASE = (
    update(runs)
    .where(
        runs.c.id == bindparam("run_id"),
        runs.c.next_lap == bindparam("lap"),
        runs.c.status.in_(RUNNABLE),
        or_(runs.c.lease_owner.is_(None), runs.c.lease_expires_at < _db_now,
            runs.c.lease_owner == _owner),
        or_(runs.c.wake_at.is_(None), runs.c.wake_at <= _db_now),
        NOT_THROTTLED,
    )
    .values(status="running", lease_owner=_owner,
            lease_expires_at=db_now(bindparam("expires", type_=UTCDateTime()),
                                    bindparam("lease_seconds")),
            # Only the lease, the row's last columns: a HOT update's WAL record
            # carries every byte from the first column changed to the last
            # (migration 0022_lap_columns_last). Not ``updated_at``: the lap's
            # commit sets it.
            lap_attempts=runs.c.lap_attempts + 1, wake_at=None)
)

#: The run's last message number (``store.lapcache``: whether anything was
#: written since this process's commit) and whether operators' edits wait for
#: this lap (``store.state``), so the claim reads them only when there are some.
#: By the run id parameter, not ``runs.id``: SQLite renders RETURNING's columns
#: unqualified, and ``id`` inside the subquery would be ``state_edits.id``.
_CLAIM_FACTS = (
    select(func.max(messages.c.seq)).where(messages.c.run_id == bindparam("run_id"))
    .scalar_subquery().label("last_seq"),
    exists().where(state_edits.c.run_id == bindparam("run_id"), pending_clause())
    .label("has_edits"),
)

#: Take the lease if the run is at this lap, runnable, due, and not leased by a
#: live worker (or by this very attempt: a retry after a lost reply re-claims);
#: return the run and the checkpoint the lap resumes from. Expiry and due time
#: are the database's (``store.dbtime``), never the claiming worker's clock.
CLAIM = _TAKE_LEASE.returning(
    *runs.c, *_CLAIM_FACTS,
    select(checkpoints.c.state)
    .where(checkpoints.c.run_id == runs.c.id, checkpoints.c.lap == runs.c.next_lap - 1)
    .scalar_subquery().label("checkpoint_state"),
)

#: The same claim without the checkpoint, for a lap this process may start from
#: what it committed (``store.lapcache``).
CLAIM_KNOWN = _TAKE_LEASE.returning(*runs.c, *_CLAIM_FACTS)

#: The checkpoint a lap resumes from, when a ``CLAIM_KNOWN`` found the cache stale.
CHECKPOINT = select(checkpoints.c.state).where(
    checkpoints.c.run_id == bindparam("run_id"), checkpoints.c.lap == bindparam("lap") - 1)

#: The same claim, fenced on the ``agent@version`` pins the worker serves.
_SERVED = (runs.c.agent_name + "@" + runs.c.agent_version).in_(
    bindparam("served", expanding=True))
CLAIM_SERVED = CLAIM.where(_SERVED)
CLAIM_KNOWN_SERVED = CLAIM_KNOWN.where(_SERVED)

#: The recent messages of a run, plus its compaction summary wherever it sits;
#: bodies as JSON text, parsed straight into messages by pydantic.
WINDOW = (
    select(messages.c.seq, messages.c.lap, cast(messages.c.body, Text).label("body"))
    .where(messages.c.run_id == bindparam("run_id"),
           or_(messages.c.seq >= bindparam("start"),
               messages.c.seq == bindparam("summary", type_=Integer())))
    .order_by(messages.c.seq)
)


def _journal() -> Any:
    holds_lease = select(runs.c.id).where(
        runs.c.id == bindparam("run_id"), runs.c.next_lap == bindparam("lap"),
        runs.c.lease_owner == _owner, runs.c.cancel_requested_at.is_(None)).exists()
    seq = bindparam("seq", type_=Integer())
    journaled = select(messages.c.seq).where(
        messages.c.run_id == bindparam("run_id"), messages.c.seq == seq).exists()
    source = select(
        bindparam("run_id", type_=String()), seq, bindparam("lap", type_=Integer()),
        bindparam("body", type_=messages.c.body.type), _now,
    ).where(holds_lease, ~journaled)
    return (insert(messages).from_select(["run_id", "seq", "lap", "body", "created_at"], source)
            .returning(messages.c.seq))


#: Journal a lap's model output at its sequence number, only while holding the
#: lease; nothing is returned when an earlier attempt journaled first. Not
#: ``ON CONFLICT DO NOTHING``: on Postgres that is a speculative insertion,
#: which logs a confirmation record (48 bytes of WAL) for every row it
#: inserts. An attempt that inserts between this statement's check and its
#: insert makes it fail on the primary key instead (``IntegrityError``).
JOURNAL = _journal()
