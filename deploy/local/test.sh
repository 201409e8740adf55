#!/usr/bin/env bash
# The test suite, on a fresh machine, as root: install, start the local
# Postgres and Redis, run every test (integration and chaos included).
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/install.sh
deploy/local/services.sh start
exec python -m pytest -q "$@"
