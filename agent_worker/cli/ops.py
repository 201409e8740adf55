"""Commands that run the fleet: migrate, worker, beat, metrics, demo.

``worker`` and ``beat`` are thin wrappers: they exec ``celery -A agent_worker.tasks …`` with
our defaults (the lap queues this worker serves plus ``maint``), so signals
(SIGTERM soft shutdown) reach Celery itself, not a wrapper process. Anything
after the known options passes through to Celery unchanged.

Each command imports what it runs on (Alembic, SQLAlchemy, Prometheus, the
settings, Celery's routing) in its own body: ``agent-worker --help`` loads
this module to list the commands and must not pay for any of it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from agent_worker.cli.common import (
    FAILED,
    JsonOpt,
    client,
    console,
    emit_json,
    now,
    report,
    sql_store,
    styled_status,
)
from agent_worker.core.constants import MAINT_QUEUE

db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
    json_out: JsonOpt = False,
) -> None:
    """Apply migrations (safe while workers run; concurrent upgrades serialise)."""
    # lazy (see the module's docstring)
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from agent_worker.core.settings import get_settings  # lazy, as above
    from agent_worker.store.migrate import upgrade

    url = get_settings().database_url
    upgrade(url, revision)

    engine = create_engine(url, hide_parameters=True)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    shown = make_url(url).render_as_string(hide_password=True)
    if json_out:
        emit_json({"database": shown, "revision": current})
    else:
        console.print(f"database {escape(shown)} is at revision {current}")


def _has(args: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") or (len(f) == 2 and a.startswith(f) and
                                                   len(a) > 2) for a in args for f in flags)


def worker_argv(extra: list[str], *, queues: str | None = None) -> list[str]:
    """``celery -A agent_worker.tasks worker`` with the lap queues this process serves."""
    # lazy (see the module's docstring)
    from agent_worker.api import _load_agents
    from agent_worker.core.settings import get_settings
    from agent_worker.tasks.routing import lap_queue, served_pairs

    s = get_settings()
    _load_agents(s.agent_modules)
    argv = [sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "worker"]
    if not _has(extra, "-Q", "--queues"):
        served = queues or ",".join([lap_queue(n, v) for n, v in served_pairs(s)]
                                    + [MAINT_QUEUE])
        argv += ["--queues", served]
    if not _has(extra, "-l", "--loglevel"):
        argv += ["--loglevel", "INFO"]
    if "--without-mingle" not in extra and "--with-mingle" not in extra:
        argv.append("--without-mingle")
    return argv + extra


def beat_argv(extra: list[str], *, schedule: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "beat"]
    if not _has(extra, "-l", "--loglevel"):
        argv += ["--loglevel", "INFO"]
    if schedule is not None:
        argv += ["--schedule", schedule]
    return argv + extra


def _exec(argv: list[str], dry_run: bool, json_out: bool) -> None:
    if dry_run:
        if json_out:
            emit_json({"argv": argv})
        else:
            console.print(" ".join(argv), markup=False)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


DryRun = Annotated[bool, typer.Option(help="Print the celery command instead of running it.")]


def worker(
    ctx: typer.Context,
    queues: Annotated[str | None, typer.Option(
        help="Queues to consume (default: laps.<agent>.v<version> for every agent version "
             "this worker serves, plus maint).")] = None,
    dry_run: DryRun = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a Celery worker (extra arguments go to `celery worker`, e.g. --concurrency 4)."""
    _exec(worker_argv(list(ctx.args), queues=queues), dry_run, json_out)


def beat(
    ctx: typer.Context,
    schedule: Annotated[str | None, typer.Option(help="Beat's schedule file.")] = None,
    dry_run: DryRun = False,
    json_out: JsonOpt = False,
) -> None:
    """Run celery beat, which schedules the sweeper (run exactly one)."""
    _exec(beat_argv(list(ctx.args), schedule=schedule), dry_run, json_out)


