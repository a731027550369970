"""MCP servers as tools of an app: their configuration, their listed tools, their calls.

`app.mcp(name, command=[...])` or `app.mcp(name, url=...)` adds an `McpServer`. Its tools
are named `<name>.<tool>`; a run takes their list once (`mcp:tools`, journaled) and
offers what it found. A call goes through the process's pool of connections
(`agent_jobs/mcp/pool.py`); the server's answer becomes the call's result, its error a
tool error the model sees, and its elicitation a question to the run's actor
(`agent_jobs/mcp/elicitation.py`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..checkpoints import McpToolInfo
from ..errors import ConfigurationError, ToolError, ToolInputError
from ..messages import ToolSpec
from ..tools import OnTimeout, QuestionsAsked, Tool, ToolContext, ToolKind, _approval_deadline
from . import elicitation
from .pool import POOL

if TYPE_CHECKING:
    from mcp import Client

# A server's name: the prefix of its tools' names.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_TIMEOUT = 60.0
# Rounds of a call that asks, is answered from what the person said, and asks again.
MAX_INPUT_ROUNDS = 10


@dataclass(frozen=True)
class McpServer:
    """One MCP server an app takes tools from."""

    name: str
    command: tuple[str, ...] | None = None
    # Kept out of its repr: they may hold secrets (a token in a header, a key in env).
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    kinds: Mapping[str, ToolKind] = field(default_factory=dict)
    roles: frozenset[str] | None = None
    approvers: frozenset[str] | None = None
    idempotent: bool | None = None
    timeout: float = DEFAULT_TIMEOUT
    # Its actions' approval deadline (as `app.tool`'s): seconds, what then, to whom.
    approval_timeout: float | None = None
    on_timeout: OnTimeout = "reject"
    escalate_to: frozenset[str] | None = None
    # The SDK's protocol negotiation: "auto" (the default) asks the server and falls back
    # to the initialize handshake of older servers; "legacy" forces that handshake.
    mode: str = "auto"

    @classmethod
    def define(
        cls,
        name: str,
        *,
        command: Sequence[str] | None,
        env: Mapping[str, str] | None,
        url: str | None,
        headers: Mapping[str, str] | None,
        kinds: Mapping[str, str] | None,
        roles: Iterable[str] | None,
        approvers: Iterable[str] | None,
        idempotent: bool | None,
        timeout: float | None,
        approval_timeout: float | None = None,
        on_timeout: OnTimeout = "reject",
        escalate_to: Iterable[str] | None = None,
    ) -> McpServer:
        """A server's definition, checked: a clear error names what to fix."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(
                f"MCP server name {name!r}: letters, digits, '_' and '-' only (it prefixes "
                "its tools' names: '<name>.<tool>')"
            )
        if (command is None) == (url is None):
            raise ConfigurationError(
                f"MCP server {name!r}: give either command=[...] (stdio) or url='http…' "
                "(streamable HTTP)"
            )
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)
        ):
            raise ConfigurationError(f"MCP server {name!r}: command is a list of strings")
        if url is not None and not (isinstance(url, str) and re.match(r"^https?://", url)):
            raise ConfigurationError(
                f"MCP server {name!r}: url must start with http:// or https://"
            )
        if env and command is None:
            raise ConfigurationError(f"MCP server {name!r}: env is for a stdio server (command)")
        if headers and url is None:
            raise ConfigurationError(f"MCP server {name!r}: headers are for an HTTP server (url)")
        for tool, kind in (kinds or {}).items():
            if kind not in ("read", "action"):
                raise ConfigurationError(
                    f"MCP server {name!r}: kinds[{tool!r}] must be 'read' or 'action', not {kind!r}"
                )
        if idempotent is not None and not isinstance(idempotent, bool):
            raise ConfigurationError(f"MCP server {name!r}: idempotent must be True or False")
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ConfigurationError(f"MCP server {name!r}: timeout must be seconds > 0")
        deadline = _approval_deadline(
            f"of MCP server {name!r}", "action", approval_timeout, on_timeout, escalate_to
        )
        if importlib.util.find_spec("mcp") is None:
            raise ConfigurationError(
                f"MCP server {name!r}: the MCP SDK is not installed; install the extra: "
                "pip install 'agent-jobs[mcp]'"
            )
        return cls(
            name=name,
            command=tuple(command) if command is not None else None,
            env=dict(env or {}),
            url=url,
            headers=dict(headers or {}),
            kinds=dict(kinds or {}),  # type: ignore[arg-type]  # checked just above
            roles=frozenset(roles) if roles is not None else None,
            approvers=frozenset(approvers) if approvers is not None else None,
            idempotent=idempotent,
            timeout=float(timeout) if timeout is not None else DEFAULT_TIMEOUT,
            approval_timeout=deadline[0],
            on_timeout=deadline[1],
            escalate_to=deadline[2],
        )

    # --- the connection ------------------------------------------------------------------

    def client(self, elicited: Any = None) -> Client:
        """An unopened SDK client for this server (the pool opens and keeps it);
        `elicited` answers a server that elicits in the middle of a call."""
        from mcp import Client, StdioServerParameters  # the SDK, from the `mcp` extra

        if self.command is not None:
            from mcp.client.stdio import get_default_environment, stdio_client

            params = StdioServerParameters(
                command=self.command[0],
                args=list(self.command[1:]),
                env={**get_default_environment(), **self.env},
            )
            # The server's stderr goes to the process's own (a Celery worker's sys.stderr
            # is a logging proxy, with no file descriptor to hand a child).
            errlog = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
            transport = stdio_client(params, errlog=errlog)
            return Client(transport, cache=None, elicitation_callback=elicited, mode=self.mode)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert self.url is not None
        http = httpx2.AsyncClient(headers=dict(self.headers), timeout=httpx2.Timeout(30, read=None))
        transport = streamable_http_client(self.url, http_client=http)
        return Client(transport, cache=None, elicitation_callback=elicited, mode=self.mode)

    def call_limit(self, step_time_limit: float | None = None) -> float:
        """Seconds a call may take: the server's timeout, within the step's time limit
        (`AGENT_JOBS_STEP_TIME_LIMIT`), so that the call ends as a tool error before
        the step is given up on."""
        if step_time_limit is None:
            from ..settings import get_settings

            step_time_limit = get_settings().step_time_limit
        return max(1.0, min(self.timeout, step_time_limit * 0.8))

    # --- tools ---------------------------------------------------------------------------

    def kind_of(self, tool: str, read_only: bool | None) -> ToolKind:
        """`kinds` wins; else a `readOnlyHint: true` tool is a read, any other an action."""
        return self.kinds.get(tool) or ("read" if read_only is True else "action")

    def listed(self, step_time_limit: float | None = None) -> list[McpToolInfo]:
        """The server's tools now (every page)."""

        async def fetch(client: Client) -> list[Any]:
            found: list[Any] = []
            cursor: str | None = None
            for _ in range(100):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                found.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return found

        tools = POOL.use(self, fetch, what="tools/list", timeout=self.call_limit(step_time_limit))
        return [
            McpToolInfo(
                name=f"{self.name}.{tool.name}",
                server=self.name,
                tool=tool.name,
                description=tool.description or tool.title or "",
                input_schema=dict(tool.input_schema or {"type": "object"}),
                kind=self.kind_of(
                    tool.name, tool.annotations.read_only_hint if tool.annotations else None
                ),
            )
            for tool in tools
        ]

    def call(
        self,
        tool: str,
        args: Mapping[str, Any],
        answers: Mapping[str, Any] | None,
        step_time_limit: float | None = None,
    ) -> Any:
        """Call `tool`; its result as JSON-ready data. Raises `QuestionsAsked` when the
        server elicits what `answers` does not hold, `ToolError` when the tool or the
        server fails."""
        from mcp.types import InputRequiredResult

        current = elicitation.MidCall(self.name, tool, answers)

        async def run(client: Client) -> Any:
            responses: dict[str, Any] | None = None
            state: str | None = None
            current.task = asyncio.current_task()
            for _ in range(MAX_INPUT_ROUNDS):
                try:
                    result = await client.session.call_tool(
                        tool,
                        dict(args),
                        input_responses=responses,
                        request_state=state,
                        allow_input_required=True,
                    )
                except asyncio.CancelledError:
                    if current.asked is None or current.task is None:
                        raise
                    current.task.uncancel()
                    return elicitation.Asked(current.asked)
                if not isinstance(result, InputRequiredResult):
                    return result
                responses, asked = elicitation.respond(self.name, tool, result, answers)
                if asked:
                    return elicitation.Asked(asked)
                state = result.request_state
            raise ToolError(f"{self.name}.{tool} kept asking for input; giving up")

        outcome = POOL.use(
            self,
            run,
            what=f"tools/call {tool}",
            timeout=self.call_limit(step_time_limit),
            current=current,
        )
        if isinstance(outcome, elicitation.Asked):
            raise QuestionsAsked(outcome.questions)
        return _result(f"{self.name}.{tool}", outcome)


