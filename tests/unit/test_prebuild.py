"""The SDKs' deferred reply models are built when our clients are imported, so
concurrent first replies in a threads worker never race pydantic's rebuild."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

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
    """In a fresh interpreter (this one's earlier tests may have parsed replies,
    which builds the models anyway), nothing reachable from either SDK's reply
    type is left to build once the clients are imported; without that import
    ``complete`` builds dozens (24 for OpenAI, 57 for Anthropic)."""
    probe = ("import agent_worker.model.anthropic_client, agent_worker.model.openai_client\n"
             "from anthropic.types import Message\n"
             "from openai.types.chat import ChatCompletion\n"
             "from agent_worker.model.prebuild import complete\n"
             "print(complete(ChatCompletion, Message))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "0"
