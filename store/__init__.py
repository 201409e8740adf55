"""Persistence for agent-worker: the Store protocol and its SQL implementation."""

if __name__ == "store":  # this folder, imported from a checkout by its old name
    raise ImportError(
        "agent-worker's store moved to `agent_worker.store` (so that an application's "
        "own store.py cannot clash with it): import agent_worker.store")



from agent_worker.store.base import (
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
from agent_worker.store.sql import SqlStore

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
