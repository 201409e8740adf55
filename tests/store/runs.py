"""Runs and claims the store tests start from: a one-message run, a lap
claimed with a 60 s lease."""

from __future__ import annotations

import uuid
from datetime import datetime

from agent_worker.core.messages import Message
from agent_worker.store.base import Claim, NewRun
from agent_worker.store.sql import SqlStore


def start(store: SqlStore, now: datetime, *, prefix: str, tenant: str | None = None) -> str:
    """A new run of agent ``prefix`` at lap 0 with one user message; its id."""
    rid = f"{prefix}-{uuid.uuid4().hex[:10]}"
    store.create_run(NewRun(
        id=rid, tenant=tenant, agent_name=prefix, agent_version="1", input={}, limits={},
        retention="full", checkpoint={"schema_version": 2, "message_count": 1},
        schema_version=2, messages=[Message(role="user", content="task")], now=now))
    return rid


def claim(store: SqlStore, rid: str, lap: int, owner: str, now: datetime,
          lease: float = 60) -> Claim:
    """Lap ``lap`` of ``rid`` claimed by ``owner``, which must succeed."""
    got = store.claim(rid, lap, owner=owner, now=now, lease_seconds=lease, window_messages=5)
    assert got is not None
    return got
