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
from typing import TYPE_CHECKING, Any, Literal, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from agent_worker.children import Child, StartChildren
from agent_worker.core.errors import AgentDefinitionError, InvalidStateError
from agent_worker.core.messages import ToolSpec
from agent_worker.core.untrusted import check_name
from agent_worker.core.vocabulary import ChildWait

if TYPE_CHECKING:
    from agent_worker.core.runstate import StateDraft

ToolKind = Literal["read", "idempotent", "compensatable", "irreversible"]
ControlKind = Literal["sleep", "signal", "state"]


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
    #: Set by the engine (``engine.progress``); ``None`` outside a lap.
    beat: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)

    def heartbeat(self, progress: Any = None) -> None:
        """Say that this long call is alive: extends the lap's lease now and
        records ``progress`` (any JSON value, e.g. ``{"done": 40, "of": 100}``)
        where ``runs show`` displays it while the lap runs.

        Raises ``LeaseLost`` or ``RunCancelled`` (``BaseException``s: do not
        catch them) when the lap must stop, so a long tool stops with it.
        """
        if self.beat is not None:
            self.beat(progress)

    #: The run's plan, next action and facts as this lap leaves them; only
    #: ``read`` tools get it (see ``_state``).
    state: StateDraft | None = None

    def _state(self) -> StateDraft:
        """Only a ``read`` tool may write the run's state: it runs again on
        every replay, so its writes are made again. A journaled tool's result
        is reused from the ledger without calling it, so its writes would be
        lost on replay: refused, loudly, rather than kept only sometimes."""
        if self.state is None:
            raise InvalidStateError(
                "only read tools may write the run's plan, next action or facts (a "
                "journaled tool is not called again on replay, so its writes would be lost)")
        return self.state

    def set_plan(self, steps: list[str] | list[dict[str, Any]]) -> None:
        """Replace the run's plan (``StateDraft.set_plan``); stored by the lap's commit."""
        self._state().set_plan(steps)

    def mark_step(self, step: int, done: bool = True) -> None:
        """Mark plan step ``step`` (1-based) done or not done."""
        self._state().mark_step(step, done)

    def set_next_action(self, text: str | None) -> None:
        """Record the run's next planned action."""
        self._state().set_next_action(text)

    def pin_fact(self, key: str, value: Any) -> None:
        """Pin a fact (``None`` unpins): in every later lap's system context."""
        self._state().pin_fact(key, value)

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
    #: ``False``: the call runs alone, never overlapping another call of its turn.
    parallel: bool = True
    #: Seconds one attempt may take (``engine.policy``); ``None``: no limit.
    timeout: float | None = None
    #: Extra attempts after a ``RetryableToolError`` (or a timeout a retry is
    #: safe for), waiting ``backoff * 2**n`` seconds before attempt ``n + 1``.
    retries: int = 0
    backoff: float = 1.0

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


def _check_policy(name: str, timeout: float | None, retries: int, backoff: float) -> None:
    """Refuse a policy that cannot mean anything (bool is an int: refused too)."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not timeout > 0):
        raise AgentDefinitionError(f"tool {name}: timeout must be a positive number of "
                                   f"seconds or None, not {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise AgentDefinitionError(f"tool {name}: retries must be an integer from 0 to 100, "
                                   f"not {retries!r}")
    if (isinstance(backoff, bool) or not isinstance(backoff, int | float)
            or not 0 <= backoff <= 3600):
        raise AgentDefinitionError(f"tool {name}: backoff must be from 0 to 3600 seconds, "
                                   f"not {backoff!r}")


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
    parallel: bool = True,
    timeout: float | None = None,
    retries: int = 0,
    backoff: float = 1.0,
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
    parallel: bool = True,
    timeout: float | None = None,
    retries: int = 0,
    backoff: float = 1.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool. Use bare (``@tool``) or with options (``@tool(kind=...)``).

    A parameter named ``ctx`` (or annotated ``ToolContext``) receives the call's
    context, including its idempotency key; every other parameter is described
    to the model and validated. ``parallel=False`` makes every call of the tool
    run alone; ``timeout``, ``retries`` and ``backoff`` are its call policy
    (``engine.policy``; README, "Tool policies").

    Raises:
        AgentDefinitionError: a policy value out of range.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        tool_name = check_name(name or f.__name__, "tool name")
        _check_policy(tool_name, timeout, retries, backoff)
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
            parallel=parallel,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
        )

    return wrap(fn) if fn is not None else wrap
