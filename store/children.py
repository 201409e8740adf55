"""Transaction helpers for child runs. None of them commits.

A parent that waits for children is a ``waiting`` row (``children:all:<group>``
or ``children:any:<group>``, the group being the key of the call that started
them). Two writers decide when it wakes, and neither may miss the other:

- the child's terminal commit (``notify_parent``): it locks the *parent* row,
  then asks whether the wait is now satisfied. Two children ending at once
  serialize on that lock, and the second one's query (a new statement, so a
  new snapshot under READ COMMITTED) sees the first one's end: the last child
  always sees every sibling ended, and ``wake`` flips the row only once.
- the parent's own commit of the wait (``store.wakeups.recheck`` calls
  ``arrived`` here): its fenced UPDATE holds the parent row, so a child that
  ended before the parent paused is seen by that query, and one that ends
  after finds the parent ``waiting``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, exists, func, insert, select, update

from agent_worker.core.errors import InvalidStateError
from agent_worker.core.vocabulary import TERMINAL, WaitingFor
from agent_worker.store import pauses
from agent_worker.store.base import DueLap, NewRun, RunRecord
from agent_worker.store.childbase import ChildLink
from agent_worker.store.dbtime import db_time
from agent_worker.store.rows import (
    checkpoints,
    child_runs,
    events,
    message_body,
    messages,
    record_event_tx,
    runs,
    to_run,
)
from agent_worker.store.runstatus import shown


def link_of(conn: Connection, run_id: str) -> ChildLink | None:
    row = conn.execute(select(child_runs).where(child_runs.c.child_run_id == run_id)).first()
    return None if row is None else _link(row._mapping)


def _link(m: Any) -> ChildLink:
    return ChildLink(**{k: m[child_runs.c[k]] for k in ChildLink.__dataclass_fields__})


def count_children(conn: Connection, parent_run_id: str) -> int:
    return int(conn.execute(select(func.count()).select_from(child_runs).where(
        child_runs.c.parent_run_id == parent_run_id)).scalar_one())


def create_children(conn: Connection, parent_run_id: str, group_key: str,
                    new: Sequence[NewRun], *, depth: int, principal: str | None,
                    now: datetime) -> list[DueLap]:
    """Insert the children not yet there (a replay finds the others) with their
    first checkpoint and messages and the link to the parent; return the laps
    to send: those just created, and on a replay those still queued and
    unclaimed (the dead attempt's sends may be lost; a duplicate is harmless).
    Batched: a fan-out of a thousand is a few statements."""
    ids = [n.id for n in new]
    existing = {r.id: r for r in conn.execute(
        select(runs.c.id, runs.c.status, runs.c.lease_owner, runs.c.next_lap)
        .where(runs.c.id.in_(ids)))}
    fresh = [(i, n) for i, n in enumerate(new) if n.id not in existing]
    unsent = [DueLap(n.id, existing[n.id].next_lap, n.agent_name, n.agent_version)
              for n in new if n.id in existing
              and shown(existing[n.id].status, existing[n.id].lease_owner) == "queued"]
    if not fresh:
        return unsent
    conn.execute(insert(runs), [dict(
        id=n.id, tenant=n.tenant, agent_name=n.agent_name, agent_version=n.agent_version,
        status="queued", next_lap=1, lap_attempts=0, input=n.input, limits=n.limits,
        laps_used=0, input_tokens=0, output_tokens=0, cost_micros=0, retention=n.retention,
        recoveries=0, parent_run_id=parent_run_id, forked_from_lap=None, created_at=now,
        updated_at=now, last_checkpoint_at=now) for _, n in fresh])
    # The hand-off starts on the database's clock (store.dbtime); an expression
    # cannot ride in a multi-row insert, so it is set in one UPDATE after.
    conn.execute(update(runs).where(runs.c.id.in_([n.id for _, n in fresh]))
                 .values(enqueued_at=db_time(now)))
    conn.execute(insert(checkpoints), [dict(
        run_id=n.id, lap=0, schema_version=n.schema_version, state=n.checkpoint,
        created_at=now) for _, n in fresh])
    rows = [dict(run_id=n.id, seq=s, lap=0, body=message_body(m), created_at=now)
            for _, n in fresh for s, m in enumerate(n.messages)]
    if rows:
        conn.execute(insert(messages), rows)
    conn.execute(insert(child_runs), [dict(
        child_run_id=n.id, parent_run_id=parent_run_id, group_key=group_key, position=i,
        depth=depth, principal=principal, created_at=now) for i, n in fresh])
    conn.execute(insert(events), [dict(
        run_id=n.id, lap=0, kind="run_created", created_at=now,
        data={"agent": n.agent_name, "version": n.agent_version, "parent": parent_run_id,
              "group": group_key, "position": i}) for i, n in fresh])
    record_event_tx(conn, parent_run_id, None, "children_started",
                    {"group": group_key, "count": len(fresh),
                     "first": fresh[0][1].id, "last": fresh[-1][1].id}, now)
    return unsent + [DueLap(n.id, 1, n.agent_name, n.agent_version) for _, n in fresh]


def _group(group_key: str) -> ColumnElement[bool]:
    return child_runs.c.group_key == group_key


def arrived(conn: Connection, waiting_for: WaitingFor) -> bool:
    """Whether a ``children`` wait is satisfied: no child of the group still
    going (``all``), or one of them ended (``any``). A group with no child
    yet is never satisfied."""
    mode, group = waiting_for.child_wait()
    in_group = (select(child_runs.c.child_run_id)
                .join(runs, runs.c.id == child_runs.c.child_run_id)
                .where(_group(group)))
    if mode == "any":
        return conn.execute(
            select(exists(in_group.where(runs.c.status.in_(TERMINAL))))).scalar_one()
    unended = exists(in_group.where(runs.c.status.not_in(TERMINAL)))
    anyone = exists(select(child_runs.c.child_run_id).where(_group(group)))
    return bool(conn.execute(select(anyone & ~unended)).scalar_one())


def notify_parent(conn: Connection, run_id: str, *, now: datetime) -> DueLap | None:
    """In the transaction that ends ``run_id``: wake its parent if it waits for
    this child's group and the wait is now satisfied (see module docstring)."""
    link = link_of(conn, run_id)
    if link is None:
        return None
    parent = conn.execute(select(runs.c.status, runs.c.waiting_for)
                          .where(runs.c.id == link.parent_run_id)
                          .with_for_update()).first()
    if parent is None or parent.status != "waiting" or not parent.waiting_for:
        return None
    waiting_for = WaitingFor.parse(parent.waiting_for)
    if waiting_for.kind != "children" or waiting_for.child_wait()[1] != link.group_key:
        return None
    if not arrived(conn, waiting_for):
        return None
    due = pauses.wake(conn, link.parent_run_id, now=now, waiting_for=waiting_for)
    if due is not None:
        record_event_tx(conn, link.parent_run_id, None, "woken",
                        {"arrived": waiting_for.format(), "last_child": run_id}, now)
    return due


def children_of(conn: Connection, *, group_key: str | None = None,
                parent_run_id: str | None = None) -> list[tuple[ChildLink, RunRecord]]:
    """Children of a call's group, or of a parent, in the order they were asked for."""
    q = (select(child_runs, runs).join(runs, runs.c.id == child_runs.c.child_run_id)
         .order_by(child_runs.c.created_at, child_runs.c.group_key, child_runs.c.position))
    if group_key is not None:
        q = q.where(_group(group_key))
    if parent_run_id is not None:
        q = q.where(child_runs.c.parent_run_id == parent_run_id)
    out = []
    for row in conn.execute(q):
        out.append((_link(row._mapping), to_run(row)))
    return out


def cancel_children(conn: Connection, parent_run_id: str, *, reason: str, by: str,
                    now: datetime) -> list[DueLap]:
    """Ask every unended child of ``parent_run_id`` to cancel (each then runs
    its compensations and cascades to its own children in its ending lap)."""
    ids = list(conn.execute(
        select(child_runs.c.child_run_id).join(runs, runs.c.id == child_runs.c.child_run_id)
        .where(child_runs.c.parent_run_id == parent_run_id, runs.c.status.not_in(TERMINAL),
               runs.c.cancel_requested_at.is_(None))
        .order_by(child_runs.c.child_run_id)).scalars())
    sent: list[DueLap] = []
    for child in ids:
        try:
            due = pauses.request_cancel(conn, child, reason=reason, by=by, now=now)
        except InvalidStateError:
            continue  # it ended meanwhile: nothing to cancel

        if due is not None:
            sent.append(due)
    return sent


__all__ = ["arrived", "cancel_children", "children_of", "count_children",
           "create_children", "link_of", "notify_parent"]
