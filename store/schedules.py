"""The SQL side of durable schedules (``store.schedtypes``): a mixin of
``SqlStore``. Each public method owns one transaction (``store.sqlbase``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from agent_worker.core.errors import InvalidStateError, ScheduleExistsError, UnknownScheduleError
from agent_worker.core.vocabulary import TERMINAL
from agent_worker.store.base import DueLap
from agent_worker.store.dbtime import db_time
from agent_worker.store.models import ScheduleRow
from agent_worker.store.pauses import request_cancel
from agent_worker.store.rows import record_event_tx, runs
from agent_worker.store.runinsert import create_run_tx
from agent_worker.store.schedtypes import Fire, Firing, ScheduleRecord
from agent_worker.store.sqlbase import SqlBase

schedules = cast(Table, ScheduleRow.__table__)


class _ClaimLost(Exception):
    """Internal: the fenced advance found the fire time moved; the transaction
    rolls back (nothing it started stays) and the pass reports no firing."""


def _to_schedule(row: Row[Any]) -> ScheduleRecord:
    return ScheduleRecord(**dict(row._mapping))


class SqlScheduleStore(SqlBase):
    """``ScheduleStore`` over the same engine as the rest of ``SqlStore``."""

    def create_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        def tx(conn: Connection) -> ScheduleRecord:
            if conn.execute(select(schedules.c.name)
                            .where(schedules.c.name == record.name)).first() is not None:
                raise ScheduleExistsError(f"schedule {record.name!r} exists already")
            conn.execute(insert(schedules).values(**asdict(record)))
            return record

        try:
            return self._tx(tx)
        except IntegrityError as e:
            # Two callers raced with the same name: the other one created it.
            raise ScheduleExistsError(f"schedule {record.name!r} exists already") from e

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        q = select(schedules).where(schedules.c.name == name)
        row = self._read(lambda c: c.execute(q).first())
        return None if row is None else _to_schedule(row)

    def list_schedules(self, *, tenant: str | None = None, limit: int = 100
                       ) -> list[ScheduleRecord]:
        q = select(schedules).order_by(schedules.c.name).limit(limit)
        if tenant is not None:
            q = q.where(schedules.c.tenant == tenant)
        return [_to_schedule(r) for r in self._read(lambda c: c.execute(q).all())]

    def set_schedule_paused(self, name: str, *, paused: bool, next_fire_at: datetime | None,
                            now: datetime) -> ScheduleRecord:
        values: dict[str, Any] = {"paused": paused, "updated_at": now}
        if next_fire_at is not None:
            values["next_fire_at"] = next_fire_at

        def tx(conn: Connection) -> ScheduleRecord:
            row = conn.execute(update(schedules).where(schedules.c.name == name)
                               .values(**values).returning(*schedules.c)).first()
            if row is None:
                raise UnknownScheduleError(f"unknown schedule {name!r}")
            return _to_schedule(row)

        return self._tx(tx)

    def delete_schedule(self, name: str) -> bool:
        def tx(conn: Connection) -> bool:
            return bool(conn.execute(delete(schedules).where(schedules.c.name == name)).rowcount)

        return self._tx(tx)

    def due_schedules(self, *, now: datetime, limit: int = 100) -> list[ScheduleRecord]:
        q = (select(schedules)
             .where(schedules.c.paused.is_(False), schedules.c.next_fire_at <= db_time(now))
             .order_by(schedules.c.next_fire_at).limit(limit))
        return [_to_schedule(r) for r in self._read(lambda c: c.execute(q).all())]

    def fire_schedule(self, name: str, *, claimed: datetime | None, next_fire_at: datetime | None,
                      fires: Sequence[Fire], by: str, now: datetime) -> Firing:
        def attempt() -> Firing:
            return self._tx(lambda c: _fire(c, name, claimed=claimed, next_fire_at=next_fire_at,
                                            fires=fires, by=by, now=now))

        try:
            try:
                return attempt()
            except IntegrityError:
                # A manual trigger and a beat raced to insert the same run id: the
                # other transaction started it; once more finds it, starts nothing.
                return attempt()
        except _ClaimLost:
            return Firing()  # another pass fired this time and moved on


def _fire(conn: Connection, name: str, *, claimed: datetime | None,
          next_fire_at: datetime | None, fires: Sequence[Fire], by: str,
          now: datetime) -> Firing:
    q = select(schedules).where(schedules.c.name == name)
    if claimed is not None:
        # The claim of this fire time: a second beat holding the row skips it,
        # and once the first commits the time has moved on (checked below too,
        # for SQLite, which has no row locks).
        q = q.where(schedules.c.paused.is_(False), schedules.c.next_fire_at == claimed
                    ).with_for_update(skip_locked=True)
    else:
        q = q.with_for_update()
    row = conn.execute(q).first()
    if row is None:
        if claimed is None:
            raise UnknownScheduleError(f"unknown schedule {name!r}")
        return Firing()
    sched = _to_schedule(row)
    firing = Firing()
    previous = sched.last_run_id
    for fire in fires:
        new = fire.run
        prev = None if previous in (None, new.id) else conn.execute(
            select(runs.c.status).where(runs.c.id == previous)).scalar()
        if prev is not None and prev not in TERMINAL:
            if sched.overlap == "skip":
                firing.skipped.append(new.id)
                continue
            if sched.overlap == "cancel":
                try:
                    due = request_cancel(conn, cast(str, previous), now=now, by=by,
                                         reason=f"superseded by {new.id} (schedule {name})")
                except InvalidStateError:
                    due = None  # it finished meanwhile
                if due is not None:
                    firing.due.append(due)
        run, created = create_run_tx(conn, new)
        if created:
            record_event_tx(conn, run.id, None, "schedule_fired",
                            {"schedule": name, "fire_at": fire.at.isoformat(),
                             "missed": fire.missed}, now)
            firing.started.append(run.id)
            firing.due.append(DueLap(run.id, run.next_lap, run.agent_name, run.agent_version))
        previous = run.id
    values: dict[str, Any] = {"last_run_id": previous, "updated_at": now}
    if fires:
        values["last_fire_at"] = max(f.at for f in fires)
    stmt = update(schedules).where(schedules.c.name == name)
    if claimed is not None and next_fire_at is not None:
        stmt = stmt.where(schedules.c.next_fire_at == claimed)
        values["next_fire_at"] = next_fire_at
    if conn.execute(stmt.values(**values)).rowcount != 1:
        raise _ClaimLost()
    return firing


__all__ = ["SqlScheduleStore", "schedules"]
