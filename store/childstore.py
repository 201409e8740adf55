"""The SQL implementation of ``ChildStore`` (``store.childbase``), a mixin of
``SqlStore``; the transaction helpers live in ``store.children``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection

from agent_worker.core.errors import ChildLimitError, InvalidStateError
from agent_worker.store import children
from agent_worker.store.base import DueLap, NewRun, RunRecord
from agent_worker.store.childbase import ChildLink
from agent_worker.store.rows import fence, require_run
from agent_worker.store.sqlbase import SqlBase


class SqlChildStore(SqlBase):
    """``ChildStore`` over the SQL store's engine."""

    def start_children(self, parent_run_id: str, group_key: str, new: Sequence[NewRun], *,
                       now: datetime, owner: str | None, max_depth: int, max_per_run: int,
                       principal: str | None = None) -> list[DueLap]:
        def tx(conn: Connection) -> list[DueLap]:
            if owner is not None:
                fence(conn, parent_run_id, None, owner, now, cancel=True)
            else:
                # Locked, then checked: a cancel (which cancels the children it
                # finds) either comes first and is seen here, or comes after
                # and finds this child.
                parent = require_run(conn, parent_run_id, lock=True)
                if parent.finished or parent.cancel_requested_at is not None:
                    raise InvalidStateError(
                        f"run {parent_run_id} is {parent.status}"
                        + (" and being cancelled" if parent.cancel_requested_at else "")
                        + "; it starts no children")
            link = children.link_of(conn, parent_run_id)
            depth = 1 + (link.depth if link is not None else 0)
            if depth > max_depth:
                raise ChildLimitError(
                    f"a child of run {parent_run_id} would be at depth {depth}; the limit "
                    f"is {max_depth} (AGENT_WORKER_MAX_CHILD_DEPTH)")
            had = children.count_children(conn, parent_run_id)
            known = {r.id for _, r in children.children_of(conn, group_key=group_key)}
            adding = sum(1 for n in new if n.id not in known)
            if had + adding > max_per_run:
                raise ChildLimitError(
                    f"run {parent_run_id} has {had} children; {adding} more would pass the "
                    f"limit of {max_per_run} (AGENT_WORKER_MAX_CHILDREN_PER_RUN)")
            inherited = principal if principal is not None else (
                link.principal if link is not None else None)
            return children.create_children(conn, parent_run_id, group_key, new, depth=depth,
                                            principal=inherited, now=now)

        return self._tx(tx)

    def child_link(self, run_id: str) -> ChildLink | None:
        return self._read(lambda c: children.link_of(c, run_id))

    def list_children(self, *, group_key: str | None = None,
                      parent_run_id: str | None = None) -> list[tuple[ChildLink, RunRecord]]:
        return self._read(lambda c: children.children_of(c, group_key=group_key,
                                                         parent_run_id=parent_run_id))

    def cancel_children(self, parent_run_id: str, *, reason: str, by: str,
                        now: datetime) -> list[DueLap]:
        return self._tx(lambda c: children.cancel_children(c, parent_run_id, reason=reason,
                                                           by=by, now=now))


__all__ = ["SqlChildStore"]
