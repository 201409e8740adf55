"""The audit log is append-only for the app role (issue 48, finding 2;
migration ``0024_append_only_audit``): no setting a caller chooses lets a
DELETE through, so neither removing an entry nor rewriting its principal by a
delete and an insert works; the retention prune goes through the owner's
``audit_log_prune``, which never deletes an entry younger than
``audit_log_retention()`` whatever cutoff it is asked for, and still prunes
old entries as the app role and as the system role.

Every statement here runs as the app role as deployed (``database_url``), in
the system scope its engines start with, unless it says otherwise.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError, OperationalError

from agent_worker.core.settings import Settings
from agent_worker.store.db import make_engine
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from agent_worker.tasks.runtime import system_store
from tests.conftest import new_database
from tests.support import unavailable

pytestmark = pytest.mark.integration

SYSTEM_ROLE = "agent_worker_system"
#: Far beyond any retention: the cutoff an attacker would declare.
FUTURE = "2999-01-01T00:00:00"


@pytest.fixture
def app(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)  # the app role, system scope
    yield engine
    engine.dispose()


def _entry(c: Connection, principal: str, age_days: float) -> int:
    return int(c.execute(text(
        "INSERT INTO audit_log (at, tenant, principal, action, outcome) VALUES "
        "(timezone('UTC', pg_catalog.now()) - make_interval(secs => :s), 'acme', :p, "
        "'approve', 'ok') RETURNING id"), {"s": age_days * 86400, "p": principal}).scalar_one())


def _principal(engine: Engine, entry: int) -> str | None:
    with engine.connect() as c:
        return c.execute(text("SELECT principal FROM audit_log WHERE id = :i"),
                         {"i": entry}).scalar()


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_declaring_a_prune_cutoff_lets_no_delete_through(app: Engine) -> None:
    with app.begin() as c:
        entry = _entry(c, _uid("alice"), age_days=1)
    for where in (f"id = {entry}", "true"):
        with pytest.raises(DBAPIError, match="append-only"), app.begin() as c:
            c.execute(text("SELECT set_config('agent_worker.audit_prune_before', :c, true)"),
                      {"c": FUTURE})
            c.execute(text(f"DELETE FROM audit_log WHERE {where}"))
    assert _principal(app, entry) is not None


def test_a_delete_and_an_insert_cannot_rewrite_an_entrys_principal(app: Engine) -> None:
    alice = _uid("alice")
    with app.begin() as c:
        entry = _entry(c, alice, age_days=3)
    with pytest.raises(DBAPIError, match="append-only"), app.begin() as c:
        c.execute(text("SELECT set_config('agent_worker.audit_prune_before', :c, true)"),
                  {"c": FUTURE})
        row = c.execute(text("DELETE FROM audit_log WHERE id = :i RETURNING at"),
                        {"i": entry}).one()
        c.execute(text("INSERT INTO audit_log (id, at, tenant, principal, action, outcome) "
                       "VALUES (:i, :at, 'acme', 'mallory', 'approve', 'ok')"),
                  {"i": entry, "at": row.at})
    assert _principal(app, entry) == alice


def test_the_prune_never_deletes_an_entry_younger_than_the_owners_retention(
        database_url: str, app: Engine) -> None:
    """Asked for a cutoff in the future, the prune (``store.prune`` as the
    retention task calls it, and the function called directly) deletes the
    old entry only."""
    with app.begin() as c:
        young, old = _entry(c, _uid("young"), age_days=30), _entry(c, _uid("old"), age_days=400)
    store = SqlStore(database_url)
    try:
        future = datetime.now(UTC) + timedelta(days=1)
        store.prune(checkpoints_before=future - timedelta(days=7), ledger_before=future,
                    batch=10_000)
    finally:
        store.dispose()
    assert _principal(app, old) is None
    assert _principal(app, young) is not None
    with app.begin() as c:
        assert c.execute(text("SELECT audit_log_prune(:b, 10000)"),
                         {"b": FUTURE}).scalar_one() == 0
        assert c.execute(text("SELECT audit_log_retention()")).scalar_one() \
            == timedelta(days=365)
    assert _principal(app, young) is not None


def test_update_and_truncate_stay_refused_and_only_old_entries_can_go(app: Engine) -> None:
    with app.begin() as c:
        young, old = _entry(c, _uid("young"), age_days=364), _entry(c, _uid("old"), age_days=366)
    for sql in (f"UPDATE audit_log SET principal = 'mallory' WHERE id = {old}",
                "TRUNCATE audit_log", f"DELETE FROM audit_log WHERE id = {young}"):
        with pytest.raises(DBAPIError, match="append-only"), app.begin() as c:
            c.execute(text(sql))
    # Past the retention an entry may go (what the next prune would do anyway).
    with app.begin() as c:
        assert c.execute(text("DELETE FROM audit_log WHERE id = :i"),
                         {"i": old}).rowcount == 1
    assert _principal(app, young) is not None


def test_the_retention_task_prunes_as_the_system_role(database_url: str, app: Engine) -> None:
    url = make_url(database_url).set(username=SYSTEM_ROLE).render_as_string(hide_password=False)
    settings = Settings(database_url=database_url, system_database_url=url)
    try:
        store = system_store(settings)
    except OperationalError as e:
        unavailable(f"role {SYSTEM_ROLE} cannot log in: {e}")
    with app.begin() as c:
        young, old = _entry(c, _uid("young"), age_days=2), _entry(c, _uid("old"), age_days=500)
    try:
        now = datetime.now(UTC)
        done = store.prune(checkpoints_before=now - timedelta(days=7),
                           ledger_before=now - timedelta(days=365), batch=10_000)
    finally:
        store.dispose()
    assert done["audit_log"] >= 1
    assert _principal(app, old) is None and _principal(app, young) is not None


def test_other_roles_lose_delete_and_may_prune_instead(database_url: str) -> None:
    """A deployment that granted DELETE or UPDATE on the log to a role other
    than its owner (here PUBLIC, as no test may create roles): the migration
    takes them away and grants the prune function instead."""
    with new_database("aw_grant") as url:
        upgrade(url, "0023_notify_followed")
        engine = create_engine(url)
        try:
            with engine.begin() as c:
                c.execute(text("GRANT SELECT, INSERT, DELETE, UPDATE ON audit_log TO PUBLIC"))
            upgrade(url)
            with engine.connect() as c:
                granted = {r[0] for r in c.execute(text(
                    "SELECT privilege_type FROM information_schema.role_table_grants "
                    "WHERE table_name = 'audit_log' AND grantee = 'PUBLIC'"))}
                prune = c.execute(text(
                    "SELECT has_function_privilege('public', "
                    "'audit_log_prune(timestamp, integer)', 'EXECUTE')")).scalar()
        finally:
            engine.dispose()
    assert granted == {"SELECT", "INSERT"}
    assert prune is True

