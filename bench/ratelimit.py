"""Rate-limit benchmark: does a fleet held to a tenant's tokens per
minute stay below the limit and close to it, and does a provider's 429 slow
every worker?

2 workers of concurrency 4, beat and a fleet cap of 10 laps in flight on real
Postgres and Redis; the agent
(``bench.rated_agent``) calls the loopback fake provider through the real
OpenAI SDK, 900-1,100 tokens a lap, 20 laps a run. The fake provider keeps the
same tokens-per-minute limit as the fleet (a 429 with Retry-After when a
request would take its last 60 s over it). Tenant ``t`` gets the limit through
the share table (``set_share(tokens_per_minute=...)``) and enough runs to ask
for several times the limit for ``--minutes``; one 429 is also injected a
third of the way in, while laps flow, to see the pause reach every worker.

Reported, from the fake provider's own log of answered requests: the most
tokens in any 60 s window (must stay at or below the limit), the mean rate
over the whole run and over its minutes after the first (against the limit),
how many 429s the provider sent, and the requests that reached it in the
``Retry-After`` seconds after the injected 429 against the same span before
it (after it only laps already sent can arrive: at most the fleet cap).

    python -m bench.ratelimit                   # 5 minutes, as in the issue
    python -m bench.ratelimit --minutes 2       # a shorter look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import RedisDb, create_database, drop_database, sa_url, settings_from
from tests.support import ROOT, Fleet

TENANT = "t"
#: The pause the injected 429 asks for, in seconds.
INJECTED_RETRY_AFTER = 5.0


def window_peak(served: list[tuple[float, int]], seconds: float = 60.0) -> int:
    """The most tokens answered in any window of ``seconds`` (``served``:
    (time, tokens), in time order): each window ending at an answer."""
    peak, start, total = 0, 0, 0
    for at, tokens in served:
        total += tokens
        while served[start][0] <= at - seconds:
            total -= served[start][1]
            start += 1
        peak = max(peak, total)
    return peak


def summarize(log: list[dict[str, Any]], limit: int, t0: float, t1: float,
              injected_at: float | None) -> dict[str, Any]:
    """The figures of the module docstring, from the fake provider's log."""
    served = sorted((e["at"], e["usage"]["input"] + e["usage"]["output"])
                    for e in log if e.get("outcome") == "ok")
    minutes = (t1 - t0) / 60
    steady = [n for at, n in served if at >= t0 + 60]
    after_first = max(1e-9, (t1 - t0 - 60) / 60)
    result: dict[str, Any] = {
        "limit_tokens_per_minute": limit, "minutes": round(minutes, 2),
        "laps_answered": len(served), "tokens_answered": sum(n for _, n in served),
        "peak_60s_window": window_peak(served),
        "mean_tokens_per_minute": round(sum(n for _, n in served) / minutes),
        "mean_after_first_minute": round(sum(steady) / after_first) if steady else None,
        "provider_429s": {
            "over_its_limit": sum(1 for e in log if e.get("outcome") == "fault:429-tpm"),
            "injected": sum(1 for e in log if e.get("outcome") == "fault:429")},
    }
    result["peak_over_limit"] = result["peak_60s_window"] > limit
    result["peak_pct_of_limit"] = round(100 * result["peak_60s_window"] / limit, 1)
    if result["mean_after_first_minute"] is not None:
        result["steady_pct_of_limit"] = round(100 * result["mean_after_first_minute"] / limit,
                                              1)
    if injected_at is not None:
        span = INJECTED_RETRY_AFTER
        result["requests_around_injected_429"] = {
            "span_s": span,
            "before": sum(1 for at, _ in served if injected_at - span <= at < injected_at),
            "after": sum(1 for at, _ in served if injected_at < at <= injected_at + span)}
    return result


def _busy(llm: Any) -> bool:
    """Whether the provider is answering now (3 answers in the last second):
    the injected 429 must land while laps flow, or there is nothing to slow."""
    now = time.time()
    return sum(1 for e in llm.requests[-20:]
               if e.get("outcome") == "ok" and e["at"] > now - 1) >= 3


def measure(minutes: float, limit: int, logdir: Path) -> dict[str, Any]:
    from agent_worker.agent import registry
    from agent_worker.api import AgentWorker
    from agent_worker.runtime import Runtime
    from agent_worker.store.migrate import upgrade
    from agent_worker.store.sql import SqlStore
    from agent_worker.tasks import app
    from agent_worker.tasks.dispatch import CeleryDispatcher
    from bench import rated_agent
    from tests.fakes.fake_server import FakeLLMServer

    name = f"aw_rate_{uuid.uuid4().hex[:8]}"
    url = sa_url(create_database(name))
    upgrade(url)
    lap_tokens = 1000
    runs = math.ceil(3 * limit * minutes / lap_tokens / rated_agent.LAPS) + 8
    with RedisDb() as rdb, FakeLLMServer(rated_agent.script(),
                                         tokens_per_minute=limit) as llm:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
        env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=url,
                   AGENT_WORKER_BROKER_URL=rdb.url,
                   AGENT_WORKER_AGENT_MODULES="bench.rated_agent",
                   AGENT_WORKER_TEST_LLM_URL=llm.url, OPENAI_API_KEY="sk-bench",
                   AGENT_WORKER_RATE_TOKENS_ESTIMATE=str(lap_tokens),
                   # a little above the 8 worker slots, as README advises: bounds
                   # the laps a 429's pause cannot stop (already sent to Redis)
                   AGENT_WORKER_MAX_LAPS_IN_FLIGHT="10",
                   AGENT_WORKER_SHARE_REFRESH_SECONDS="1")
        settings = settings_from(env)
        registry.import_modules(["bench.rated_agent"])
        app.conf["broker_url"] = rdb.url
        store = SqlStore(url)
        aw = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(), settings=settings))
        fleet = Fleet(env, logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        injected_at = None
        try:
            aw.set_share(TENANT, tokens_per_minute=limit)
            for _ in range(2):
                fleet.worker(concurrency=4)
            fleet.beat()
            # Workers up and warm before the clock starts; the provider forgets the warm-up.
            aw.wait(aw.start_run(rated_agent.AGENT, "warm", tenant="warmup").id, timeout=600)
            llm.reset()
            t0 = time.time()
            for _ in range(runs):
                aw.start_run(rated_agent.AGENT, "go", tenant=TENANT)
            end = t0 + 60 * minutes
            while time.time() < end:
                if injected_at is None and time.time() >= t0 + 20 * minutes and _busy(llm):
                    llm.queue_fault("429", retry_after=INJECTED_RETRY_AFTER)
                    while not any(e.get("outcome") == "fault:429" for e in llm.requests):
                        time.sleep(0.05)
                    injected_at = next(e["at"] for e in llm.requests
                                       if e.get("outcome") == "fault:429")
                time.sleep(0.05 if injected_at is None else 0.5)
            t1 = time.time()
            log = [e for e in llm.requests if e["at"] <= t1]
        finally:
            fleet.close()
            store.dispose()
            drop_database(name)
    return {"workers": "2 x concurrency 4", "runs": runs, "laps_per_run": rated_agent.LAPS,
            **summarize(log, limit, t0, t1, injected_at)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--tokens-per-minute", type=int, default=120_000)
    p.add_argument("--logdir", type=Path, default=ROOT / "bench" / "results" / "ratelimit")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.tokens_per_minute < 1000:
        p.error("--minutes must be above 0 and --tokens-per-minute at least 1000")
    result = measure(args.minutes, args.tokens_per_minute, args.logdir)
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
