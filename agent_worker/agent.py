"""Agent definitions and the registry workers resolve runs against.

A run records the agent name and version it started on. A worker resolves it
to an agent it serves: the same version, or a newer one that declares it can
resume that version (``resumes``), migrating the checkpoint with ``migrate``.
Otherwise the run waits for a worker that serves it; it is never run by the
wrong code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel

from agent_worker.core.budget import Budget
from agent_worker.core.checkpoint import Checkpoint
from agent_worker.core.errors import AgentDefinitionError, UnknownAgentError
from agent_worker.core.redaction import Redactor, redact_secrets
from agent_worker.core.untrusted import check_name
from agent_worker.model.pricing import DEFAULT_PRICES, PriceTable
from agent_worker.model.protocol import ModelClient
from agent_worker.summary import Summarizer, extractive_summary
from agent_worker.tools import Tool

ModelFactory = Callable[[], ModelClient]
Retention = Literal["full", "shallow"]


@dataclass(frozen=True)
class Agent:
    """What a run executes: a model, tools, instructions and limits.

    ``model`` is a client or a zero-argument factory (called once per worker
    process, so clients holding sockets are never shared across fork). With
    ``compact_after`` set, once that many messages have fallen out of the
    ``window_messages`` window they are folded into a recorded summary.
    ``redact`` rewrites every string of a tool's result and its error text
    before they are stored or logged (``agent_worker.core.redaction``); ``None``
    keeps them as the tool produced them.
    """

    name: str
    model: ModelClient | ModelFactory
    tools: Sequence[Tool] = ()
    instructions: str = ""
    version: str = "1"
    budget: Budget = field(default_factory=Budget)
    input_model: type[BaseModel] | None = None
    window_messages: int = 40
    window_tokens: int = 100_000
    compact_after: int | None = None
    summarize: Summarizer = extractive_summary
    retention: Retention = "full"
    approval_owner: str | None = None
    approval_timeout: timedelta = timedelta(days=7)
    on_approval_timeout: Literal["reject", "approve", "escalate"] = "reject"
    escalate_to: str | None = None
    resumes: tuple[str, ...] = ()
    migrate: Callable[[Checkpoint, str], Checkpoint] | None = None
    prices: dict[str, Any] | None = None
    redact: Redactor | None = redact_secrets
    #: How many calls of one model turn may run at once (README, "Parallel tool
    #: calls"); ``None``: ``AGENT_WORKER_MAX_PARALLEL_CALLS``; ``1``: one by one.
    max_parallel_calls: int | None = None
    #: Fair share (``agent_worker.fairshare``): most laps of this agent in
    #: flight fleet-wide, and the model provider key whose cap it counts under.
    concurrency: int | None = None
    provider_key: str | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.name}: duplicate tool names {sorted(duplicates)}")
        if not self.name or not self.version:
            raise ValueError("an agent needs a name and a version")
        check_name(self.name, "agent name")
        check_name(self.version, "agent version", max_chars=50)
        limit = self.max_parallel_calls
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not 1 <= limit <= 256):
            raise AgentDefinitionError(f"agent {self.name}: max_parallel_calls must be an "
                                       f"integer from 1 to 256 or None, not {limit!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise AgentDefinitionError(f"agent {self.name}: concurrency must be at least 1")
        if self.provider_key is not None:
            check_name(self.provider_key, "provider key")
        irreversible = sorted(t.name for t in self.tools if t.kind == "irreversible")
        if self.on_approval_timeout == "approve" and irreversible:
            # The sweeper would run them as system:timeout, with no human.
            raise AgentDefinitionError(
                f"agent {self.name}: on_approval_timeout='approve' would run irreversible "
                f"tools {irreversible} without a human; use 'reject' or 'escalate'")

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None`` if the model made it up."""
        return next((t for t in self.tools if t.name == name), None)

    def client(self) -> ModelClient:
        """The model client: the one given, or the factory's, built on first use."""
        return self._client

    @cached_property
    def _client(self) -> ModelClient:
        # Decided once (the definition is frozen): isinstance against a
        # runtime-checkable protocol inspects each of its members, about
        # 7 µs on every lap. A factory's client is owned by this definition
        # (and so by the registry holding it), not by a process-wide cache
        # keyed by name: a test's or a redeploy's fresh definition gets a
        # fresh client, and dropping one frees its client.
        if isinstance(self.model, ModelClient):
            return self.model
        return self.model()

    @cached_property
    def price_table(self) -> PriceTable:
        """Prices for this agent's cost accounting, parsed once per process."""
        return PriceTable.from_json(self.prices) if self.prices else DEFAULT_PRICES

    def serves(self, version: str) -> bool:
        """Whether runs started on ``version`` can be resumed by this definition."""
        return version == self.version or version in self.resumes


