"""Model clients: the protocol, a scripted model, and real providers."""

from agent_worker.model.protocol import ModelClient
from agent_worker.model.scripted import ScriptedModel, turn

__all__ = ["ModelClient", "ScriptedModel", "turn"]
