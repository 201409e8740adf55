#!/usr/bin/env bash
# The main job, on a fresh machine, as root: install what is missing, start a
# project-local Postgres, Redis and demo vendor (unless AGENT_WORKER_DATABASE_URL /
# AGENT_WORKER_BROKER_URL point elsewhere), migrate, then run the demo. The
# demo's fleet (workers, beat, Flower, the run console on http://127.0.0.1:8090
# with a generated password it prints) stays up afterwards; stop it with
#   deploy/local/demo.sh --stop        and the services with
#   deploy/local/services.sh stop
# --no-keep tears the fleet down when the demo ends; --runs N submits N runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--stop" ]; then
  exec .venv/bin/python -m agent_worker.demo.orchestrate --stop
fi
deploy/local/install.sh
# The checkout's virtual environment (install.sh made it): python, agent-worker
# and celery below, and every process they start, are the ones installed there.
. .venv/bin/activate
if [ -z "${AGENT_WORKER_DATABASE_URL:-}" ] || [ -z "${AGENT_WORKER_BROKER_URL:-}" ]; then
  deploy/local/services.sh start
fi
if [ -z "${AGENT_WORKER_DATABASE_URL:-}" ]; then
  # The local Postgres's schema belongs to agent_worker_owner, the one role that
  # migrates (deploy/k8s/postgres-roles.sql); the fleet connects as the app role.
  AGENT_WORKER_DATABASE_URL="postgresql+psycopg://agent_worker_owner@127.0.0.1:${PG_PORT:-54329}/agent_worker" \
    agent-worker db upgrade
else
  agent-worker db upgrade
fi
exec python -m agent_worker.demo.orchestrate "$@"
