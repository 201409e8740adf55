"""Persistence for agent-worker: the Store protocol and its SQL implementation."""

from store.base import (
    ApprovalRecord,
    Claim,
    EffectIntent,
    EffectRecord,
    EventRecord,
    LapCommit,
    RunRecord,
    SignalRecord,
    Store,
    StoredMessage,
)
from store.sql import SqlStore

__all__ = [
    "ApprovalRecord",
    "Claim",
    "EffectIntent",
    "EffectRecord",
    "EventRecord",
    "LapCommit",
    "RunRecord",
    "SignalRecord",
    "SqlStore",
    "Store",
    "StoredMessage",
]
