"""`AnthropicModel`: Claude through the Anthropic Messages API, streamed.

Reasoning effort turns on extended thinking with a token budget: `low` 1024,
`medium` 4096, `high` 16384, or a number of tokens given as digits; `none` or
`minimal` leaves it off. The budget counts against `max_tokens`, so when the
budget does not fit, `max_tokens` grows by the budget.

Prompt caching (on unless `prompt_cache=False`, `AGENT_JOBS_ANTHROPIC_CACHE=0`) marks
where the API may keep the prompt's prefix for five minutes (`cache_control`
ephemeral; at most 4 marks a request), where a later request is sure to resend it:

- the last tool definition and the system prompt: the same in every request of an agent;
- when the request offers tools, the whole history: the reply's calls bring this
  conversation back within seconds, with their results added;
- and the history up to the last assistant turn: the prefix the request before wrote,
  read here at a tenth of the input price (the request made after a person's decision
  resends the conversation it stopped on).

With no tools offered the next request waits for the user, most likely longer than the
cache lives: the history is not marked.

A write costs 1.25 times the input price and a read 0.1 times (`pricing.py`); a prefix
shorter than the model's minimum (1,024 to 4,096 tokens) is not cached and costs as
before.

`ModelSettings.temperature` is not sent: the API version the SDK speaks
(2026-10-21) refuses sampling parameters, and the SDK has dropped them.

The neutral messages carry no thinking blocks, and the API wants them back
inside a tool loop; so thinking is asked for only when a request starts an
assistant turn (its last message is not a tool result).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
from anthropic.types import RawMessageStreamEvent
from pydantic import SecretStr

from ..errors import ConfigurationError, ModelError, ModelErrorKind
from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec
from ._http import (
    ProcessLocal,
    chained,
    classify_status,
    error_message,
    header_cost,
    parse_retry_after,
    redact,
    transport_error_kind,
    transport_message,
)
from .base import DeltaSink, args_writer
from .pricing import PriceTable, priced_usage
from .wire_names import WireNames

DEFAULT_MAX_TOKENS = 4096
THINKING_BUDGETS: Mapping[str, int] = {"low": 1024, "medium": 4096, "high": 16384}
MIN_THINKING_BUDGET = 1024


def thinking_budget(effort: str | None) -> int | None:
    """The extended-thinking budget for a reasoning effort, None for no thinking."""
    if effort is None or effort.strip().lower() in ("", "none", "minimal", "off"):
        return None
    value = effort.strip().lower()
    if value.isdigit():
        return max(MIN_THINKING_BUDGET, int(value))
    if value in THINKING_BUDGETS:
        return THINKING_BUDGETS[value]
    raise ConfigurationError(
        f"reasoning effort {effort!r} is not one of none, low, medium, high or a token budget"
    )


def to_anthropic_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The neutral history as Messages API turns, and any system text found in it.

    Consecutive tool results (and any user text after them) become one user message,
    since the API wants strictly alternating roles.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append(message.content)
            continue
        blocks: list[dict[str, Any]] = []
        if message.role == "tool":
            if not message.tool_call_id:
                raise ModelError(
                    "a tool result without tool_call_id cannot be sent to the model",
                    kind="invalid_request",
                )
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content or ("the tool call failed" if message.is_error else ""),
            }
            if message.is_error:
                result["is_error"] = True
            blocks.append(result)
        elif message.content:
            blocks.append({"type": "text", "text": message.content})
        for call in message.tool_calls if message.role == "assistant" else ():
            blocks.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.args}
            )
        if not blocks:
            continue  # the API refuses empty turns
        role = "assistant" if message.role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        # Tool results must open their user message.
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    return "\n\n".join(part for part in system if part), turns


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as Messages API tool definitions."""
    out = []
    for tool in tools:
        entry: dict[str, Any] = {
            "name": tool.name,
            "input_schema": tool.input_schema or {"type": "object", "properties": {}},
        }
        if tool.description:
            entry["description"] = tool.description
        out.append(entry)
    return out


EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}


