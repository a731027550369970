"""Tools: definitions from plain functions, their schemas, the registry and invocation."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import typing
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NoReturn

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo

from .errors import ConfigurationError, ToolInputError, ToolNotPermittedError, UnknownToolError
from .messages import ToolSpec

ToolKind = Literal["read", "action", "agent"]
# What becomes of an approval nobody gave within the tool's `approval_timeout`.
OnTimeout = Literal["reject", "approve", "escalate"]
ON_TIMEOUT: tuple[OnTimeout, ...] = ("reject", "approve", "escalate")
TOOL_KINDS: tuple[str, ...] = ("read", "action", "agent")

Roles = Callable[[str], Iterable[str]]


@dataclass(frozen=True)
class ToolContext:
    """What a handler may ask for with a `ctx` keyword argument."""

    run_id: str
    step: str
    call_id: str
    actor: str
    idempotency_key: str  # "<run_id>:<step>": the same for every attempt of this call
    answers: dict[str, Any] | None = None  # a person's answers, once the tool asked

    def ask(self, questions: list[dict[str, Any]] | list[str]) -> NoReturn:
        """Ask the person questions; the run waits, then calls the tool again with
        `ctx.answers` set. Each question is a string or `{"id", "question", ...}`."""
        normalised = [
            q if isinstance(q, dict) else {"id": f"q{i}", "question": q}
            for i, q in enumerate(questions, start=1)
        ]
        raise QuestionsAsked(normalised)


@dataclass(frozen=True)
class ReconcileContext(ToolContext):
    """What a tool's `reconcile` is asked with: the call (`tool`, `args`) and its
    idempotency key, after a worker died while the handler ran."""

    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)


# A tool's `reconcile(ctx)`: the call's result if it finds the call took effect (looked up
# by `ctx.idempotency_key`), or None when it cannot tell (a person then decides).
Reconciler = Callable[[ReconcileContext], Any]


class QuestionsAsked(Exception):
    """Raised by `ToolContext.ask`: the tool needs a person's answers to go on."""

    def __init__(self, questions: list[dict[str, Any]]) -> None:
        self.questions = questions
        super().__init__(f"{len(questions)} question(s) for the person")


# The roles the doors know by name. `service`: a backend acting for its users — it starts
# runs for other actors, reads and steers every run, answers any run's questions.
# `operator`: a person who looks after the system — reads every run and may pause,
# resume, cancel, retry, fork and reconcile any, but decides calls only as its other roles
# allow and starts runs only as itself.
SERVICE_ROLE = "service"
OPERATOR_ROLE = "operator"


class RolesPolicy:
    """Maps an actor to its roles and decides who may run or approve a tool."""

    def __init__(self, roles: Mapping[str, Iterable[str]] | Roles | None = None) -> None:
        self._roles = roles

    def roles_of(self, actor: str) -> frozenset[str]:
        if self._roles is None:
            return frozenset()
        if callable(self._roles):
            return frozenset(self._roles(actor))
        return frozenset(self._roles.get(actor, ()))

    def holders(self, roles: Iterable[str]) -> list[str] | None:
        """The actors that hold one of `roles`, when the policy is a table; None when it is
        a function (who holds a role cannot be listed)."""
        if self._roles is None:
            return []
        if callable(self._roles):
            return None
        wanted = set(roles)
        return sorted(actor for actor, held in self._roles.items() if wanted & set(held))

    def may_use(self, tool: Tool, actor: str) -> bool:
        return tool.roles is None or bool(tool.roles & self.roles_of(actor))

    def may_approve(self, tool: Tool, actor: str, approvers: Iterable[str] | None = None) -> bool:
        """Whether `actor`'s decision on a call of `tool` counts: a role among the tool's
        approvers, or among `approvers` when given (an escalated call's)."""
        allowed = frozenset(approvers) if approvers is not None else tool.approvers
        return allowed is None or bool(allowed & self.roles_of(actor))


_RESULT = TypeAdapter(Any)


