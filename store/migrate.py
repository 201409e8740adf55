"""Schema migrations through Alembic only; ``agent-worker db upgrade`` calls this.

Upgrades take a Postgres advisory lock, so several processes running
``db upgrade`` at once (e.g. every pod's init step) apply each revision once.
Migrations are additive, so running them while workers are live is safe.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from agent_worker.store.db import make_engine

MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_ID = 0x61677774  # "agwt"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision``."""
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_ID})
                conn.commit()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_ID})
                conn.commit()
    finally:
        engine.dispose()


def current(url: str) -> str | None:
    """The revision the database is at, or ``None`` if never migrated."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