def mark_cache_points(params: dict[str, Any], *, offers_tools: bool) -> None:
    """Mark the Messages call's prompt-cache breakpoints (the module's docstring says
    which, and why); at most 4, the API's limit."""
    if params.get("tools"):
        params["tools"][-1] = {**params["tools"][-1], "cache_control": dict(EPHEMERAL)}
    if system := params.get("system"):
        params["system"] = [{"type": "text", "text": system, "cache_control": dict(EPHEMERAL)}]
    messages: list[dict[str, Any]] = params["messages"]
    if not offers_tools or not messages:
        return  # the next request waits for the user: most likely past the cache's life
    last_reply = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=0)
    marked = {len(messages) - 1}
    if last_reply > 0:
        marked.add(last_reply - 1)  # what the request before this one ended on
    for index in marked:
        content = messages[index]["content"]
        content[-1] = {**content[-1], "cache_control": dict(EPHEMERAL)}


@dataclass
class _PendingCall:
    id: str
    name: str
    initial: dict[str, Any]
    order: int  # the call's position among the reply's calls (from 0)
    pieces: list[str] = field(default_factory=list)
    length: int = 0  # characters of input JSON so far: the next piece's offset

    def stream(self, sink: DeltaSink, piece: str) -> None:
        """Pass an input piece on as it came, with where it goes in the call's text."""
        write = args_writer(sink)
        if write is not None and piece:
            write(self.id, self.name, piece, index=self.order, offset=self.length)
        self.length += len(piece)


