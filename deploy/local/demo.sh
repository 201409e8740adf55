#!/usr/bin/env bash
# The main job, on a fresh machine, as root: install what is missing, start a
# project-local Postgres and Redis (unless AGENT_WORKER_DATABASE_URL /
# AGENT_WORKER_BROKER_URL point elsewhere), migrate, then run the demo.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/install.sh
if [ -z "${AGENT_WORKER_DATABASE_URL:-}" ] || [ -z "${AGENT_WORKER_BROKER_URL:-}" ]; then
  deploy/local/services.sh start
fi
agent-worker db upgrade
exec python -m agent_worker.demo.orchestrate "$@"
