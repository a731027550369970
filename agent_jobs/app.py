"""`AgentApp`: where agents, tools, personas and roles are defined."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from .admission import Concurrency, KeyFunction, concurrency
from .errors import ConfigurationError, ScheduleError, UnknownAgentError
from .history import SlidingWindowHistory
from .mcp.servers import McpServer, McpTool
from .messages import ModelSettings, ToolSpec
from .models.base import Model
from .prestep import PreStepListener
from .request_errors import RequestErrorMiddleware
from .schedules.spec import Schedule
from .timers import SPEC as WAIT_SPEC
from .timers import WAIT
from .tools import OnTimeout, Reconciler, Roles, RolesPolicy, Tool, ToolKind, ToolRegistry

F = TypeVar("F", bound=Callable[..., Any])
PreStepListenerT = TypeVar("PreStepListenerT", bound=PreStepListener)
RequestErrorMiddlewareT = TypeVar("RequestErrorMiddlewareT", bound=RequestErrorMiddleware)

QuotaSetting = int | Callable[[str], int | None] | None


@dataclass(frozen=True)
class AgentOptions:
    """Per-agent model options: what a request sends unless a run selects otherwise."""

    provider: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    default_timeout: float | None = None  # seconds; None: no deadline


@dataclass(frozen=True)
class Persona:
    """A voice for an agent: its prompt wraps the agent's, it may narrow the tools."""

    name: str
    prompt: str
    tools: frozenset[str] | None = None

    def wrap(self, base: str) -> str:
        if "{system}" in self.prompt:
            return self.prompt.replace("{system}", base)
        return f"{self.prompt}\n\n{base}" if base else self.prompt


@dataclass
class AgentSpec:
    """One agent: its model, base prompt, the tools (or agents) it may use, its limits."""

    name: str
    model: Model
    system: str = ""
    tools: list[str] = field(default_factory=list)
    max_steps: int = 8
    options: AgentOptions = field(default_factory=AgentOptions)
    description: str = ""
    history: SlidingWindowHistory | None = None
    # At most `limit` runs with one key at once (docs/operating.md, "Flow control"); None: no limit.
    concurrency: Concurrency | None = None
    # Offered the `wait` tool: the run may sleep and wake later (docs/time.md).
    timers: bool = False

    def model_settings(self) -> ModelSettings:
        return ModelSettings(
            provider=self.options.provider,
            model=self.options.model,
            max_tokens=self.options.max_tokens,
            reasoning_effort=self.options.reasoning_effort,
        )


