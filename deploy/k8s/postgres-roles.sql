-- The three database roles of agent-worker and their privileges: one file for
-- every deploy path (the Postgres image runs it from /docker-entrypoint-initdb.d
-- in docker-compose.yml and postgres-statefulset.yaml; deploy/local/services.sh
-- runs it at start; elsewhere run it by hand). Run it as a superuser connected
-- to the fleet's database (never as one of the three roles: it refuses), with
-- psql 15 or later and the three passwords in the environment:
--
--   AGENT_WORKER_OWNER_PASSWORD=... AGENT_WORKER_APP_PASSWORD=... \
--   AGENT_WORKER_SYSTEM_PASSWORD=... \
--     psql -v ON_ERROR_STOP=1 -U postgres -d agent_worker -f postgres-roles.sql
--
--   agent_worker_owner   owns the database, the schema's tables and functions;
--                        runs `agent-worker db upgrade` and nothing else
--   agent_worker         the app role (API, CLI, console, stream endpoint):
--                        SELECT, INSERT, UPDATE, DELETE, no ownership, so no
--                        ALTER, DROP, policy change or NO FORCE ROW LEVEL
--                        SECURITY; INSERT and SELECT only on audit_log
--   agent_worker_system  workers, sweeper, beat: BYPASSRLS and a member of
--                        agent_worker (its privileges, nothing more)
--
-- Idempotent: run it again to change a password. On a database whose tables
-- the app role owns (an install of an older release), it hands them, their
-- sequences and the schema's functions to the owner once; the database's
-- other objects and other databases are left alone. Tables created later by
-- the owner's migrations reach the app role through the default privileges
-- below, so a release never needs this file again.
\set ON_ERROR_STOP on
\getenv owner_password AGENT_WORKER_OWNER_PASSWORD
\getenv app_password AGENT_WORKER_APP_PASSWORD
\getenv system_password AGENT_WORKER_SYSTEM_PASSWORD
\if :{?owner_password}
\else
\set owner_password ''
\endif
\if :{?app_password}
\else
\set app_password ''
\endif
\if :{?system_password}
\else
\set system_password ''
\endif
-- NOCREATEDB unless told otherwise: deploy/local/services.sh passes
-- `-v app_createdb=CREATEDB`, since its test suite creates a database per session.
\if :{?app_createdb}
\else
\set app_createdb NOCREATEDB
\endif
SELECT :'owner_password' = '' OR :'app_password' = '' OR :'system_password' = '' AS missing
\gset
\if :missing
DO $$ BEGIN RAISE EXCEPTION 'set the three AGENT_WORKER_*_PASSWORD variables'; END $$;
\endif

BEGIN;
SET LOCAL password_encryption = 'scram-sha-256';
-- Demoting the app role below must leave a superuser behind: an install made
-- by an older compose file or Secret has POSTGRES_USER=agent_worker, its only
-- superuser.
DO $$
BEGIN
    IF current_user IN ('agent_worker', 'agent_worker_owner', 'agent_worker_system') THEN
        RAISE EXCEPTION 'run this file as another superuser than %', current_user
            USING HINT = 'as ' || current_user || ': CREATE ROLE postgres SUPERUSER LOGIN '
                         'PASSWORD ''...'';, then run it as postgres';
    END IF;
END $$;
SELECT format('CREATE ROLE %I', r) FROM unnest(ARRAY['agent_worker_owner', 'agent_worker',
    'agent_worker_system']) AS r WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r)
\gexec
ALTER ROLE agent_worker_owner WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    NOBYPASSRLS PASSWORD :'owner_password';
ALTER ROLE agent_worker WITH LOGIN NOSUPERUSER :app_createdb NOCREATEROLE NOREPLICATION
    NOBYPASSRLS PASSWORD :'app_password';
ALTER ROLE agent_worker_system WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    BYPASSRLS PASSWORD :'system_password';
GRANT agent_worker TO agent_worker_system;

SELECT format('ALTER DATABASE %I OWNER TO agent_worker_owner', current_database()) \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO agent_worker', current_database()) \gexec
-- The schema the migrations fill: the owner creates in it, nobody else (Postgres
-- before 15 let every role create in public).
SELECT format('GRANT USAGE, CREATE ON SCHEMA %I TO agent_worker_owner', current_schema())
\gexec
SELECT format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC, agent_worker', current_schema()) \gexec
SELECT format('GRANT USAGE ON SCHEMA %I TO agent_worker', current_schema()) \gexec

-- The one-time hand-over of an older install's objects (none on a fresh one).
-- A sequence that belongs to a column follows its table.
SELECT format('ALTER %s %s OWNER TO agent_worker_owner',
              CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                             WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
              c.oid::regclass)
FROM pg_class c
WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
  AND c.relowner = 'agent_worker'::regrole AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
\gexec
SELECT format('ALTER ROUTINE %s OWNER TO agent_worker_owner', p.oid::regprocedure)
FROM pg_proc p
WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
  AND p.proowner = 'agent_worker'::regrole
\gexec
SELECT format('ALTER TYPE %s OWNER TO agent_worker_owner', t.oid::regtype)
FROM pg_type t
WHERE t.typnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
  AND t.typowner = 'agent_worker'::regrole
  AND t.typtype IN ('e', 'd') AND t.typelem = 0
\gexec

-- What the app role may do: DML on what exists now, and on what the owner's
-- migrations create later (default privileges of the owner).
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO agent_worker',
              current_schema()) \gexec
SELECT format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO agent_worker',
              current_schema()) \gexec
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE agent_worker_owner IN SCHEMA %I '
              'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO agent_worker', current_schema())
\gexec
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE agent_worker_owner IN SCHEMA %I '
              'GRANT USAGE, SELECT ON SEQUENCES TO agent_worker', current_schema()) \gexec
-- The audit log is append-only: INSERT and SELECT, and pruning through the
-- owner's audit_log_prune() (migration 0024_append_only_audit does the same
-- for a table created after this file ran).
SELECT 'REVOKE UPDATE, DELETE, TRUNCATE ON audit_log FROM agent_worker'
WHERE to_regclass('audit_log') IS NOT NULL \gexec
SELECT 'GRANT EXECUTE ON FUNCTION audit_log_prune(timestamp, integer) TO agent_worker'
WHERE to_regprocedure('audit_log_prune(timestamp, integer)') IS NOT NULL \gexec
COMMIT;
