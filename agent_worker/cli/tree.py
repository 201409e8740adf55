"""The run tree ``runs show`` prints: the run's parent, if it is a
child run, and its children with theirs, a bounded number per level, with
counts by status so a fan-out of a thousand stays one screen."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.tree import Tree

from agent_worker.cli.common import styled_status

if TYPE_CHECKING:  # annotations only: the store package loads SQLAlchemy
    from agent_worker.store.base import Store

#: Children listed per level; the rest are counted.
SHOWN = 20


def run_tree(store: Store, run_id: str, *, depth: int = 3) -> dict[str, Any]:
    """``{"parent": id | None, "depth": n, "children": [...], "counts": {...}}``."""
    link = store.child_link(run_id)
    node: dict[str, Any] = {"parent": link.parent_run_id if link else None,
                            "depth": link.depth if link else 0}
    node.update(_children(store, run_id, depth))
    return node


def _children(store: Store, run_id: str, depth: int) -> dict[str, Any]:
    kids = [run for _, run in store.list_children(parent_run_id=run_id)]
    listed = []
    for run in kids[:SHOWN]:
        item: dict[str, Any] = {"id": run.id, "agent": run.agent_name, "status": run.status,
                                "created_at": run.created_at, "finished_at": run.finished_at}
        if depth > 1:
            item.update(_children(store, run.id, depth - 1))
        listed.append(item)
    return {"children": listed, "counts": dict(Counter(r.status for r in kids)),
            "total": len(kids)}


def render_tree(run_id: str, node: dict[str, Any]) -> Tree | None:
    """The rich tree of ``node``, or ``None`` for a run with no parent and no children."""
    if node["parent"] is None and not node["total"]:
        return None
    label = escape(run_id if node["parent"] is None
                   else f"{run_id}  (child of {node['parent']})")
    tree = Tree(label)
    _add(tree, node)
    return tree


def _add(tree: Tree, node: dict[str, Any]) -> None:
    for kid in node["children"]:
        text = f"{escape(kid['id'])}  {escape(kid['agent'])}  {styled_status(kid['status'])}"
        _add(tree.add(text), kid)
    hidden = node["total"] - len(node["children"])
    if hidden > 0:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(node["counts"].items()))
        tree.add(f"… {hidden} more ({node['total']} in all: {counts})")


__all__ = ["render_tree", "run_tree"]