@dataclass
class _Assembly:
    """What the events of one streamed message add up to."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    model: str | None = None

    def add(self, event: RawMessageStreamEvent, sink: DeltaSink) -> None:
        if event.type == "message_start":
            self.model = event.message.model
            self._count(event.message.usage)
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                initial = block.input if isinstance(block.input, dict) else {}
                order = len(self.calls)
                self.calls[event.index] = _PendingCall(block.id, block.name, initial, order)
            elif block.type == "text" and block.text:
                self.text.append(block.text)
                sink.text(block.text)
        elif event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                self.text.append(delta.text)
                sink.text(delta.text)
            elif delta.type == "input_json_delta" and event.index in self.calls:
                pending = self.calls[event.index]
                pending.pieces.append(delta.partial_json)
                pending.stream(sink, delta.partial_json)
        elif event.type == "content_block_stop":
            self._stop(event.index, sink)
        elif event.type == "message_delta":
            self._count(event.usage)
        elif event.type == "message_stop":
            self.finished = True

    def _stop(self, index: int, sink: DeltaSink) -> None:
        pending = self.calls.get(index)
        if pending is not None and not pending.pieces and pending.initial:
            # A proxy may send the whole input with the block's start: those are the
            # arguments, written at once.
            pending.stream(sink, json.dumps(pending.initial))

    def _count(self, usage: Any) -> None:
        # message_start and message_delta both carry cumulative counts; later ones win.
        for name in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
        ):
            value = getattr(usage, name, None)
            if isinstance(value, int):
                self.tokens[name] = value

    @property
    def input_tokens(self) -> int:
        # Cache writes and reads are input too, priced at the cache's prices.
        return sum(
            self.tokens.get(name, 0)
            for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )

    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for _, pending in sorted(self.calls.items()):
            raw = "".join(pending.pieces).strip()
            if not raw:
                args: Any = pending.initial
            else:
                try:
                    args = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise ModelError(
                        f"malformed JSON arguments for tool {pending.name!r}: {exc}",
                        kind="invalid_response",
                    ) from None
            if not isinstance(args, dict):
                raise ModelError(
                    f"arguments for tool {pending.name!r} are not an object",
                    kind="invalid_response",
                )
            calls.append(ToolCall(id=pending.id, name=pending.name, args=args))
        return calls


class AnthropicModel:
    """Claude through the Messages API: streams text, assembles tool calls, prices usage."""

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | SecretStr | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_tokens: int | None = None,
        reasoning_effort: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        prices: PriceTable | None = None,
        prompt_cache: bool = True,
    ) -> None:
        thinking_budget(reasoning_effort)  # refuse a bad effort now, not on the first call
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        self.reasoning_effort = reasoning_effort
        self.prices = prices if prices is not None else PriceTable()
        self.prompt_cache = prompt_cache
        self._api_key = api_key if isinstance(api_key, SecretStr) else SecretStr(api_key or "")
        self._default_headers = dict(default_headers or {})
        self._client: ProcessLocal[anthropic.Anthropic] = ProcessLocal(
            lambda: anthropic.Anthropic(
                api_key=self._api_key.get_secret_value() or None,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,  # retrying is the runner's job (the request-error waterfall)
                default_headers=self._default_headers or None,
            ),
            lambda client: client.close(),
        )

    @property
    def name(self) -> str:
        return f"anthropic:{self.model}"

    def __repr__(self) -> str:
        return f"AnthropicModel(name={self.name!r}, base_url={self.base_url!r})"

    def _secrets(self) -> list[str]:
        return [self._api_key.get_secret_value()]

    def client(self) -> anthropic.Anthropic:
        """The SDK client, made on first use in each process (never shared across a fork)."""
        return self._client.get()

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the Messages call for `request`."""
        settings = request.settings
        extra_system, messages = to_anthropic_messages(request.messages)
        system = "\n\n".join(part for part in (request.system, extra_system) if part)
        max_tokens = settings.max_tokens or self.max_tokens
        params: dict[str, Any] = {
            "model": settings.model or self.model,
            "max_tokens": max_tokens,
            "messages": messages,
            "stream": True,
        }
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = to_anthropic_tools(request.tools)
        if self.prompt_cache:
            mark_cache_points(params, offers_tools=bool(request.tools))
        try:
            budget = thinking_budget(settings.reasoning_effort or self.reasoning_effort)
        except ConfigurationError as exc:
            raise ModelError(str(exc), kind="invalid_request", provider=self.provider) from None
        in_tool_loop = bool(request.messages) and request.messages[-1].role == "tool"
        if budget is not None and not in_tool_loop:
            params["thinking"] = {"type": "enabled", "budget_tokens": budget}
            if max_tokens <= budget:
                params["max_tokens"] = max_tokens + budget
        return params

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        # An MCP tool's name (`files.read_file`) is not one the API takes: sent renamed.
        names = WireNames.of(request)
        return names.incoming(self._run_turn(names.outgoing(request), sink))

    def _run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        params = self.request_params(request)
        assembly = _Assembly()
        headers: Mapping[str, str] = {}
        stream = None
        try:
            stream = cast(
                "anthropic.Stream[RawMessageStreamEvent]",
                self.client().messages.create(**params),
            )
            with stream:
                headers = stream.response.headers
                for event in stream:
                    assembly.add(event, sink)
        except anthropic.APIError as exc:
            raise self._error(exc, opened=stream is not None) from chained(exc, self._secrets())
        except Exception as exc:
            kind = transport_error_kind(exc)
            if kind is None:
                raise  # not the provider's failure (a sink error, say): let it through
            what = transport_message(kind, opened=stream is not None, where=self.base_url)
            raise self._failure(kind, f"{what} ({exc})") from exc
        if not assembly.finished:
            raise self._failure("connection", "the stream ended before the reply was complete")
        try:
            calls = assembly.tool_calls()
        except ModelError as exc:
            raise self._failure("invalid_response", str(exc)) from None
        usage = priced_usage(
            assembly.input_tokens,
            assembly.tokens.get("output_tokens", 0),
            model=params["model"],
            provider_cost=header_cost(headers),  # a LiteLLM proxy in front of the Messages API
            prices=self.prices,
            cache_read_tokens=assembly.tokens.get("cache_read_input_tokens", 0),
            cache_write_tokens=assembly.tokens.get("cache_creation_input_tokens", 0),
        )
        return ModelResponse(
            text="".join(assembly.text),
            tool_calls=calls,
            usage=usage,
            model=assembly.model or params["model"],
        )

    def _failure(
        self,
        kind: ModelErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> ModelError:
        text = redact(f"{self.name}: {message}", self._secrets())
        return ModelError(
            text, kind=kind, status=status, retry_after=retry_after, provider=self.provider
        )

    def _error(self, exc: anthropic.APIError, *, opened: bool) -> ModelError:
        if isinstance(exc, anthropic.APIConnectionError):
            kind: ModelErrorKind = (
                "timeout" if isinstance(exc, anthropic.APITimeoutError) else "connection"
            )
            return self._failure(kind, transport_message(kind, opened=opened, where=self.base_url))
        message = error_message(exc.body, exc.message)
        error_type = _error_type(exc.body)
        if not isinstance(exc, anthropic.APIStatusError):
            kind = classify_status(None, error_type=error_type, message=message)
            return self._failure(kind, f"error: {message}")
        # An `error` event inside a 200 stream: its type, not the status, tells what failed.
        status = exc.status_code if exc.status_code >= 400 else None
        kind = classify_status(status, error_type=error_type, message=message)
        retry_after = parse_retry_after(exc.response.headers)
        where = f"HTTP {status}" if status is not None else "error in the stream"
        return self._failure(kind, f"{where}: {message}", status=status, retry_after=retry_after)


def _error_type(body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping) and isinstance(inner.get("type"), str):
            return str(inner["type"])
    return None