class Tool:
    """One tool: a handler, its kind, who may use it, and its input model.

    The description is the docstring's summary and body, without its sections (Args,
    Returns, Raises, Examples, ...); a parameter's description comes from
    `Annotated[..., Field(description=...)]` or, failing that, from the docstring's
    Args (Google), `:param:` (Sphinx) or Parameters (NumPy) entry. An `async def`
    handler is awaited to completion.
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        kind: ToolKind,
        name: str | None = None,
        description: str | None = None,
        roles: Iterable[str] | None = None,
        approvers: Iterable[str] | None = None,
        queue: str | None = None,
        approval_timeout: float | None = None,
        on_timeout: OnTimeout = "reject",
        escalate_to: Iterable[str] | None = None,
        idempotent: bool | None = None,
        reconcile: Reconciler | None = None,
    ) -> None:
        if kind not in ("read", "action"):
            raise ConfigurationError(
                f"tool kind must be 'read' or 'action', not {kind!r} "
                "(name an agent in `tools` to delegate)"
            )
        name = name or handler.__name__
        (
            self.approval_timeout,
            self.on_timeout,
            self.escalate_to,
        ) = _approval_deadline(name, kind, approval_timeout, on_timeout, escalate_to)
        self.handler = handler
        self.kind: ToolKind = kind
        self.name = name
        summary, documented = _docstring(handler)
        self.description = description or summary
        self.roles = frozenset(roles) if roles is not None else None
        self.approvers = frozenset(approvers) if approvers is not None else None
        # The broker queue its calls go to in the durable runner (a CPU-bound tool on a
        # prefork worker of its own); None: the workers' queue, and run where the step
        # before it ended.
        if queue is not None and (not queue or not queue.isprintable() or "@" in queue):
            raise ConfigurationError(f"tool {self.name}: bad queue name {queue!r}")
        self.queue = queue
        self.idempotent, self.reconciler = _idempotence(name, kind, idempotent, reconcile)
        self.input_model, self.wants_ctx = _input_model(handler, self.name, documented)
        self._spec: ToolSpec | None = None

    def spec(self) -> ToolSpec:
        if self._spec is None:  # a replay asks on every pass; the schema never changes
            self._spec = ToolSpec(
                name=self.name,
                description=self.description,
                input_schema=self.input_model.model_json_schema(),
            )
        return self._spec

    def validate(self, args: Mapping[str, Any]) -> BaseModel:
        """Check `args` against the input schema; a failure is a `ToolInputError`."""
        try:
            return self.input_model.model_validate(dict(args))
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(input)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolInputError(self.name, detail) from None

    def invoke(self, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Validate, call the handler, and return its result as JSON-ready data.

        An async handler gets the same `ctx` and is run to completion here, on an event
        loop of its own for each call; `ctx.ask` and failures raise out of it as from a
        sync handler.
        """
        validated = self.validate(args)
        kwargs = {field: getattr(validated, field) for field in type(validated).model_fields}
        if self.wants_ctx:
            kwargs["ctx"] = ctx
        result = self.handler(**kwargs)
        # Asked of the result, not the handler: a sync decorator around an async
        # function is no coroutine function, yet hands back a coroutine all the same.
        if inspect.iscoroutine(result):
            result = _run_to_completion(result)
        return _RESULT.dump_python(result, mode="json")

    def reconciled(self, ctx: ReconcileContext) -> Any | None:
        """The call's result as the tool's `reconcile` finds it (JSON-ready), or None when
        the tool has none or it cannot tell. Its failures raise."""
        if self.reconciler is None:
            return None
        found = self.reconciler(ctx)
        if inspect.iscoroutine(found):
            found = _run_to_completion(found)
        return None if found is None else _RESULT.dump_python(found, mode="json")


def _idempotence(
    name: str, kind: ToolKind, idempotent: bool | None, reconcile: Reconciler | None
) -> tuple[bool, Reconciler | None]:
    """Whether a call may be run again after its worker died mid-handler, and the tool's
    `reconcile`. A read always may; an action may not unless it says so (`idempotent=True`):
    its call's outcome is then unknown, and is asked of `reconcile` or of a person."""
    if idempotent is not None and not isinstance(idempotent, bool):
        raise ConfigurationError(f"tool {name}: idempotent must be True or False")
    if kind == "read":
        if idempotent is False or reconcile is not None:
            raise ConfigurationError(
                f"tool {name}: a read is always run again after a crash; idempotent=False "
                "and reconcile are for actions"
            )
        return True, None
    chosen = bool(idempotent)  # an action is not idempotent unless it says so
    if reconcile is not None and (chosen or not callable(reconcile)):
        raise ConfigurationError(
            f"tool {name}: reconcile must be a function (ctx) -> result | None, and is "
            "for an action that is not idempotent"
        )
    return chosen, reconcile


def _approval_deadline(
    name: str,
    kind: ToolKind,
    timeout: float | None,
    on_timeout: OnTimeout,
    escalate_to: Iterable[str] | None,
) -> tuple[float | None, OnTimeout, frozenset[str] | None]:
    """An action's approval deadline, checked: seconds, what then, and who it escalates to."""
    if on_timeout not in ON_TIMEOUT:
        raise ConfigurationError(
            f"tool {name}: on_timeout must be one of {', '.join(ON_TIMEOUT)}, not {on_timeout!r}"
        )
    escalated = frozenset(escalate_to) if escalate_to is not None else None
    if timeout is None:
        if escalated is not None or on_timeout != "reject":
            raise ConfigurationError(
                f"tool {name}: on_timeout and escalate_to need an approval_timeout (seconds)"
            )
        return None, on_timeout, None
    if kind != "action":
        raise ConfigurationError(
            f"tool {name}: only an action waits for approval; approval_timeout is for actions"
        )
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise ConfigurationError(f"tool {name}: approval_timeout must be a number of seconds > 0")
    if (on_timeout == "escalate") != bool(escalated):
        raise ConfigurationError(
            f"tool {name}: on_timeout='escalate' needs escalate_to (the roles it escalates "
            "to), and escalate_to needs on_timeout='escalate'"
        )
    return float(timeout), on_timeout, escalated


