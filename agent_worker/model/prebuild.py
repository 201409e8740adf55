"""Build an SDK's deferred pydantic response models before any thread races to.

The OpenAI and Anthropic SDKs declare their models with ``defer_build``: a
model's validator is built at its first use. Pydantic's rebuild is not thread
safe (pydantic issues 11849 and 13419, fixed only by a lock in later
releases): two laps of a fresh ``threads`` worker parsing their first replies
at once can see the mock validator of ``pydantic.BaseModel`` and fail with
"BaseModel cannot be instantiated directly" (seen once in 13 runs of
``bench.iobound``). The clients call ``complete`` at import, which Python's
import lock serialises, so every model a reply is parsed into is built before
a second thread can reach it.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

__all__ = ["complete"]


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic model classes an annotation names, however nested
    (``list[Choice] | None``, ``Annotated[Union[...], ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def complete(*roots: type[BaseModel]) -> int:
    """Build every deferred model reachable from ``roots`` through their fields;
    returns how many were built (none on a second call)."""
    seen: set[type[BaseModel]] = set()
    todo = list(roots)
    built = 0
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        if not model.__pydantic_complete__:
            model.model_rebuild(force=True)
            built += 1
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    return built
