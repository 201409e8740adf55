"""The lap's hot-path statements (claim, window, journal, an effect's
intent), built once with bind parameters; the lap commit is
``store.lapcommit``'s.

Each is SQLAlchemy Core and the only SQL of its step, on Postgres and SQLite
alike: SQLAlchemy's compiled cache renders it once per process and psycopg
prepares it on the server from its sixth execution on (``prepare_threshold``).
Building a SQLAlchemy expression costs more than sending it; these run on
every lap, so they are constructed at import and only their parameters change.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    Boolean,
    ColumnElement,
    Integer,
    String,
    Text,
    any_,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from agent_worker.core.vocabulary import RUNNABLE
from agent_worker.store.admitting import THROTTLED
from agent_worker.store.dbtime import db_now
from agent_worker.store.models import UTCDateTime
from agent_worker.store.rows import checkpoints, effects, messages, runs
from agent_worker.store.runstatus import STARTED
from agent_worker.store.state import pending_clause, state_edits

_now = bindparam("now", type_=UTCDateTime())
_owner = bindparam("owner", type_=String())
_db_now = db_now(_now)

#: Fair share (``store.admission``): a run waiting for a slot is never claimed,
#: whatever stale or duplicate message reaches a worker.
NOT_THROTTLED = or_(runs.c.admitted_lap.is_(None), runs.c.admitted_lap != THROTTLED)

#: A run's ``agent@version`` pin: old code never claims a migrated run.
_PIN = runs.c.agent_name + "@" + runs.c.agent_version


def _written(values: tuple[str, ...]) -> list[Any]:
    """Constants for an ``IN`` list written into the statement's text: a list
    of values would be an expanding parameter, rendered anew on every
    execution."""
    return [literal_column(f"'{value}'") for value in values]


def _claim(served: ColumnElement[bool]) -> Any:
    """The claim, given how the pin is matched against the ``served`` pins;
    any pin when ``any_version`` is true (a caller that passes no ``served``:
    the in-process runner's tests, the store suite)."""
    return (
        update(runs)
        .where(
            runs.c.id == bindparam("run_id"),
            runs.c.next_lap == bindparam("lap"),
            runs.c.status.in_(_written(RUNNABLE)),
            or_(runs.c.lease_owner.is_(None), runs.c.lease_expires_at < _db_now,
                runs.c.lease_owner == _owner),
            or_(runs.c.wake_at.is_(None), runs.c.wake_at <= _db_now),
            NOT_THROTTLED,
            or_(bindparam("any_version", type_=Boolean()), served),
        )
        .values(status=STARTED, lease_owner=_owner,
                lease_expires_at=db_now(bindparam("expires", type_=UTCDateTime()),
                                        bindparam("lease_seconds")),
                # Only the lease, the row's last columns: a HOT update's WAL
                # record carries every byte from the first column changed to
                # the last (migration 0022_lap_columns_last). Not
                # ``updated_at``: the lap's commit sets it.
                lap_attempts=runs.c.lap_attempts + 1, wake_at=None)
        .returning(
            *runs.c,
            select(func.max(messages.c.seq)).where(messages.c.run_id == bindparam("run_id"))
            .scalar_subquery().label("last_seq"),
            exists().where(state_edits.c.run_id == bindparam("run_id"), pending_clause())
            .label("has_edits"),
            select(checkpoints.c.state)
            .where(checkpoints.c.run_id == runs.c.id, checkpoints.c.lap == runs.c.next_lap - 1)
            .scalar_subquery().label("checkpoint_state"),
        )
    )


#: The claim, the one statement every lap starts with. It takes the lease if
#: the run is at this lap, runnable, due, served and not leased by a live
#: worker (or by this very attempt: a retry after a lost reply re-claims);
#: expiry and due time are the database's (``store.dbtime``), never the
#: claiming worker's clock. It returns the run, the checkpoint the lap
#: resumes from, the run's last message number (``store.lapcache``: whether
#: anything was written since this process's commit) and whether operators'
#: edits wait for this lap (``store.state``), so the claim reads them only
#: when there are some. Those two go by the run id parameter, not
#: ``runs.id``: SQLite renders RETURNING's columns unqualified, and ``id``
#: inside the subquery would be ``state_edits.id``.
#:
#: On Postgres the served pins are one array parameter (``= ANY``): the
#: statement's text is the same however many versions a worker serves, so
#: nothing is rendered per execution (an expanding ``IN`` list is, by
#: SQLAlchemy, on every claim) and the server keeps one prepared plan.
CLAIM = _claim(any_(bindparam("served", type_=ARRAY(String()))) == _PIN)

#: The claim on SQLite, which has no arrays: the pins as an ``IN`` list.
CLAIM_SQLITE = _claim(_PIN.in_(bindparam("served", expanding=True)))

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


_effect_key = bindparam("effect_key", type_=String())

#: An effect's row, by its key.
EFFECT = select(effects).where(effects.c.key == _effect_key)

#: An effect's intent, returning the row as stored: one statement where an
#: INSERT and a read back were two. The values are the execution's parameters.
NEW_EFFECT = insert(effects).returning(*effects.c)

#: One more attempt of an effect whose outcome is pending or known not applied.
EFFECT_AGAIN = (update(effects).where(effects.c.key == _effect_key)
                .values(attempts=effects.c.attempts + 1, updated_at=_now, status="pending"))

#: An effect's outcome; it never overwrites "applied" (only compensation
#: moves past it, ``EFFECT_COMPENSATED``).
EFFECT_OUTCOME = (
    update(effects)
    .where(effects.c.key == _effect_key,
           effects.c.status.not_in(_written(("applied", "compensated"))))
    .values(status=bindparam("set_status", type_=String()),
            result=bindparam("set_result", type_=effects.c.result.type),
            error=bindparam("set_error", type_=effects.c.error.type), updated_at=_now)
)

#: An applied effect undone.
EFFECT_COMPENSATED = (update(effects).where(effects.c.key == _effect_key,
                                            effects.c.status == "applied")
                      .values(status="compensated", updated_at=_now))