class AgentApp:
    """The registry of one deployment: agents, tools, personas, roles and quota."""

    def __init__(
        self,
        roles: Mapping[str, Iterable[str]] | Roles | None = None,
        *,
        quota: QuotaSetting = None,
        max_depth: int = 3,
        name: str = "agent-jobs",
    ) -> None:
        self.name = name
        # Delegation's recursion budget: a top-level run is depth 0, each child one more.
        self.max_depth = max_depth
        self.roles = RolesPolicy(roles)
        self.registry = ToolRegistry()
        self.agents: dict[str, AgentSpec] = {}
        self.personas: dict[str, Persona] = {}
        self.pre_step_listeners: list[PreStepListener] = []
        self.request_error_chain: list[RequestErrorMiddleware] = []
        self.schedules: dict[str, Schedule] = {}
        self.mcp_servers: dict[str, McpServer] = {}
        self._quota = quota

    # --- definitions -----------------------------------------------------------------

    @overload
    def tool(self, fn: F) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        *,
        kind: ToolKind = "read",
        roles: Iterable[str] | None = None,
        approvers: Iterable[str] | None = None,
        name: str | None = None,
        description: str | None = None,
        queue: str | None = None,
        approval_timeout: float | None = None,
        on_timeout: OnTimeout = "reject",
        escalate_to: Iterable[str] | None = None,
        idempotent: bool | None = None,
        reconcile: Reconciler | None = None,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        *,
        kind: ToolKind = "read",
        roles: Iterable[str] | None = None,
        approvers: Iterable[str] | None = None,
        name: str | None = None,
        description: str | None = None,
        queue: str | None = None,
        approval_timeout: float | None = None,
        on_timeout: OnTimeout = "reject",
        escalate_to: Iterable[str] | None = None,
        idempotent: bool | None = None,
        reconcile: Reconciler | None = None,
    ) -> F | Callable[[F], F]:
        """Register a function as a tool; its input schema comes from its signature.
        With `queue`, the durable runner sends its calls to that broker queue (for a
        CPU-bound tool: a prefork worker that reads it) instead of running them where
        the step before ended. An action's call not decided within `approval_timeout`
        seconds is rejected, approved or escalated (`on_timeout`; escalated: only the
        roles `escalate_to` may decide, and a second timeout rejects it). An action is
        not `idempotent` unless it says so: a call whose worker died while its handler ran
        is not run again but asked of `reconcile(ctx)`, then of a person."""

        def register(handler: F) -> F:
            self.registry.add(
                Tool(
                    handler,
                    kind=kind,
                    name=name,
                    description=description,
                    roles=roles,
                    approvers=approvers,
                    queue=queue,
                    approval_timeout=approval_timeout,
                    on_timeout=on_timeout,
                    escalate_to=escalate_to,
                    idempotent=idempotent,
                    reconcile=reconcile,
                )
            )
            return handler

        return register(fn) if fn is not None else register

    def mcp(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        kinds: Mapping[str, str] | None = None,
        approvers: Iterable[str] | None = None,
        roles: Iterable[str] | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
        approval_timeout: float | None = None,
        on_timeout: OnTimeout = "reject",
        escalate_to: Iterable[str] | None = None,
    ) -> McpServer:
        """Take tools from an MCP server: `command=[...]` (and `env`) starts it over
        stdio, `url=` (and `headers`) reaches it over streamable HTTP. Its tools are
        `<name>.<tool>`; an agent names them one by one or as `<name>.*`. A tool whose
        annotations say `readOnlyHint: true` is a read, any other an action, unless
        `kinds` says otherwise; `roles`, `approvers` and `idempotent` are as for
        `app.tool`, for every tool of the server, and so are `approval_timeout`,
        `on_timeout` and `escalate_to` for its actions; `timeout` bounds one call
        (seconds, within the step's time limit). Nothing is started here: the list is taken by
        each run, at its first model step (docs/mcp.md)."""
        if name in self.mcp_servers:
            raise ConfigurationError(f"an MCP server named {name!r} is already defined")
        server = McpServer.define(
            name,
            command=command,
            env=env,
            url=url,
            headers=headers,
            kinds=kinds,
            roles=roles,
            approvers=approvers,
            idempotent=idempotent,
            timeout=timeout,
            approval_timeout=approval_timeout,
            on_timeout=on_timeout,
            escalate_to=escalate_to,
        )
        deadlined = server.approval_timeout is not None
        self.registry.add_prefixed(name, lambda tool: McpTool(server, tool), deadlined=deadlined)
        self.mcp_servers[name] = server
        return server

    def mcp_server_of(self, name: str) -> McpServer | None:
        """The MCP server a tool name (or `<server>.*`) belongs to, if any."""
        prefix, dot, rest = name.partition(".")
        return self.mcp_servers.get(prefix) if dot and rest else None

    def agent(
        self,
        name: str,
        *,
        model: Model | str,
        system: str = "",
        tools: Sequence[str] = (),
        max_steps: int = 8,
        options: AgentOptions | None = None,
        description: str = "",
        history: SlidingWindowHistory | None = None,
        concurrency_key: str | KeyFunction | None = None,
        max_concurrent: int | None = None,
        timers: bool = False,
    ) -> AgentSpec:
        """Define an agent. A name in `tools` may be a tool or another agent.

        `model` is an adapter, or a string such as `openai:gpt-4.1-mini` or
        `anthropic:claude-sonnet-4-5` resolved with the provider settings. With
        `concurrency_key` ("actor", "thread", or a function of the run request that
        returns a string, or None for a run nothing holds back) and `max_concurrent`, at
        most that many runs of the agent with one key run at once; the others wait,
        `queued`, in the order they came. With `timers`, the agent is offered the `wait`
        tool: its run sleeps, holding nothing, until a time or a message (docs/time.md).
        """
        if name in self.agents:
            raise ConfigurationError(f"an agent named {name!r} is already defined")
        if max_steps < 1:
            raise ConfigurationError("max_steps must be at least 1")
        limit = concurrency(name, concurrency_key, max_concurrent)
        if isinstance(model, str):
            from .models.registry import resolve_model

            model = resolve_model(model)
        if not isinstance(model, Model):
            raise ConfigurationError(
                f"agent {name!r}: model must be a model adapter (for example ScriptedModel) "
                "or a string such as 'openai:gpt-4.1-mini'"
            )
        spec = AgentSpec(
            name=name,
            model=model,
            system=system,
            tools=list(tools),
            max_steps=max_steps,
            options=options or AgentOptions(),
            description=description,
            history=history,
            concurrency=limit,
            timers=bool(timers),
        )
        self.agents[name] = spec
        return spec

    def schedule(
        self,
        name: str,
        *,
        agent: str,
        cron: str,
        timezone: str = "UTC",
        input: str,
        actor: str = "scheduler",
        metadata: dict[str, Any] | None = None,
        catch_up: str = "latest",
    ) -> Schedule:
        """Start a run of `agent` at each occurrence of `cron` in `timezone`
        (docs/schedules.md). Its run ids are `sched:<name>:<occurrence in UTC>`; missed
        occurrences start as `catch_up` says: "latest" (the newest only), "all", "none".
        A bad definition is a `ScheduleError`, and defines nothing."""
        if name in self.schedules:
            raise ScheduleError(f"a schedule named {name!r} is already defined")
        if agent not in self.agents:
            raise ScheduleError(f"schedule {name!r}: unknown agent {agent!r}; define it first")
        found = Schedule.define(
            name,
            agent=agent,
            cron=cron,
            timezone=timezone,
            input=input,
            actor=actor,
            metadata=metadata,
            catch_up=catch_up,
        )
        self.schedules[name] = found
        return found

    def persona(self, name: str, prompt: str, *, tools: Iterable[str] | None = None) -> Persona:
        """Define a persona; `persona=name` in a run request selects it."""
        persona = Persona(name, prompt, frozenset(tools) if tools is not None else None)
        self.personas[name] = persona
        return persona

    def before_step(self, listener: PreStepListenerT) -> PreStepListenerT:
        """Register a pre-step listener: it may reject a step or enter it with messages.

        Listeners run inside the step's checkpoint, so a replay reads their decision
        back instead of asking again.
        """
        self.pre_step_listeners.append(listener)
        return listener

    def on_request_error(self, middleware: RequestErrorMiddlewareT) -> RequestErrorMiddlewareT:
        """Add a middleware to the request-error waterfall (see `agent_jobs.request_errors`)."""
        self.request_error_chain.append(middleware)
        return middleware

    # --- lookups ---------------------------------------------------------------------

    def get_agent(self, name: str) -> AgentSpec:
        try:
            return self.agents[name]
        except KeyError:
            raise UnknownAgentError(name, list(self.agents)) from None

    def get_persona(self, name: str | None) -> Persona | None:
        if name is None:
            return None
        try:
            return self.personas[name]
        except KeyError:
            known = ", ".join(sorted(self.personas)) or "none"
            raise ConfigurationError(f"unknown persona {name!r}; defined: {known}") from None

    def system_prompt(self, agent: AgentSpec, persona: Persona | None) -> str:
        """The effective system prompt: the persona wraps the agent's base prompt."""
        return persona.wrap(agent.system) if persona else agent.system

    def quota_limit(self, actor: str, default: int | None = None) -> int | None:
        """The actor's daily token budget, or None for no budget."""
        if self._quota is None:
            return default
        if callable(self._quota):
            return self._quota(actor)
        return self._quota

    def offered_tools(self, agent: AgentSpec, actor: str, persona: Persona | None) -> list[str]:
        """Names of the tools this actor is offered on this agent (and persona)."""
        offered: list[str] = []
        for name in agent.tools:
            if persona is not None and persona.tools is not None and name not in persona.tools:
                continue
            if self.mcp_server_of(name) is not None:
                continue  # offered once the run has taken its list (offered_mcp)
            if name in self.registry:
                if self.roles.may_use(self.registry.get(name), actor):
                    offered.append(name)
            elif name in self.agents:
                offered.append(name)
        if agent.timers and WAIT not in offered and WAIT not in self.registry:
            offered.append(WAIT)
        return offered

    def offered_mcp(self, agent: AgentSpec, actor: str, persona: Persona | None) -> list[str]:
        """The MCP tools (`<server>.<tool>`, `<server>.*`) this actor is offered on this
        agent (and persona): what the run's list is taken for."""
        wanted: list[str] = []
        held = self.roles.roles_of(actor)
        for name in agent.tools:
            server = self.mcp_server_of(name)
            if server is None or (server.roles is not None and not server.roles & held):
                continue
            narrowed = persona.tools if persona is not None else None
            if narrowed is not None and not {name, f"{server.name}.*"} & narrowed:
                continue
            wanted.append(name)
        return wanted

    def tool_specs(self, names: Iterable[str]) -> list[ToolSpec]:
        specs = []
        for name in names:
            if name in self.registry:
                specs.append(self.registry.get(name).spec())
            elif name in self.agents:
                specs.append(delegation_spec(self.agents[name]))
            elif name == WAIT:
                specs.append(WAIT_SPEC)
        return specs

    def kind_of(self, name: str) -> str | None:
        """A tool's kind; "agent" for a delegation; None when the name is unknown."""
        if name in self.registry:
            return self.registry.get(name).kind
        if name in self.agents:
            return "agent"
        return None

    def validate(self) -> None:
        """Check that every name an agent uses is a tool or an agent."""
        for agent in self.agents.values():
            for name in agent.tools:
                if self.mcp_server_of(name) is not None:
                    continue  # checked against the server's list when a run takes it
                if name not in self.registry and name not in self.agents:
                    raise ConfigurationError(
                        f"agent {agent.name!r} uses {name!r}, which is neither a tool nor an agent"
                    )


def delegation_spec(agent: AgentSpec) -> ToolSpec:
    return ToolSpec(
        name=agent.name,
        description=agent.description or f"Hand a task to the {agent.name} agent.",
        input_schema={
            "type": "object",
            "properties": {"task": {"type": "string", "description": "what to do"}},
            "required": ["task"],
            "additionalProperties": False,
        },
    )
