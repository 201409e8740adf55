"""A run's family on its page: its parent, its children and their
children, each with its status and a link, and a bar of when it ran on one
time axis (from the run's creation to the last end), so a fan-out shows
which child held the parent up; forks of the run beside them.

The shape is the CLI's (``cli.tree.run_tree``: a bounded number of children
per level, the rest counted by status, so a fan-out of a thousand stays one
screen), read inside the visitor's tenant scope: children are created in
their parent's tenant, and on Postgres row-level security narrows the reads
to the scope's tenant too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_worker.api import AgentWorker
from agent_worker.cli.tree import run_tree
from agent_worker.console.timeline import took as took_text
from agent_worker.core.errors import NotFoundError
from agent_worker.store import tenancy
from agent_worker.store.base import RunRecord

#: Levels below the run: its children and their children.
DEPTH = 2
#: Pixels of the children's time axis.
AXIS_PX = 200
#: A child's bar by its status (SVG presentation attributes, allowed by the
#: console's policy where inline styles are not).
STATUS_COLOURS = {"succeeded": "#2f9e6a", "failed": "#c03535", "cancelled": "#8a8a8a",
                  "waiting": "#e0a030", "sleeping": "#9fb4d9"}


def family(aw: AgentWorker, run: RunRecord, *, limit: int) -> dict[str, Any]:
    """``{"parent": RunRecord | None, "parent_id", "depth", "children": [...],
    "counts", "total", "forks": [RunRecord]}``; each child ``{"id", "agent",
    "status", "created_at", "finished_at", "bar", "children", "counts",
    "total"}`` (a grandchild: no ``children``). One read for a run with no
    child and no fork (most runs); the tree's reads only for one with children."""
    below = aw.list_runs(parent=run.id, limit=limit)
    forks = [r for r in below if r.forked_from_lap is not None]
    node: dict[str, Any] = {"parent": None, "depth": 0, "children": [], "counts": {},
                            "total": 0}
    if len(forks) < len(below) or run.parent_run_id is not None:
        with tenancy.scope(aw.principal.tenant):
            node = run_tree(aw.rt.store, run.id, depth=DEPTH)
        node = timed(node, run.created_at, aw.rt.clock.now())
    parent_id = node["parent"] or run.parent_run_id
    parent = None
    if parent_id is not None:
        try:
            parent = aw.get_run(parent_id)
        except NotFoundError:
            parent = None  # pruned, or another tenant's: shown as its id alone
    return {**node, "parent_id": parent_id, "parent": parent, "forks": forks}


def timed(node: dict[str, Any], start: datetime, now: datetime) -> dict[str, Any]:
    """``node`` with a ``bar`` on each child and grandchild: where it starts
    and how long it ran (until now while it runs) on one axis from ``start``
    to the last end among them."""
    def ends(n: dict[str, Any]) -> list[datetime]:
        return [t for c in n.get("children", [])
                for t in [c["finished_at"] or now, *ends(c)]]

    span = max((max(ends(node), default=start) - start).total_seconds(), 1e-3)

    def mark(n: dict[str, Any]) -> dict[str, Any]:
        kids = []
        for c in n.get("children", []):
            begin = (c["created_at"] - start).total_seconds()
            took = ((c["finished_at"] or now) - c["created_at"]).total_seconds()
            bar = {"x": round(max(begin, 0.0) / span * AXIS_PX, 1),
                   "w": round(max(took / span * AXIS_PX, 1.0), 1), "took": took_text(took * 1000),
                   "colour": STATUS_COLOURS.get(c["status"], "#3f6fb5")}
            kids.append({**mark(c), "bar": bar})
        return {**n, "children": kids}

    return mark(node)


__all__ = ["AXIS_PX", "DEPTH", "STATUS_COLOURS", "family", "timed"]
