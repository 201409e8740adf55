"""The one plug point for models: messages and tool schemas in, assistant turn out."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agent_worker.core.messages import ModelRequest, ModelResponse


@runtime_checkable
class ModelClient(Protocol):
    """A chat model with tool calling.

    Implementations raise ``TransientModelError`` for failures worth retrying
    (the engine retries the lap with backoff), ``MalformedModelOutputError`` when
    the response cannot be parsed (also retried, up to the attempt limit),
    ``ContextLengthError`` when the window is too long, and ``ModelRefusalError``
    when the provider refuses. Any other
    exception is treated as transient.
    """

    name: str

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's next turn for ``request``."""
        ...
