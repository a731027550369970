"""`OpenAICompatModel`: any Chat Completions server (OpenAI, vLLM, Ollama, OpenRouter, LiteLLM)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
from pydantic import SecretStr

from ..errors import ModelError, ModelErrorKind
from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec
from ._http import (
    ProcessLocal,
    as_cost,
    body_field,
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

# Local servers (vLLM, Ollama) take any key, but the SDK refuses to start without one.
_NO_KEY = "not-needed"


def to_chat_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    """The neutral history as Chat Completions messages, the system prompt first."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        if message.role == "tool":
            if not message.tool_call_id:
                raise ModelError(
                    "a tool result without tool_call_id cannot be sent to the model",
                    kind="invalid_request",
                )
            # Rejections and failures arrive with content that says so ({"rejected": ...},
            # {"error": ...}); Chat Completions has no error flag for tool results.
            content = message.content or ("the tool call failed" if message.is_error else "")
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": content})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.content or None}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.args)},
                    }
                    for call in message.tool_calls
                ]
            elif not message.content:
                continue  # an empty assistant turn carries nothing and some servers refuse it
            out.append(entry)
        else:
            out.append({"role": message.role, "content": message.content})
    return out


def to_chat_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    length: int = 0  # characters of arguments so far: the next piece's offset


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass
class _Assembly:
    """What the chunks of one streamed reply add up to.

    Chunks arrive as the JSON objects the server sent: reading them as plain dicts costs
    a fifth of what the SDK's typed `ChatCompletionChunk` objects cost, per chunk.
    """

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finished: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    usage_cost: float | None = None
    model: str | None = None

    def add(self, chunk: object, sink: DeltaSink) -> None:
        if not isinstance(chunk, Mapping):
            return  # not a chunk of a chat completion (a proxy's keep-alive, say)
        self.model = _text(chunk.get("model")) or self.model
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.input_tokens = _int(usage.get("prompt_tokens"))
            self.output_tokens = _int(usage.get("completion_tokens"))
            # Of the prompt's tokens, those OpenAI read from its prompt cache (automatic
            # for long prompts; billed at the cached price, and counted in prompt_tokens).
            details = usage.get("prompt_tokens_details")
            if isinstance(details, Mapping):
                self.cache_read_tokens = _int(details.get("cached_tokens"))
            # OpenRouter adds `cost` (USD) to the usage object when asked for it.
            self.usage_cost = as_cost(usage.get("cost"))
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta, sink)
            if choice.get("finish_reason") is not None:
                self.finished = True

    def _delta(self, delta: Mapping[str, Any], sink: DeltaSink) -> None:
        content = _text(delta.get("content"))
        if content:
            self.text.append(content)
            sink.text(content)
        pieces = delta.get("tool_calls")
        for piece in pieces if isinstance(pieces, list) else ():
            if not isinstance(piece, Mapping):
                continue
            index = piece.get("index")
            position = index if isinstance(index, int) else len(self.calls)
            call = self.calls.setdefault(position, _PendingCall())
            call.id = _text(piece.get("id")) or call.id
            function = piece.get("function")
            if isinstance(function, Mapping):
                call.name += _text(function.get("name"))
                arguments = _text(function.get("arguments"))
                if arguments:
                    call.arguments.append(arguments)
                    self._stream_args(sink, position, call, arguments)

    def _stream_args(self, sink: DeltaSink, position: int, call: _PendingCall, piece: str) -> None:
        """Pass an arguments piece on as it came, with where it goes in the call's text."""
        write = args_writer(sink)
        if write is not None:
            # `index` in the reply: the calls' positions, as the server numbered them
            # (they go to the loop sorted by it, so this is also the call's place there).
            order = sorted(self.calls).index(position)
            write(call.id, call.name, piece, index=order, offset=call.length)
        call.length += len(piece)

    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for _, pending in sorted(self.calls.items()):
            raw = "".join(pending.arguments).strip() or "{}"
            try:
                args = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ModelError(
                    f"the model sent malformed JSON arguments for tool {pending.name!r}: {exc}",
                    kind="invalid_response",
                ) from None
            if not isinstance(args, dict):
                raise ModelError(
                    f"the model sent arguments for tool {pending.name!r} that are not an object",
                    kind="invalid_response",
                )
            calls.append(ToolCall(id=pending.id, name=pending.name, args=args))
        return calls


