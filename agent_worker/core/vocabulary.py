"""The words the engine, the store and the faces share: run and effect
statuses, the sets of them that decide claims and endings, and what a waiting
run waits for.

One module so that a new status or a new kind of wait is added in one place and
cannot drift between a writer that builds a string and a reader that slices it.
It imports nothing from the project, so every layer (store included) may use it.
The database keeps plain strings in the same format, so no migration follows
from anything here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, cast, get_args

RunStatus = Literal["queued", "running", "waiting", "sleeping", "succeeded", "failed", "cancelled"]
#: Every run status, in lifecycle order (metrics and CLI choices list them).
RUN_STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)
#: Statuses a run never leaves.
TERMINAL: Final[frozenset[RunStatus]] = frozenset({"succeeded", "failed", "cancelled"})
#: Statuses a worker may claim (a "running" run whose lease lapsed is reclaimable).
RUNNABLE: Final[tuple[RunStatus, ...]] = ("queued", "running")
#: Statuses of a run that holds no process and waits for a timer, a human or a signal.
PAUSED: Final[tuple[RunStatus, ...]] = ("sleeping", "waiting")
#: Statuses a lap commit may end a run in by itself (a cancel ends it from outside).
ENDED_BY_LAP: Final[frozenset[RunStatus]] = frozenset({"succeeded", "failed"})
#: Statuses ``retry`` resumes a run from: failed, or waiting for an operator.
#: The API's retry and the console's buttons both read it, so they cannot disagree.
RETRYABLE: Final[tuple[RunStatus, ...]] = ("failed", "waiting")

#: ``not_applied``: known never to have landed (a lookup found nothing, or a
#: human said so); a replay calls it again with the same key.
EffectStatus = Literal["pending", "applied", "failed", "compensated", "unknown", "not_applied"]
EFFECT_STATUSES: Final[tuple[EffectStatus, ...]] = get_args(EffectStatus)

#: approval/signal/effect name what wakes the run (an approval id, a signal name,
#: an effect key); attention and budget wait for an operator and carry nothing;
#: children waits for child runs (``all:<group>`` or ``any:<group>``, the group
#: being the key of the call that started them).
WaitKind = Literal["approval", "signal", "effect", "attention", "budget", "children"]
#: How a parent waits for its children: until every one ended, or the first.
ChildWait = Literal["all", "any"]
_KINDS: Final[frozenset[str]] = frozenset(get_args(WaitKind))

#: What a schedule does with fire times its beat missed (it was down longer
#: than the grace): ``skip`` drops them, ``once`` fires the latest of them,
#: ``all`` fires each of them (the most recent ``catchup_limit``).
CatchUp = Literal["skip", "once", "all"]
CATCH_UPS: Final[tuple[CatchUp, ...]] = get_args(CatchUp)
#: What a firing does while the schedule's previous run is still going:
#: ``skip`` starts nothing, ``allow`` starts anyway, ``cancel`` cancels the
#: previous run and starts.
Overlap = Literal["skip", "allow", "cancel"]
OVERLAPS: Final[tuple[Overlap, ...]] = get_args(Overlap)


@dataclass(frozen=True)
class WaitingFor:
    """What a ``waiting`` run waits for; stored as ``kind`` or ``kind:ref``."""

    kind: WaitKind
    ref: str | None = None

    @classmethod
    def approval(cls, approval_id: str) -> WaitingFor:
        return cls("approval", approval_id)

    @classmethod
    def signal(cls, name: str) -> WaitingFor:
        return cls("signal", name)

    @classmethod
    def effect(cls, key: str) -> WaitingFor:
        return cls("effect", key)

    @classmethod
    def children(cls, mode: ChildWait, group: str) -> WaitingFor:
        return cls("children", f"{mode}:{group}")

    def child_wait(self) -> tuple[ChildWait, str]:
        """(mode, group) of a ``children`` wait; raises ``ValueError`` otherwise."""
        mode, _, group = (self.ref or "").partition(":")
        if self.kind != "children" or mode not in ("all", "any") or not group:
            raise ValueError(f"not a children wait: {self.format()!r}")
        return cast("ChildWait", mode), group

    def format(self) -> str:
        """The column's text (effect keys hold colons; only the first one splits)."""
        return self.kind if self.ref is None else f"{self.kind}:{self.ref}"

    @classmethod
    def parse(cls, text: str) -> WaitingFor:
        """Inverse of :meth:`format`; raises ``ValueError`` on an unknown kind."""
        kind, sep, ref = text.partition(":")
        if kind not in _KINDS:
            raise ValueError(f"unknown wait kind in {text!r}")
        return cls(cast("WaitKind", kind), ref if sep else None)

    @staticmethod
    def prefix(kind: WaitKind) -> str:
        """The stored prefix every wait of ``kind`` with a reference starts with
        (for ``LIKE`` queries)."""
        return f"{kind}:"

    def __str__(self) -> str:
        return self.format()


def wait_text(waiting_for: WaitingFor | None) -> str | None:
    """The ``waiting_for`` column's value for ``waiting_for`` (``None`` stays ``None``)."""
    return None if waiting_for is None else waiting_for.format()


__all__ = [
    "CATCH_UPS",
    "EFFECT_STATUSES",
    "ENDED_BY_LAP",
    "OVERLAPS",
    "PAUSED",
    "RETRYABLE",
    "RUNNABLE",
    "RUN_STATUSES",
    "TERMINAL",
    "CatchUp",
    "ChildWait",
    "EffectStatus",
    "Overlap",
    "RunStatus",
    "WaitKind",
    "WaitingFor",
    "wait_text",
]