def _run_to_completion(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Await a coroutine from synchronous code, in this thread if no loop runs here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # asyncio.run refuses to nest in this thread's running loop, and handing the
    # coroutine to that loop would deadlock: our synchronous caller is blocking it.
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agent-jobs-tool") as pool:
        return pool.submit(context.run, asyncio.run, coroutine).result()


def _docstring(handler: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's summary and body, and the descriptions of its parameters."""
    doc = inspect.getdoc(handler) or ""
    if not doc:
        return "", {}
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return doc, {}
    if not parsed.meta:  # no sections: the text stays exactly as written
        return doc, {}
    params = {
        param.arg_name: param.description.strip()
        for param in parsed.params
        if param.description and param.description.strip()
    }
    gap = "\n\n" if parsed.blank_after_short_description else "\n"
    parts = (parsed.short_description, parsed.long_description)
    return gap.join(part.strip() for part in parts if part and part.strip()), params


def _described(annotation: Any, default: Any) -> bool:
    """Whether the parameter carries its own `Field(description=...)`."""
    is_annotated = typing.get_origin(annotation) is Annotated
    metadata = typing.get_args(annotation)[1:] if is_annotated else ()
    return any(isinstance(f, FieldInfo) and f.description is not None for f in (default, *metadata))


def _input_model(
    handler: Callable[..., Any], name: str, documented: Mapping[str, str]
) -> tuple[type[BaseModel], bool]:
    """Build the pydantic input model from the handler's signature (minus `ctx`)."""
    signature = inspect.signature(handler)
    try:
        # With the extras: `Annotated` metadata carries descriptions and constraints.
        hints = typing.get_type_hints(handler, include_extras=True)
    except (NameError, TypeError) as exc:
        raise ConfigurationError(f"tool {name!r}: cannot resolve its type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    wants_ctx = False
    for param in signature.parameters.values():
        if param.name == "ctx":
            wants_ctx = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {name!r}: *args and **kwargs have no schema")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        doc = documented.get(param.name)
        if doc is not None and not _described(annotation, default):
            # After the parameter's own metadata: pydantic merges the two, so a Field
            # that sets only constraints keeps them and gains the description.
            annotation = Annotated[annotation, Field(description=doc)]
        fields[param.name] = (annotation, default)
    model = create_model(
        f"{name}_input",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    return typing.cast(type[BaseModel], model), wants_ctx


class ToolRegistry:
    """The app's tools by name."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        # Tools known by a prefix rather than one by one: an MCP server's, `<prefix>.<tool>`.
        self._prefixed: dict[str, Callable[[str], Tool]] = {}
        self._prefixed_deadlined = False

    def add(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ConfigurationError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def add_prefixed(
        self, prefix: str, make: Callable[[str], Tool], *, deadlined: bool = False
    ) -> None:
        """Know every `<prefix>.<tool>` as the tool `make(name)` builds (an MCP server's:
        who may use and decide it; the run's list says which exist). `deadlined`: their
        approvals time out."""
        if prefix in self._prefixed:
            raise ConfigurationError(f"tools prefixed {prefix!r}. are already registered")
        self._prefixed[prefix] = make
        self._prefixed_deadlined = self._prefixed_deadlined or deadlined

    def _by_prefix(self, name: object) -> Tool | None:
        if not isinstance(name, str):
            return None
        prefix, dot, rest = name.partition(".")
        make = self._prefixed.get(prefix) if dot and rest and "*" not in rest else None
        return make(name) if make is not None else None

    def get(self, name: str) -> Tool:
        tool = self._tools.get(name) or self._by_prefix(name)
        if tool is None:
            raise UnknownToolError(name)
        return tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools or self._by_prefix(name) is not None

    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def deadlined(self) -> bool:
        """Whether any tool's approvals time out (then a run parked on one is looked at)."""
        timed = any(tool.approval_timeout is not None for tool in self._tools.values())
        return timed or self._prefixed_deadlined

    def authorize(self, name: str, actor: str, roles: RolesPolicy, offered: Iterable[str]) -> Tool:
        """The tool, if it is offered to this agent and the actor holds a role for it."""
        tool = self.get(name)
        if not roles.may_use(tool, actor):
            raise ToolNotPermittedError(name, actor)
        if name not in offered:
            raise UnknownToolError(name)
        return tool


__all__ = [
    "TOOL_KINDS",
    "ReconcileContext",
    "Reconciler",
    "RolesPolicy",
    "Tool",
    "ToolContext",
    "ToolInputError",
    "ToolKind",
    "ToolRegistry",
]