def _result(name: str, result: Any) -> Any:
    """A `CallToolResult` as the call's result; an error result is a `ToolError`."""
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    if result.is_error:
        raise ToolError(f"{name}: " + ("\n".join(texts) or "the tool reported an error"))
    structured = result.structured_content
    if isinstance(structured, dict) and list(structured) == ["result"]:
        return structured["result"]  # a plain value, wrapped by the server's SDK
    if structured is not None:
        return structured
    if len(texts) == 1 == len(result.content):
        try:  # a tool that returns an object without declaring its output shape
            parsed = json.loads(texts[0])
        except ValueError:
            return texts[0]
        return parsed if isinstance(parsed, dict | list) else texts[0]
    if len(texts) == len(result.content):
        return "\n".join(texts)
    return [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
    ]


class McpTool(Tool):
    """A tool of an MCP server, as the app's registry knows it by name: who may use and
    decide it, whether a call may run again after a crash. Its schema and kind are the
    run's (its journaled list); `invoke` calls the server."""

    def __init__(self, server: McpServer, name: str, kind: ToolKind | None = None) -> None:
        tool = name.split(".", 1)[1]
        self.server = server
        self.tool = tool
        self.name = name
        self.handler = self._unavailable
        self.kind = kind or server.kinds.get(tool) or "action"
        self.description = ""
        self.roles = server.roles
        self.approvers = server.approvers
        self.queue = None
        self.approval_timeout = server.approval_timeout
        self.on_timeout = server.on_timeout
        self.escalate_to = server.escalate_to
        # A read always runs again after a crash; an action only when the server says so.
        self.idempotent = self.kind == "read" or bool(server.idempotent)
        self.reconciler = None
        self.wants_ctx = True
        self._spec = None

    def _unavailable(self, **_: Any) -> Any:  # pragma: no cover - invoke is overridden
        raise ToolError(f"{self.name} is called through its MCP server")

    def spec(self) -> ToolSpec:  # the run's list gives the real one (McpToolInfo.spec)
        return ToolSpec(name=self.name, input_schema={"type": "object"})

    def validate(self, args: Mapping[str, Any]) -> BaseModel:
        if not isinstance(args, Mapping):
            raise ToolInputError(self.name, "the arguments must be an object")
        return BaseModel()

    def invoke(self, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        return self.server.call(self.tool, args, ctx.answers)


def check_schema(name: str, schema: Mapping[str, Any], args: Mapping[str, Any]) -> None:
    """`args` against the listed input schema; a mismatch is a `ToolInputError`."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - the `mcp` extra brings it
        return
    try:
        jsonschema.validate(dict(args), dict(schema))
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(input)"
        raise ToolInputError(name, f"{where}: {exc.message}") from None
    except jsonschema.SchemaError:
        return  # the server's schema is its own affair: it checks the call itself