def metrics(
    port: Annotated[int | None, typer.Option(help="Port (default AGENT_WORKER_METRICS_PORT).")]
    = None,
    addr: Annotated[str | None, typer.Option(
        help="Address to listen on (default AGENT_WORKER_METRICS_BIND: 127.0.0.1).")] = None,
    once: Annotated[bool, typer.Option(help="Print one scrape and exit instead of "
                                            "serving.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Serve the Prometheus endpoint at /metrics (read from the store at each scrape).
    Its figures are every tenant's: the principal must act across tenants."""
    # lazy (see the module's docstring)
    from prometheus_client import generate_latest

    from agent_worker.core import logs  # lazy, as above
    from agent_worker.deploy_checks import check_deploy_secrets
    from agent_worker.metrics import registry_for, serve

    aw = client()
    aw.fleet_view("metrics")
    settings = aw.rt.settings
    store = sql_store()
    if once:
        registry = registry_for(store, settings)
        if json_out:
            emit_json({m.name: [{"name": s.name, "labels": s.labels, "value": s.value}
                                for s in m.samples] for m in registry.collect()})
        else:
            sys.stdout.write(generate_latest(registry).decode())
        return
    check_deploy_secrets(settings, os.environ)
    logs.configure(json_lines=settings.log_json)
    chosen = port if port is not None else settings.metrics_port
    addr = addr if addr is not None else settings.metrics_bind
    thread = serve(store, settings, port=chosen, addr=addr)
    if json_out:
        emit_json({"url": f"http://{addr}:{chosen}/metrics"})
    else:
        console.print(f"serving metrics on http://{addr}:{chosen}/metrics")
    while thread.is_alive():  # until SIGTERM/SIGINT
        thread.join(timeout=3600)


def demo(
    runs: Annotated[int, typer.Option(min=1, max=100, help="How many refund-desk runs.")] = 3,
    orders: Annotated[int, typer.Option(min=1, max=16, help="Orders per run.")] = 6,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for all runs.")] = 300.0,
    json_out: JsonOpt = False,
) -> None:
    """Start RUNS refund-desk runs, wait for them, print a summary (needs workers with
    AGENT_WORKER_VENDOR_URL; deploy/local/demo.sh sets everything up)."""
    aw = client()
    started = [aw.start_run("refund-desk", {"orders": orders}) for _ in range(runs)]
    t0 = time.monotonic()
    if not json_out:
        console.print(f"started {runs} refund-desk runs; waiting (workers must be running)")
    finished = []
    for run in started:
        left = max(0.1, timeout - (time.monotonic() - t0))
        finished.append(aw.wait(run.id, left))
    rows: list[dict[str, Any]] = [{
        "id": r.id, "status": r.status, "laps": r.lap, "recoveries": r.recoveries,
        "cost": str(aw.cost(r)), "refunded_cents": (r.result or {}).get("total_cents")
        if isinstance(r.result, dict) else None,
        "seconds": round(((r.finished_at or now()) - r.created_at).total_seconds(), 2),
        "error": r.error_message} for r in finished]
    vendor = _vendor_stats()
    ok = all(r["status"] == "succeeded" for r in rows)
    if json_out:
        emit_json({"runs": rows, "succeeded": sum(r["status"] == "succeeded" for r in rows),
                   "vendor": vendor})
    else:
        table = Table(box=None, header_style="bold")
        for col in ("RUN", "STATUS", "LAPS", "RECOVERIES", "REFUNDED", "COST", "SECONDS"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["id"], styled_status(r["status"]), str(r["laps"]),
                          str(r["recoveries"]), str(r["refunded_cents"] or "-"), r["cost"],
                          str(r["seconds"]))
        console.print(table)
        if vendor is not None:
            console.print(f"vendor: {vendor.get('refunds')} refunds, "
                          f"{vendor.get('duplicates')} duplicates, "
                          f"{vendor.get('total_cents')} cents")
    if not ok:
        raise typer.Exit(report(FAILED, "demo_failed", "not every demo run succeeded",
                                as_json=json_out))


def _vendor_stats() -> dict[str, Any] | None:
    url = os.environ.get("AGENT_WORKER_VENDOR_URL")
    if not url:
        return None
    from agent_worker.demo.vendor import VendorClient  # lazy (see the module's docstring)

    try:
        with VendorClient(url) as v:
            stats: dict[str, Any] = v.stats()
            return stats
    except Exception as e:  # the summary still stands without the vendor's view
        return {"error": str(e)}


__all__ = [
    "PASS_THROUGH",
    "beat",
    "beat_argv",
    "db_app",
    "demo",
    "metrics",
    "worker",
    "worker_argv",
]
