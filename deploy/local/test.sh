#!/usr/bin/env bash
# The test suite, on a fresh machine, as root: install, start the local
# Postgres and Redis, run every test (integration and chaos included).
#
# With no arguments (what CI runs): everything but the chaos suite and the slow
# tests on both cores (pytest-xdist; each xdist worker has its own test
# database and Redis database), then the chaos suite and the slow tests alone,
# because they measure recovery times and must not share the machine, then the
# chaos suite's kill storm again under the threads pool, then the real-worker
# tests once more with every runtime dependency at its declared floor. With
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
# --durations: each phase's slowest tests in the log, so a test's quiet time
# (and its timeout's margin of at least 3x) can be read from any CI run.
python -m pytest -q -p no:benchmark -n 2 --dist loadgroup --durations=25 \
    -m "not chaos and not slow" || status=$?
# The chaos suite's kill storm runs once under each pool: here under prefork
# with the short timings (a large workload, recoveries overlapping), below under
# the threads pool that deploy/ runs with the default timings (lease 10 s), so a
# recovery only short timings make quick cannot hide under the deployed pool.
# Its invariants (no duplicate, no lost effect, every lap committed once) hold
# in both.
storm=tests/chaos/test_chaos_suite.py::test_chaos_suite
python -m pytest -q --durations=25 -m "chaos or slow" --deselect "$storm[default]" \
    || status=$?
AGENT_WORKER_TEST_POOL=threads python -m pytest -q -m chaos "$storm[default]" || status=$?
# The floors. Each ">=" in pyproject.toml is a promise that only the newest
# versions (.venv, above) would otherwise test: a virtual environment of its own
# with every runtime dependency at exactly its floor (constraints/floors.txt;
# the dev tools at their newest) runs the durable path through real
# `celery -A agent_worker.tasks worker` processes (lap loop, exactly-once
# effects, pauses, beat's schedules, the store's conformance suite on Postgres)
# and the tests of the floors raised for a reason (croniter's DST days, the
# provider SDKs, flower, typer, starlette, alembic's migrations). About 3 minutes
# of tests, plus the install.
floors_venv=.data/floors-venv
floors_log="$(mktemp "${TMPDIR:-/tmp}/agent-worker-floors.XXXXXX")"
rm -rf "$floors_venv"
if python3 -m venv "$floors_venv" >"$floors_log" 2>&1 \
    && "$floors_venv/bin/python" -m pip install -q -c constraints/floors.txt -e '.[dev]' \
        >>"$floors_log" 2>&1; then
    # -W: starlette's TestClient before 1.6 names anyio.abc.BlockingPortal, an
    # alias anyio 4.15 deprecated; only the tests import the TestClient.
    ( . "$floors_venv/bin/activate" && python -m pytest -q -p no:benchmark -n 2 --dist loadgroup \
        -m "not chaos and not slow and not browser" \
        -W "ignore:The anyio.abc.BlockingPortal alias is deprecated:DeprecationWarning" \
        tests/integration/test_lap_loop.py tests/integration/test_effects.py \
        tests/integration/test_pauses.py tests/integration/test_schedules_beat.py \
        tests/store/test_conformance.py \
        tests/store/test_migrations.py::test_upgrade_from_empty_matches_models \
        tests/integration/test_providers.py tests/integration/test_flower.py \
        tests/integration/test_webauth.py tests/integration/test_metrics.py \
        tests/unit/test_crontimes.py tests/unit/test_cli_startup.py \
        tests/engine/test_tracing.py tests/engine/test_schedules_cli.py ) || status=$?
else
    echo "test: the floors' virtual environment ($floors_venv) did not install:" >&2
    cat "$floors_log" >&2
    status=1
fi
rm -f "$floors_log"
exit "$status"
