#!/usr/bin/env bash
# The test suite, on a fresh machine, as root: install, start the local
# Postgres and Redis, run every test (integration and chaos included).
#
# With no arguments (what CI runs): everything but the chaos suite and the slow
# tests on both cores (pytest-xdist; each xdist worker has its own test
# database and Redis database), then the chaos suite and the slow tests alone,
# because they measure recovery times and must not share the machine, then the
# chaos suite's kill storm again under the threads pool. With
# arguments: one plain pytest run with them (`-m "not chaos"`, a file, `-k`).
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/install.sh
# The checkout's virtual environment (install.sh made it): python, agent-worker
# and celery below, and every process they start, are the ones installed there.
. .venv/bin/activate
deploy/local/services.sh start
if [ "$#" -gt 0 ]; then
    exec python -m pytest -q "$@"
fi
status=0
# Lint and types first: cheap, and a failure here is the quickest to read.
ruff check agent_worker tasks store tests bench || status=$?
mypy || status=$?
# The documentation site (docs/, mkdocs.yml): --strict fails on a broken link,
# a missing page or a stale generated reference; quiet unless it fails.
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$site" || status=$?
rm -rf "$site"
# --dist loadgroup: tests marked xdist_group (the browser tests, which share one
# console, worker and browser per module) stay on one xdist worker; the rest
# are spread as before.
python -m pytest -q -p no:benchmark -n 2 --dist loadgroup -m "not chaos and not slow" || status=$?
python -m pytest -q -m "chaos or slow" || status=$?
# The chaos suite once more under the threads pool, the one deploy/ runs: its
# invariants (no duplicate, no lost effect, every lap committed once) must hold
# under the pool users deploy, not only under the prefork default.
AGENT_WORKER_TEST_POOL=threads python -m pytest -q -m chaos tests/chaos/test_chaos_suite.py \
    || status=$?
exit "$status"