class OpenAICompatModel:
    """A model behind an OpenAI-compatible Chat Completions endpoint, streamed.

    `extra_body` is merged into every request (OpenRouter's `{"usage": {"include": True}}`
    makes it report the real cost). `max_tokens_param` names the field the server
    understands: OpenAI's reasoning models want `max_completion_tokens`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | SecretStr | None = None,
        base_url: str | None = None,
        provider: str = "openai",
        timeout: float = 60.0,
        max_tokens: int | None = None,
        reasoning_effort: str | None = None,
        temperature: float | None = None,
        max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
        extra_body: Mapping[str, Any] | None = None,
        default_headers: Mapping[str, str] | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.model = model
        self.provider = provider
        self.base_url = base_url
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.reasoning_effort = reasoning_effort
        self.temperature = temperature
        self.max_tokens_param = max_tokens_param
        self.extra_body = dict(extra_body or {})
        self.prices = prices if prices is not None else PriceTable()
        self._api_key = api_key if isinstance(api_key, SecretStr) else SecretStr(api_key or "")
        self._default_headers = dict(default_headers or {})
        self._client: ProcessLocal[openai.OpenAI] = ProcessLocal(
            lambda: openai.OpenAI(
                api_key=self._api_key.get_secret_value() or _NO_KEY,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,  # retrying is the runner's job (the request-error waterfall)
                default_headers=self._default_headers or None,
            ),
            lambda client: client.close(),
        )

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"

    def __repr__(self) -> str:
        return f"OpenAICompatModel(name={self.name!r}, base_url={self.base_url!r})"

    def _secrets(self) -> list[str]:
        return [self._api_key.get_secret_value()]

    def client(self) -> openai.OpenAI:
        """The SDK client, made on first use in each process (never shared across a fork)."""
        return self._client.get()

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the Chat Completions call for `request`."""
        settings = request.settings
        params: dict[str, Any] = {
            "model": settings.model or self.model,
            "messages": to_chat_messages(request.system, request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            params["tools"] = to_chat_tools(request.tools)
        max_tokens = settings.max_tokens or self.max_tokens
        if max_tokens is not None:
            params[self.max_tokens_param] = max_tokens
        effort = settings.reasoning_effort or self.reasoning_effort
        if effort:
            params["reasoning_effort"] = effort
        temperature = settings.temperature if settings.temperature is not None else self.temperature
        if temperature is not None:
            params["temperature"] = temperature
        if self.extra_body:
            params["extra_body"] = self.extra_body
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
        body = {key: value for key, value in params.items() if key != "extra_body"}
        body.update(self.extra_body)
        try:
            # `post` is the SDK's documented way to an endpoint as raw JSON: the same
            # client, auth, status errors and in-stream error events, but each chunk
            # arrives as a dict instead of a typed object built field by field.
            stream = self.client().post(
                "/chat/completions",
                body=body,
                options={"security": {"bearer_auth": True}},  # as `chat.completions.create`
                cast_to=object,
                stream=True,
                stream_cls=openai.Stream[object],
            )
            with stream:
                headers = stream.response.headers
                for chunk in stream:
                    assembly.add(chunk, sink)
        except openai.APIError as exc:
            raise self._error(exc, opened=stream is not None) from chained(exc, self._secrets())
        except Exception as exc:
            kind = transport_error_kind(exc)
            if kind is None:
                raise  # not the provider's failure (a sink error, say): let it through
            what = transport_message(kind, opened=stream is not None, where=self.base_url)
            raise self._failure(kind, f"{what} ({exc})") from exc
        if not assembly.finished:
            raise self._failure("connection", "the stream ended before the reply was complete")
        model = assembly.model or params["model"]
        usage = priced_usage(
            assembly.input_tokens,
            assembly.output_tokens,
            model=params["model"],
            provider_cost=assembly.usage_cost
            if assembly.usage_cost is not None
            else header_cost(headers),
            prices=self.prices,
            cache_read_tokens=min(assembly.cache_read_tokens, assembly.input_tokens),
        )
        try:
            calls = assembly.tool_calls()
        except ModelError as exc:
            raise self._failure("invalid_response", str(exc)) from None
        return ModelResponse(
            text="".join(assembly.text), tool_calls=calls, usage=usage, model=model
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

    def _error(self, exc: openai.APIError, *, opened: bool) -> ModelError:
        if isinstance(exc, openai.APIConnectionError):
            kind: ModelErrorKind = (
                "timeout" if isinstance(exc, openai.APITimeoutError) else "connection"
            )
            return self._failure(kind, transport_message(kind, opened=opened, where=self.base_url))
        status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
        code = exc.code or body_field(exc.body, "code")
        if status is None and code is not None and code.isdigit():
            status = int(code)  # an error sent inside the stream, with its HTTP status as code
        message = error_message(exc.body, exc.message)
        kind = classify_status(status, code=code, error_type=exc.type, message=message)
        retry_after = None
        if isinstance(exc, openai.APIStatusError):
            retry_after = parse_retry_after(exc.response.headers)
        where = f"HTTP {status}" if status is not None else "error in the stream"
        return self._failure(kind, f"{where}: {message}", status=status, retry_after=retry_after)
