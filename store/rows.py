"""Row ↔ value conversions shared by the SQL store's modules."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Table,
    and_,
    insert,
    literal,
    null,
    select,
    update,
)

from agent_worker.core.errors import LeaseLost, UnknownRunError
from agent_worker.core.messages import Message
from agent_worker.store.base import (
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    RunRecord,
    SignalRecord,
    StoredMessage,
)
from agent_worker.store.models import (
    ApprovalRow,
    CheckpointRow,
    ChildRunRow,
    EffectRow,
    EventRow,
    MessageRow,
    Run,
    ServedVersionRow,
    SignalRow,
)
from agent_worker.store.runstatus import shown

runs = cast(Table, Run.__table__)
checkpoints = cast(Table, CheckpointRow.__table__)
messages = cast(Table, MessageRow.__table__)
effects = cast(Table, EffectRow.__table__)
events = cast(Table, EventRow.__table__)
approvals = cast(Table, ApprovalRow.__table__)
signals = cast(Table, SignalRow.__table__)
served_versions = cast(Table, ServedVersionRow.__table__)
child_runs = cast(Table, ChildRunRow.__table__)


_RUN_FIELDS = frozenset(RunRecord.__dataclass_fields__)


def to_run(row: Row[Any]) -> RunRecord:
    """The run as readers see it: its status shown from the lease
    (``store.runstatus``). Columns that are no run field (the claim's extra
    facts) are ignored."""
    fields = {k: v for k, v in row._mapping.items() if k in _RUN_FIELDS}
    fields["status"] = shown(fields["status"], fields.get("lease_owner"))
    return RunRecord(**fields)


def to_message(row: Row[Any, Any, Any]) -> StoredMessage:
    """A message row; its body JSON text (``statements.WINDOW`` casts it, for
    pydantic to parse at once) or already parsed."""
    body = row.body
    message = (Message.model_validate_json(body) if isinstance(body, str)
               else Message.model_validate(body))
    return StoredMessage(seq=row.seq, lap=row.lap, message=message)


def message_body(message: Message) -> dict[str, Any]:
    """Compact JSON of a message: defaults left out, so a lap's rows stay small."""
    return message.model_dump(mode="json", exclude_defaults=True)


def to_effect(row: Row[Any]) -> EffectRecord:
    return EffectRecord(**row._mapping)


def to_approval(row: Row[Any]) -> ApprovalRecord:
    return ApprovalRecord(**row._mapping)


def to_signal(row: Row[Any]) -> SignalRecord:
    return SignalRecord(**row._mapping)


def to_event(row: Row[Any]) -> EventRecord:
    return EventRecord(**row._mapping)



def fence(conn: Connection, run_id: str, lap: int | None, owner: str, now: datetime,
           *, cancel: bool) -> None:
    """Lock the run row until the transaction ends if ``owner`` still holds
    its lease, else raise ``LeaseLost``: a claim or a cancel of the run waits
    for what is written under the fence (an effect's intent, children).

    On Postgres the lock an UPDATE would take (``FOR NO KEY UPDATE``, which
    waits and re-checks the row like one) without writing a new version of
    the row: an effect's intent would otherwise leave a dead version of the
    run row behind on every effectful lap. On SQLite the fence writes the row
    (``updated_at``): a transaction there starts at its first write, so a
    read first would check the lease outside the transaction it fences."""
    cond = [runs.c.id == run_id, runs.c.lease_owner == owner]
    if lap is not None:
        cond.append(runs.c.next_lap == lap)
    if cancel:
        cond.append(runs.c.cancel_requested_at.is_(None))
    if conn.dialect.name == "postgresql":
        held = conn.execute(select(runs.c.id).where(and_(*cond))
                            .with_for_update(key_share=True)).first() is not None
    else:
        held = conn.execute(update(runs).where(and_(*cond)).values(updated_at=now)).rowcount == 1
    if not held:
        raise LeaseLost(f"run {run_id}: lease lost (owner {owner})")


def record_event_tx(conn: Connection, run_id: str, lap: int | None, kind: str,
           data: dict[str, Any] | None, now: datetime) -> None:
    conn.execute(insert(events).values(run_id=run_id, lap=lap, kind=kind, data=data,
                                       created_at=now))


def record_lap_events(conn: Connection, ids: Sequence[str], kind: str,
                      at: ColumnElement[datetime]) -> None:
    """An event of ``kind`` for each run of ``ids``, at the lap it is to run
    next, stamped ``at`` (an expression such as the database's clock, which
    a multi-row insert of values cannot carry). Admission's ``admitted``
    (``sharing.SqlShareStore.admit``): a run let go after waiting in line
    since an earlier pass, the end of a wait for a slot, which a run's
    timeline shows (``console.timeline``) and no other record keeps; runs
    admitted as they ask write nothing."""
    if ids:
        conn.execute(insert(events).from_select(
            ["run_id", "lap", "kind", "data", "created_at"],
            select(runs.c.id, runs.c.next_lap, literal(kind), null(), at)
            .where(runs.c.id.in_(ids))))


def require_run(conn: Connection, run_id: str, *, lock: bool = False) -> RunRecord:
    """The run row; with ``lock``, held until the transaction ends (``FOR UPDATE``)."""
    q = select(runs).where(runs.c.id == run_id)
    row = conn.execute(q.with_for_update() if lock else q).first()
    if row is None:
        raise UnknownRunError(f"unknown run {run_id!r}")
    return to_run(row)


