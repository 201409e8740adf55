"""Fair-share commands: ``queues`` shows who waits for what;
``share set|clear|list`` edits the per-tenant limits table (an operator's
act: the authorizer's role check lives in ``AgentWorker._share_operator``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from agent_worker.cli.common import JsonOpt, client, console, emit_json

share_app = typer.Typer(help="Fair-share limits per tenant (caps, weights, rate limits).",
                        no_args_is_help=True)

TenantArg = Annotated[str, typer.Argument(help="Tenant, or * for every tenant's default.")]
AgentOpt = Annotated[str | None, typer.Option(help="Cap this agent's runs of the tenant "
                                                   "(default: the whole tenant).")]


def _cap(value: int | None) -> str:
    return "-" if value is None else str(value)


def queues(json_out: JsonOpt = False) -> None:
    """Per tenant and agent: caps, rate limits, laps in flight, queued,
    throttled (waiting for a slot or a rate, no message in Redis) and the
    oldest wait."""
    lines = client().queues()
    if json_out:
        emit_json({"queues": lines})
        return
    table = Table("tenant", "agent", "caps t/a/t+a/provider", "weight", "per min laps/tokens",
                  "in flight", "queued", "throttled", "oldest wait")
    for q in lines:
        provider = f"{q.provider}={_cap(q.provider_cap)}" if q.provider else "-"
        caps = f"{_cap(q.tenant_cap)}/{_cap(q.agent_cap)}/{_cap(q.tenant_agent_cap)}/{provider}"
        wait = "-" if q.oldest_wait_seconds is None else f"{q.oldest_wait_seconds:.1f}s"
        table.add_row(escape(q.tenant or "(none)"), escape(q.agent), escape(caps),
                      f"{q.weight:g}", f"{_cap(q.laps_per_minute)}/{_cap(q.tokens_per_minute)}",
                      str(q.in_flight), str(q.queued), str(q.throttled), wait)
    console.print(table)


@share_app.command("set")
def share_set(
    tenant: TenantArg,
    agent: AgentOpt = None,
    concurrency: Annotated[int | None, typer.Option(
        help="Most laps in flight (0 holds every run back).")] = None,
    weight: Annotated[float | None, typer.Option(
        help="Share of contended slots, relative to other tenants (tenant rows only).")]
    = None,
    laps_per_minute: Annotated[int | None, typer.Option(
        help="Most laps the tenant starts per minute, fleet-wide (tenant rows only).")] = None,
    tokens_per_minute: Annotated[int | None, typer.Option(
        help="Most model tokens (input + output) the tenant uses per minute (tenant rows "
             "only).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Set a tenant's (or a tenant's agent's) cap, weight and rate limits."""
    row = client().set_share(tenant, agent=agent, concurrency=concurrency, weight=weight,
                             laps_per_minute=laps_per_minute,
                             tokens_per_minute=tokens_per_minute)
    if json_out:
        emit_json(row)
    else:
        weight_text = "-" if row.weight is None else f"{row.weight:g}"
        console.print(f"tenant {escape(row.tenant)} agent {escape(row.agent)}: concurrency "
                      f"{_cap(row.concurrency)}, weight {weight_text}, laps/min "
                      f"{_cap(row.laps_per_minute)}, tokens/min {_cap(row.tokens_per_minute)}")


@share_app.command("clear")
def share_clear(tenant: TenantArg, agent: AgentOpt = None, json_out: JsonOpt = False) -> None:
    """Remove a row: the defaults apply again."""
    client().clear_share(tenant, agent=agent)
    if json_out:
        emit_json({"cleared": {"tenant": tenant, "agent": agent or "*"}})
    else:
        console.print(f"cleared tenant {escape(tenant)} agent {escape(agent or '*')}")


@share_app.command("list")
def share_list(json_out: JsonOpt = False) -> None:
    """Every row of the limits table."""
    rows = client().share_limits()
    if json_out:
        emit_json({"limits": rows})
        return
    table = Table("tenant", "agent", "concurrency", "weight", "laps/min", "tokens/min",
                  "updated", "by")
    for r in rows:
        table.add_row(escape(r.tenant), escape(r.agent), _cap(r.concurrency),
                      "-" if r.weight is None else f"{r.weight:g}", _cap(r.laps_per_minute),
                      _cap(r.tokens_per_minute),
                      r.updated_at.isoformat(timespec="seconds"), escape(r.updated_by or ""))
    console.print(table)


__all__ = ["queues", "share_app"]
