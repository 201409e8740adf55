"""The two reads a traced lap makes (only when tracing is on): the caller's
trace context stored with the run, and which earlier attempts of a lap ended
in a recorded retry (the others were lost; see ``agent_worker.tracing``)."""

from __future__ import annotations

from sqlalchemy import Engine, select

from agent_worker.store.rows import events


def run_traceparent(engine: Engine, run_id: str) -> str | None:
    """The ``traceparent`` ``start_run`` stored in the run's ``run_created``
    event (the run's first event: the index on (run_id, id) finds it at once)."""
    q = (select(events.c.data).where(events.c.run_id == run_id,
                                      events.c.kind == "run_created")
         .order_by(events.c.id).limit(1))
    with engine.connect() as conn:
        data = conn.execute(q).scalar()
    value = data.get("traceparent") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def lap_retries(engine: Engine, run_id: str, lap: int) -> set[int]:
    """The attempts of ``lap`` that ended by releasing the lap for a retry."""
    q = select(events.c.data).where(events.c.run_id == run_id, events.c.lap == lap,
                                    events.c.kind == "retry")
    with engine.connect() as conn:
        found = conn.execute(q).scalars().all()
    return {int(d["attempt"]) for d in found
            if isinstance(d, dict) and isinstance(d.get("attempt"), int)}


__all__ = ["lap_retries", "run_traceparent"]
