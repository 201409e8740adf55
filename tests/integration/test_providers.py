"""Both provider clients drive multi-lap runs with tool calls through a real
worker, over HTTP, against the loopback fake server; usage is charged once
per lap even when a response is lost; the API key never lands anywhere."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import text

from agent_worker.api import AgentWorker
from agent_worker.store.db import make_engine
from tests.fakes.fake_server import FakeLLMServer
from tests.support import Fleet

pytestmark = pytest.mark.integration

CANARY = "sk-canary-0123456789abcdef"
SCRIPT: list[dict[str, Any]] = [
    {"text": "", "tool_calls": [{"name": "step", "arguments": {"n": 1}}],
     "usage": {"input": 50, "output": 10}},
    # Lap 2's first answer is produced, billed by the "provider", and lost on the
    # wire; the SDK retries. Lap 3 first gets a 429 with Retry-After.
    {"fault": "drop"},
    {"text": "", "tool_calls": [{"name": "step", "arguments": {"n": 2}}],
     "usage": {"input": 60, "output": 10}},
    {"fault": "429", "retry_after": 1},
    {"text": "", "tool_calls": [{"name": "step", "arguments": {"n": 3}}],
     "usage": {"input": 70, "output": 10}},
    {"text": "all steps done", "usage": {"input": 80, "output": 5}},
]


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(SCRIPT) as server:
        yield server


class RedisTap:
    """Every command Redis sees while the run happens (MONITOR)."""

    def __init__(self, url: str) -> None:
        self.lines: list[str] = []
        self._client = redis.Redis.from_url(url)
        self._monitor = self._client.monitor()
        self._conn = self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for cmd in self._conn.listen():
                self.lines.append(str(cmd.get("command", "")))
        except Exception:
            return

    def close(self) -> None:
        self._monitor.__exit__(None, None, None)
        self._client.close()


@pytest.mark.parametrize("agent", ["openai-agent", "anthropic-agent"])
def test_client_drives_a_run_through_a_worker(aw: AgentWorker, fleet: Fleet,
                                              llm: FakeLLMServer, agent: str,
                                              database_url: str, broker_url: str) -> None:
    env = {"AGENT_WORKER_TEST_LLM_URL": llm.url, "OPENAI_API_KEY": CANARY,
           "ANTHROPIC_API_KEY": CANARY}
    worker = fleet.worker(concurrency=1, **env)
    tap = RedisTap(broker_url)
    run = aw.start_run(agent, {"task": "three steps"})
    done = aw.wait(run.id, timeout=120)
    tap.close()
    assert done.status == "succeeded", done.error_message
    assert done.lap == 4 and done.result == "all steps done"
    tools = [m.message for m in aw.messages(run.id) if m.message.role == "tool"]
    assert [t.content for t in tools] == ['{"step": 1}', '{"step": 2}', '{"step": 3}']
    # Charged exactly what the four answers that arrived cost; the dropped one was not.
    assert (done.input_tokens, done.output_tokens) == (50 + 60 + 70 + 80, 10 + 10 + 10 + 5)
    log = llm.requests
    assert [r["outcome"] for r in log] == ["ok", "dropped", "ok", "fault:429", "ok", "ok"]
    # The retried request carried the same idempotency key as the lost one.
    keys = [r["headers"].get("idempotency-key") for r in log]
    assert keys[1] == keys[2] == f"{run.id}:2:model"
    # The key really was used on the wire...
    assert any(CANARY in str(r.get("headers")) for r in llm.requests)
    # ...and is nowhere we store, log or send.
    assert_no_canary(database_url, worker.log.read_text(errors="replace"), tap.lines)


def assert_no_canary(database_url: str, worker_log: str, redis_lines: list[str]) -> None:
    engine = make_engine(database_url)  # the system scope: every tenant's rows
    with engine.connect() as c:
        tables = [r[0] for r in c.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))]
        for table in tables:
            hit = c.execute(text(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE :p'),
                            {"p": f"%{CANARY}%"}).scalar_one()
            assert hit == 0, f"API key stored in table {table}"
    engine.dispose()
    assert CANARY not in worker_log
    assert redis_lines, "the Redis tap saw nothing; the check would be vacuous"
    assert not [line for line in redis_lines if CANARY in line]


