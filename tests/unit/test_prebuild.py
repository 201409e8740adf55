"""The SDKs' deferred reply models are built when our clients are imported, so
concurrent first replies in a threads worker never race pydantic's rebuild."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agent_worker.model.anthropic_client import AnthropicMessage
from agent_worker.model.openai_client import ChatCompletion
from agent_worker.model.prebuild import complete


class _Leaf(BaseModel):
    model_config = ConfigDict(defer_build=True)
    n: int


class _Root(BaseModel):
    model_config = ConfigDict(defer_build=True)
    leaves: list[_Leaf] | None = None


def test_complete_builds_every_deferred_model_reachable_from_the_root() -> None:
    assert not _Root.__pydantic_complete__ and not _Leaf.__pydantic_complete__
    assert complete(_Root) == 2
    assert _Root.__pydantic_complete__ and _Leaf.__pydantic_complete__
    assert complete(_Root) == 0


def test_importing_the_clients_leaves_no_reply_model_deferred() -> None:
    """Nothing reachable from either SDK's reply type is left to build (a
    fresh interpreter builds dozens: 24 for OpenAI, 57 for Anthropic)."""
    assert ChatCompletion.__pydantic_complete__ and AnthropicMessage.__pydantic_complete__
    assert complete(ChatCompletion, AnthropicMessage) == 0
