"""Tools: plain functions the model may call, declared with ``@tool``.

The decorator derives the JSON schema the model sees from the function's type
hints and validates the model's arguments with pydantic, so a wrong argument
becomes a tool error message the model can correct instead of a crash. Each tool
declares its *kind* (DESIGN.md, "Tool classes"), which decides what the engine
may do when a lap is replayed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from agent_worker.children import Child, StartChildren
from agent_worker.messages import ToolSpec
from agent_worker.untrusted import check_name
from agent_worker.vocabulary import ChildWait

ToolKind = Literal["read", "idempotent", "compensatable", "irreversible"]
ControlKind = Literal["sleep", "signal"]


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call it serves.

    ``idempotency_key`` is derived from the work (``run:lap:call``), so every
    replay of this call carries the same key: pass it to the provider (e.g. an
    ``Idempotency-Key`` header) and a repeated call cannot land twice.
    """

    run_id: str
    lap: int
    call_index: int
    idempotency_key: str
    tenant: str | None = None

    def start_children(self, children: Sequence[Child], *,
                       wait: ChildWait = "all") -> StartChildren:
        """What to return to start child runs and wait for them: ``all`` of
        them, or ``any`` (the first to end). The engine starts each exactly once
        (ids derived from this call's key) and resumes the run with their
        results; see ``agent_worker.children``. Declare such a tool
        ``kind="idempotent"`` (or ``read``)."""
        return StartChildren(children=tuple(children), wait=wait)


LookupFn = Callable[[str], Any]
CompensateFn = Callable[..., Any]


@dataclass(frozen=True)
class Tool:
    """A callable the model may ask for, with what replaying it is allowed to do."""

    name: str
    description: str
    kind: ToolKind
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    version: str = "1"
    wants_context: bool = False
    needs_approval: bool = False
    lookup_fn: LookupFn | None = None
    compensate_fn: CompensateFn | None = None
    control: ControlKind | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    @property
    def journaled(self) -> bool:
        """Whether calls go through the effect ledger (everything but reads)."""
        return self.kind != "read"

    @property
    def requires_approval(self) -> bool:
        """Irreversible tools always ask a human; others when declared."""
        return self.needs_approval or self.kind == "irreversible"

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """Parse the model's arguments; raises ``pydantic.ValidationError``."""
        return self.args_model.model_validate(arguments)

    def invoke(self, args: BaseModel, ctx: ToolContext) -> Any:
        """Call the function with validated arguments."""
        kwargs = dict(args)
        if self.wants_context:
            kwargs["ctx"] = ctx
        return self.fn(**kwargs)

    def lookup(self, lookup_fn: LookupFn) -> LookupFn:
        """Decorator: register ``lookup(key) -> result | None`` that asks the
        outside world whether the call with ``key`` already landed."""
        object.__setattr__(self, "lookup_fn", lookup_fn)
        return lookup_fn

    def compensator(self, fn: CompensateFn) -> CompensateFn:
        """Decorator: register the undo of this tool, called as
        ``fn(args: dict, result, ctx)``; makes the tool compensatable."""
        object.__setattr__(self, "compensate_fn", fn)
        object.__setattr__(self, "kind", "compensatable")
        return fn

    def with_version(self, version: str) -> Tool:
        """A copy declared at another version (the ledger records it)."""
        return replace(self, version=version)


def _args_model(fn: Callable[..., Any], name: str) -> tuple[type[BaseModel], bool]:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    wants_context = False
    for param in inspect.signature(fn).parameters.values():
        if param.name == "ctx" or hints.get(param.name) is ToolContext:
            wants_context = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args/**kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model: type[BaseModel] = create_model(
        f"{name}_args", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model, wants_context


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    kind: ToolKind = "read",
    version: str = "1",
    description: str | None = None,
    approval: bool = False,
    lookup: LookupFn | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    kind: ToolKind = "read",
    version: str = "1",
    description: str | None = None,
    approval: bool = False,
    lookup: LookupFn | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool. Use bare (``@tool``) or with options (``@tool(kind=...)``).

    A parameter named ``ctx`` (or annotated ``ToolContext``) receives the call's
    context, including its idempotency key; every other parameter is described
    to the model and validated.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        tool_name = check_name(name or f.__name__, "tool name")
        args_model, wants_context = _args_model(f, tool_name)
        return Tool(
            name=tool_name,
            description=description or inspect.getdoc(f) or tool_name,
            kind=kind,
            fn=f,
            args_model=args_model,
            version=version,
            wants_context=wants_context,
            needs_approval=approval,
            lookup_fn=lookup,
        )

    return wrap(fn) if fn is not None else wrap
