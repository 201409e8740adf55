"""append-only audit: pruning bounded by the owner's retention; rate charges and followers scoped

Revision ID: 0024_append_only_audit
Revises: 0023_notify_followed

Postgres only (SQLite has neither roles nor row-level security, and nothing
changes there).

**The audit log.** ``0003_tenancy``'s trigger let a DELETE through
for rows older than ``agent_worker.audit_prune_before``, a setting any caller
may set: a transaction that set it to the future first removed any entry,
and a delete followed by an insert rewrote an entry's principal. Now:

* ``audit_log_retention()`` (an SQL function returning ``interval '365
  days'``, the default ``ledger_retention_days``) is how long every entry is
  kept whatever a caller asks. Changing it is DDL (``CREATE OR REPLACE
  FUNCTION``), the owner's, not a row or a setting a caller can write.
* The trigger ``audit_log_append_only`` (the same function, replaced) refuses
  UPDATE and TRUNCATE always, and a DELETE of any row younger than
  ``now() - audit_log_retention()``. It reads no setting; it fires for the
  table's owner too, so it holds even where the app role owns the table.
* ``audit_log_prune(before, batch)``, ``SECURITY DEFINER`` (runs as the
  table's owner, with a fixed ``search_path``), deletes up to ``batch``
  entries older than ``least(before, now() - audit_log_retention())``: a
  caller can ask to keep more, never less. ``store.audit.prune_tx`` calls it;
  the retention task (``prune``) is unchanged. Like every statement it sees
  only the rows the caller's tenant setting shows (forced row-level
  security applies to the owner), so the system scope prunes every tenant's.
  EXECUTE is revoked from PUBLIC: the owner and its members (the app role
  where it owns the table, the system role) may call it.
* Any role other than the owner that was granted DELETE, UPDATE or TRUNCATE
  on ``audit_log`` (a deployment whose app role does not own the tables)
  loses them and is granted EXECUTE on ``audit_log_prune`` instead: the app
  role may INSERT and SELECT, and prune only through the owner's function.

What a compromised app role can do afterwards, with DML only: append entries
(any principal, any ``at``: INSERT is how it records actions; a forged
entry is a new row, never a changed one), read the entries its tenant
setting shows, and delete entries older than the retention (what the next
prune would delete anyway). It can no longer delete or change an entry
younger than the retention by any setting, so it cannot rewrite or hide a
recent action. Where the app role also **owns** the table (the local setup
today, until the tables get an owner role of their own), the owner's
DDL remains open to it: dropping or disabling the trigger, redefining
``audit_log_retention()``, ``ALTER TABLE ... NO FORCE ROW LEVEL SECURITY``.
No trigger or policy can hold against its table's owner; only a separate
owner makes the log append-only against DDL too.

**Rate charges and followers.** ``rate_charges`` (a tenant
column) and ``event_followers`` (a run column) had no policy: with the tenant
setting on tenant A, tenant B's charges and followed runs were readable.
Both get the forced policy of every tenant-owned table: a charge is visible
when its tenant is the transaction's, a follower's row when its run is
(``EXISTS`` on ``runs``, like the child tables), both when the setting is
``*``. Workers, the sweeper and admission run in the system scope (or as the
system role, which bypasses the policies), so the lap's charges and the
event trigger's follower probe are unchanged; a stream reader's own
connection registers with its principal's tenant or the system scope
(``store.streamfeed``). ``share_limits`` and ``provider_pauses`` remain the
fleet's configuration (``0010_tenant_tables``), outside row-level security.

Downgrade: the trigger of ``0003_tenancy`` again (honouring the setting), no
prune or retention function, no policy on the two tables. Privileges revoked
from other roles are not granted back.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Connection, text

revision = '0024_append_only_audit'
down_revision = '0023_notify_followed'
branch_labels = None
depends_on = None

SCOPE = "current_setting('agent_worker.tenant', true)"
SYSTEM = f"COALESCE({SCOPE} = '*', false)"
POLICIES = {
    "rate_charges": f"{SYSTEM} OR tenant = {SCOPE}",
    "event_followers": f"{SYSTEM} OR EXISTS (SELECT 1 FROM runs r WHERE r.id = run_id)",
}

RETENTION = """
CREATE FUNCTION audit_log_retention() RETURNS interval LANGUAGE sql STABLE
AS $$ SELECT interval '365 days' $$
"""

# The database's own clock (pg_catalog.now(), never a schema earlier on a
# caller's search_path), as naive UTC like the column.
APPEND_ONLY = """
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = {path} AS $$
BEGIN
    IF TG_OP = 'DELETE'
            AND OLD.at < timezone('UTC', pg_catalog.now()) - audit_log_retention() THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'an entry is never changed, nor deleted before audit_log_retention(); '
                     'the retention prune calls audit_log_prune(before, batch)';
END $$
"""

PRUNE = """
CREATE FUNCTION audit_log_prune(before timestamp, batch integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
DECLARE
    cutoff timestamp := least(before,
                              timezone('UTC', pg_catalog.now()) - audit_log_retention());
    done integer;
BEGIN
    DELETE FROM audit_log WHERE id IN (
        SELECT id FROM audit_log WHERE at < cutoff ORDER BY at LIMIT greatest(batch, 0));
    GET DIAGNOSTICS done = ROW_COUNT;
    RETURN done;
END $$
"""

#: Roles other than the owner holding a privilege that would bypass the prune.
OTHER_WRITERS = """
SELECT DISTINCT g.grantee FROM information_schema.role_table_grants g
JOIN pg_class c ON c.oid = 'audit_log'::regclass
WHERE g.table_schema = current_schema() AND g.table_name = 'audit_log'
  AND g.privilege_type IN ('DELETE', 'UPDATE', 'TRUNCATE')
  AND g.grantee <> pg_get_userbyid(c.relowner)
"""

#: ``0003_tenancy``'s trigger function (restored by the downgrade).
OLD_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cutoff text := current_setting('agent_worker.audit_prune_before', true);
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(cutoff, '') <> '' THEN
        IF OLD.at < cutoff::timestamp THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$
"""


def _quote(conn: Connection, name: str) -> str:
    return str(conn.execute(text("SELECT quote_ident(:n)"), {"n": name}).scalar_one())


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table, visible in POLICIES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_scope ON {table} USING ({visible})")
    # pg_catalog first, this schema, temporary objects last: a caller's
    # search_path never picks what the functions call.
    schema = conn.execute(text("SELECT current_schema()")).scalar_one()
    path = f"pg_catalog, {_quote(conn, schema)}, pg_temp"
    op.execute(RETENTION)
    op.execute(APPEND_ONLY.format(path=path))
    op.execute(PRUNE.format(path=path))
    op.execute("REVOKE ALL ON FUNCTION audit_log_prune(timestamp, integer) FROM PUBLIC")
    for (grantee,) in conn.execute(text(OTHER_WRITERS)).all():
        role = "PUBLIC" if grantee == "PUBLIC" else _quote(conn, grantee)
        op.execute(f"REVOKE DELETE, UPDATE, TRUNCATE ON audit_log FROM {role}")
        op.execute(f"GRANT EXECUTE ON FUNCTION audit_log_prune(timestamp, integer) TO {role}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION audit_log_prune(timestamp, integer)")
    op.execute(OLD_APPEND_ONLY)
    op.execute("ALTER FUNCTION audit_log_append_only() RESET ALL")
    op.execute("DROP FUNCTION audit_log_retention()")
    for table in POLICIES:
        op.execute(f"DROP POLICY tenant_scope ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
