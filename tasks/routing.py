"""Per-version lap queues: a lap goes to a queue only workers that serve its
agent version consume, so after a deploy old-version laps wait for an old
worker (or a new one that declares it resumes that version) instead of being
run by the wrong code."""

from __future__ import annotations

from agent_worker.agent import registry
from agent_worker.core.constants import LAPS_QUEUE
from agent_worker.core.settings import Settings


def lap_queue(agent: str, version: str) -> str:
    return f"{LAPS_QUEUE}.{agent}.v{version}"


def served_pairs(settings: Settings) -> list[tuple[str, str]]:
    """The (agent, version) pairs this worker consumes: configured, or all it has."""
    if settings.worker_versions.strip():
        pairs = []
        for item in settings.worker_versions.split(","):
            name, _, version = item.strip().partition("@")
            pairs.append((name, version or "1"))
        return pairs
    return registry.served_versions()