AGENTS_ENTRY_POINT_GROUP = "agent_worker.agents"
"""The entry point group an installed package lists its agent modules (or
``Agent`` objects) in, for example in its pyproject.toml::

    [project.entry-points."agent_worker.agents"]
    billing = "billing.agents"
"""


class Registry:
    """Agents this process knows, by name and version."""

    def __init__(self) -> None:
        self._agents: dict[tuple[str, str], Agent] = {}

    def register(self, agent: Agent) -> Agent:
        """Add ``agent`` (re-registering the same name and version replaces it)."""
        self._agents[(agent.name, agent.version)] = agent
        return agent

    def get(self, name: str, version: str | None = None) -> Agent:
        """The agent to start a run with: the named version, else the newest.

        Raises:
            UnknownAgentError: no agent of that name (and version) is registered.
        """
        if version is not None:
            found = self._agents.get((name, version))
            if found is None:
                raise UnknownAgentError(f"unknown agent {name!r} version {version!r}")
            return found
        candidates = [a for (n, _), a in self._agents.items() if n == name]
        if not candidates:
            known = ", ".join(sorted({n for n, _ in self._agents})) or "none"
            raise UnknownAgentError(f"unknown agent {name!r} (registered: {known})")
        return max(candidates, key=lambda a: _version_key(a.version))

    def resolve(self, name: str, version: str) -> Agent | None:
        """The agent that resumes runs of ``name@version`` here, if any."""
        exact = self._agents.get((name, version))
        if exact is not None:
            return exact
        return next((a for a in self.all() if a.name == name and a.serves(version)), None)

    def all(self) -> list[Agent]:
        """Every registered agent."""
        return list(self._agents.values())

    def served_versions(self) -> list[tuple[str, str]]:
        """Every (name, version) whose laps this process can run."""
        pairs = {(a.name, v) for a in self.all() for v in (a.version, *a.resumes)}
        return sorted(pairs)

    def import_modules(self, modules: Iterable[str]) -> None:
        """Import agent modules so their ``register`` calls run."""
        for module in modules:
            if module.strip():
                importlib.import_module(module.strip())

    def load_agents(self, modules: Iterable[str]) -> None:
        """Import ``modules`` (``AGENT_WORKER_AGENT_MODULES``), then what every
        installed package names in the ``agent_worker.agents`` entry point
        group, so that installing a package that defines agents is enough for
        workers and clients to know them. An entry point may name a module
        (importing it registers its agents) or an ``Agent``, registered here.

        Raises:
            AgentDefinitionError: an entry point names something else.
        """
        self.import_modules(modules)
        for point in entry_points(group=AGENTS_ENTRY_POINT_GROUP):
            loaded = point.load()
            if isinstance(loaded, Agent):
                self.register(loaded)
            elif not isinstance(loaded, ModuleType):
                raise AgentDefinitionError(
                    f"entry point {point.name!r} ({point.value}) of group "
                    f"{AGENTS_ENTRY_POINT_GROUP!r} names neither a module nor an Agent")


def _version_key(version: str) -> tuple[int, ...] | tuple[str]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return (version,)


registry = Registry()


def register(agent: Agent) -> Agent:
    """Register ``agent`` in the process-wide registry workers resolve runs from."""
    return registry.register(agent)
