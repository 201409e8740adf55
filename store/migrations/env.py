"""Alembic environment: the URL comes from the caller (``store.migrate``) or
from settings, never from an ini file, so one config serves every deployment."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from agent_worker.core.settings import get_settings
from agent_worker.store.db import make_engine
from agent_worker.store.tables import metadata

config = context.config
url = config.attributes.get("url") or get_settings().database_url
connection = config.attributes.get("connection")


def _run(conn: object) -> None:
    context.configure(connection=conn, target_metadata=metadata,  # type: ignore[arg-type]
                      render_as_batch=url.startswith("sqlite"), compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    _run(connection)
else:
    engine = make_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
