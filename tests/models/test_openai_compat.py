"""`OpenAICompatModel` against a local server speaking Chat Completions SSE."""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from fakeprovider import (
    API_KEY,
    ArgsPiece,
    FakeProvider,
    Gate,
    RecordingSink,
    Reply,
    TextOnlySink,
    json_error,
    make_request,
    openai_stream,
)

from agent_jobs.errors import ModelError
from agent_jobs.messages import Message, ModelSettings, ToolCall, ToolSpec
from agent_jobs.models.base import Model
from agent_jobs.models.openai_compat import OpenAICompatModel
from agent_jobs.models.registry import resolve_model
from tests.support.waiting import TIMEOUT


def chunk(
    *,
    content: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    model: str = "gpt-4.1-mini",
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if calls is not None:
        delta["tool_calls"] = calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-4.1-mini",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            **extra,
        },
    }


def text_reply(*pieces: str, prompt: int = 100, completion: int = 50, **usage: Any) -> Reply:
    chunks = [chunk(content=p) for p in pieces] + [chunk(finish="stop")]
    return Reply(chunks=openai_stream([*chunks, usage_chunk(prompt, completion, **usage)]))


@pytest.fixture
def model(fake: FakeProvider) -> Iterator[OpenAICompatModel]:
    m = OpenAICompatModel(
        "gpt-4.1-mini", api_key=API_KEY, base_url=f"{fake.url}/v1", timeout=TIMEOUT
    )
    yield m
    m.close()


def test_it_is_a_model(model: OpenAICompatModel) -> None:
    assert isinstance(model, Model)
    assert model.name == "openai:gpt-4.1-mini"


def test_text_streams_to_the_sink_as_it_arrives(fake: FakeProvider, model: Any) -> None:
    gate = Gate()
    reply = text_reply("Order ", "42 ", "shipped.")
    reply.chunks.insert(1, gate)  # the rest waits until the sink has seen the first delta
    fake.add(reply)
    sink = RecordingSink(on_first=gate.opened.set)

    response = model.run_turn(make_request(), sink)

    assert fake.gate_timeouts == 0, "the first delta reached the sink only after the stream"
    assert sink.deltas == ["Order ", "42 ", "shipped."]
    assert response.text == "Order 42 shipped."
    assert response.tool_calls == []
    assert response.model == "gpt-4.1-mini"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (100, 50)
    # Priced from the built-in table: 100 * $0.40/M + 50 * $1.60/M.
    assert response.usage.cost == pytest.approx(0.00012)
    assert response.usage.cost_source == "price_table"

    sent = fake.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["messages"][0] == {"role": "system", "content": "You are a support agent."}
    assert "tools" not in sent.body


def test_tool_calls_assemble_from_split_and_interleaved_chunks(
    fake: FakeProvider, model: Any
) -> None:
    def call(index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> Any:
        function: dict[str, Any] = {"arguments": args}
        if name:
            function["name"] = name
        piece: dict[str, Any] = {"index": index, "function": function}
        if id:
            piece.update(id=id, type="function")
        return piece

    chunks = [
        chunk(content="Checking both."),
        chunk(calls=[call(0, id="call_a", name="lookup_order")]),
        chunk(calls=[call(0, args='{"order')]),
        chunk(calls=[call(1, id="call_b", name="track_shipment", args='{"order_id"')]),
        chunk(calls=[call(0, args='_id": "4')]),
        chunk(calls=[call(1, args=': "42", "carrier": null}')]),
        chunk(calls=[call(0, args='2"}')]),
        chunk(finish="tool_calls"),
        usage_chunk(30, 20),
    ]
    fake.add(Reply(chunks=openai_stream(chunks)))
    tools = [
        ToolSpec(name="lookup_order", description="Find an order", input_schema={"type": "object"}),
        ToolSpec(name="track_shipment"),
    ]

    response = model.run_turn(make_request(tools=tools), RecordingSink())

    assert response.text == "Checking both."
    assert response.tool_calls == [
        ToolCall(id="call_a", name="lookup_order", args={"order_id": "42"}),
        ToolCall(id="call_b", name="track_shipment", args={"order_id": "42", "carrier": None}),
    ]
    assert fake.last_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Find an order",
                "parameters": {"type": "object"},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "track_shipment",
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]


def _call(index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> Any:
    function: dict[str, Any] = {"arguments": args}
    if name:
        function["name"] = name
    piece: dict[str, Any] = {"index": index, "function": function}
    if id:
        piece.update(id=id, type="function")
    return piece


def test_tool_call_arguments_stream_to_the_sink_as_they_arrive(
    fake: FakeProvider, model: Any
) -> None:
    chunks = [
        chunk(content="Checking both."),
        chunk(calls=[_call(0, id="call_a", name="lookup_order")]),
        chunk(calls=[_call(0, args='{"order')]),
        chunk(calls=[_call(1, id="call_b", name="refund", args='{"order_id"')]),
        chunk(calls=[_call(0, args='_id": "4')]),
        chunk(calls=[_call(1, args=': "42", "amount": 5.0, "note": "caf\u00e9 \u2603"}')]),
        chunk(calls=[_call(0, args='2"}')]),
        chunk(finish="tool_calls"),
        usage_chunk(30, 20),
    ]
    gate = Gate()
    pieces = openai_stream(chunks)
    pieces.insert(3, gate)  # the rest waits until the sink has seen the first arguments
    fake.add(Reply(chunks=pieces))
    sink = RecordingSink(on_first_args=gate.opened.set)

    response = model.run_turn(make_request(), sink)

    assert fake.gate_timeouts == 0, "the arguments reached the sink only after the stream"
    # Every piece as it came, in order, each saying where it goes in its call's text.
    assert sink.args == [
        ArgsPiece("call_a", "lookup_order", '{"order', 0, 0),
        ArgsPiece("call_b", "refund", '{"order_id"', 1, 0),
        ArgsPiece("call_a", "lookup_order", '_id": "4', 0, 7),
        ArgsPiece("call_b", "refund", ': "42", "amount": 5.0, "note": "café ☃"}', 1, 11),
        ArgsPiece("call_a", "lookup_order", '2"}', 0, 15),
    ]
    assert sink.events[0] == "Checking both."  # the text came first, as it was sent
    # Put together, the pieces are the arguments the reply carries.
    written = sink.written()
    assert {call.id: call.args for call in response.tool_calls} == {
        call_id: json.loads(text) for call_id, text in written.items()
    }
    assert response.tool_calls[1].args["note"] == "café ☃"


def test_a_sink_that_takes_only_text_still_gets_the_reply(fake: FakeProvider, model: Any) -> None:
    chunks = [
        chunk(content="One moment."),
        chunk(calls=[_call(0, id="call_a", name="lookup_order", args='{"order_id": "42"}')]),
        chunk(finish="tool_calls"),
        usage_chunk(30, 20),
    ]
    fake.add(Reply(chunks=openai_stream(chunks)))
    sink = TextOnlySink()

    response = model.run_turn(make_request(), sink)

    assert sink.deltas == ["One moment."]
    assert response.tool_calls == [
        ToolCall(id="call_a", name="lookup_order", args={"order_id": "42"})
    ]


def test_malformed_tool_arguments_are_an_invalid_response(fake: FakeProvider, model: Any) -> None:
    piece = {"index": 0, "id": "c1", "type": "function"}
    bad = {**piece, "function": {"name": "lookup_order", "arguments": '{"order_id": '}}
    fake.add(Reply(chunks=openai_stream([chunk(calls=[bad]), chunk(finish="tool_calls")])))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "invalid_response"
    assert not info.value.retryable


def test_data_that_is_not_a_completion_chunk_is_skipped(fake: FakeProvider, model: Any) -> None:
    odd: list[bytes | Gate] = [
        b"data: 42\n\n",  # a proxy's keep-alive, say
        b'data: {"id": "x", "choices": null}\n\n',
        b'data: {"id": "x", "choices": [{"index": 0, "delta": null, "finish_reason": null}]}\n\n',
        b'data: {"id": "x", "choices": [{"index": 1, "delta": {"content": "other"}}]}\n\n',
    ]
    reply = text_reply("Hi ", "there.", prompt=10, completion=2)
    reply.chunks[1:1] = odd
    fake.add(reply)
    sink = RecordingSink()

    response = model.run_turn(make_request(), sink)

    assert sink.deltas == ["Hi ", "there."]
    assert response.text == "Hi there."
    assert (response.usage.input_tokens, response.usage.output_tokens) == (10, 2)


def test_litellm_cost_header_is_the_provider_cost(fake: FakeProvider, model: Any) -> None:
    reply = text_reply("Hi")
    reply.headers["x-litellm-response-cost"] = "0.00042"
    fake.add(reply)
    usage = model.run_turn(make_request(), RecordingSink()).usage
    assert usage.cost == pytest.approx(0.00042)
    assert usage.cost_source == "provider"


def test_openrouter_reports_usage_cost_when_asked(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_JOBS_OPENROUTER_API_KEY", API_KEY)
    model = resolve_model("openrouter:openai/gpt-4.1-mini", base_url=f"{fake.url}/api/v1")
    assert isinstance(model, OpenAICompatModel)
    fake.add(text_reply("Hi", cost=0.0031))
    try:
        usage = model.run_turn(make_request(), RecordingSink()).usage
    finally:
        model.close()
    assert fake.last_body["usage"] == {"include": True}
    assert fake.last_body["model"] == "openai/gpt-4.1-mini"
    assert usage.cost == pytest.approx(0.0031)
    assert usage.cost_source == "provider"


def test_an_unpriced_model_has_no_cost(fake: FakeProvider) -> None:
    model = OpenAICompatModel("llama-local", base_url=f"{fake.url}/v1", provider="vllm")
    fake.add(text_reply("Hi"))
    try:
        usage = model.run_turn(make_request(), RecordingSink()).usage
    finally:
        model.close()
    assert (usage.cost, usage.cost_source) == (None, None)
    assert usage.input_tokens == 100


def test_settings_reach_the_request(fake: FakeProvider, model: Any) -> None:
    fake.add(text_reply("Hi"))
    settings = ModelSettings(
        model="o4-mini", max_tokens=256, reasoning_effort="low", temperature=0.2
    )
    model.run_turn(make_request(settings=settings), RecordingSink())
    body = fake.last_body
    assert body["model"] == "o4-mini"
    assert body["max_tokens"] == 256
    assert body["reasoning_effort"] == "low"
    assert body["temperature"] == 0.2


def test_rate_limit_carries_retry_after_and_the_next_call_succeeds(
    fake: FakeProvider, model: Any
) -> None:
    fake.add(
        json_error(
            429,
            {"error": {"message": "Rate limit reached", "type": "requests", "code": None}},
            {"Retry-After": "2"},
        ),
        text_reply("Fine now."),
    )
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    error = info.value
    assert (error.kind, error.status, error.retry_after) == ("rate_limit", 429, 2.0)
    assert error.retryable and error.provider == "openai"
    assert "Rate limit reached" in str(error)
    assert len(fake.requests) == 1, "the SDK must not retry on its own"

    assert model.run_turn(make_request(), RecordingSink()).text == "Fine now."


@pytest.mark.parametrize("status", [503, 529])
def test_overload(fake: FakeProvider, model: Any, status: int) -> None:
    fake.add(json_error(status, {"error": {"message": "Overloaded"}}))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert (info.value.kind, info.value.status) == ("overload", status)
    assert info.value.retryable
    assert len(fake.requests) == 1


def test_unauthorized_never_shows_the_key(fake: FakeProvider, model: Any) -> None:
    # Some servers echo the key they refused; it must not reach messages or tracebacks.
    message = f"Incorrect API key provided: {API_KEY}"
    fake.add(json_error(401, {"error": {"message": message, "code": "invalid_api_key"}}))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    error = info.value
    assert (error.kind, error.status, error.retryable) == ("auth", 401, False)
    shown = [str(error), repr(error), "".join(traceback.format_exception(error)), repr(model)]
    assert all(API_KEY not in text for text in shown)
    assert "Incorrect API key provided" in str(error)


def test_forbidden_is_auth(fake: FakeProvider, model: Any) -> None:
    fake.add(json_error(403, {"error": {"message": "not allowed"}}))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "auth"


def test_context_length(fake: FakeProvider, model: Any) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 128000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    fake.add(json_error(400, body))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert (info.value.kind, info.value.status) == ("context_length", 400)


def test_other_bad_requests_are_invalid_requests(fake: FakeProvider, model: Any) -> None:
    fake.add(json_error(400, {"error": {"message": "Unknown parameter: 'foo'"}}))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "invalid_request"


def test_connection_dropped_mid_stream(fake: FakeProvider, model: Any) -> None:
    reply = text_reply("Partial ", "answer")
    reply.chunks = reply.chunks[:2]
    reply.drop = True
    fake.add(reply)
    sink = RecordingSink()
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), sink)
    assert info.value.kind == "connection" and info.value.retryable
    assert "dropped mid-stream" in str(info.value)
    assert sink.deltas == ["Partial ", "answer"]


def test_a_stream_that_ends_without_finishing_is_a_connection_failure(
    fake: FakeProvider, model: Any
) -> None:
    fake.add(Reply(chunks=openai_stream([chunk(content="Partial")], done=False)))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "connection"


def test_an_error_inside_the_stream_is_classified(fake: FakeProvider, model: Any) -> None:
    # OpenRouter reports a failure after the 200 as a chunk with an `error` object.
    error = {"error": {"code": 502, "message": "Provider returned error"}}
    fake.add(Reply(chunks=openai_stream([chunk(content="Hel"), error], done=False)))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "overload"


def test_timeout(fake: FakeProvider) -> None:
    model = OpenAICompatModel("gpt-4.1-mini", api_key=API_KEY, base_url=fake.url, timeout=0.3)
    fake.add(Reply(chunks=openai_stream([chunk(content="Hel")], done=False), stall_after_chunks=5))
    try:
        with pytest.raises(ModelError) as info:
            model.run_turn(make_request(), RecordingSink())
    finally:
        model.close()
    assert info.value.kind == "timeout" and info.value.retryable


def test_timeout_before_the_first_byte(fake: FakeProvider) -> None:
    model = OpenAICompatModel("gpt-4.1-mini", api_key=API_KEY, base_url=fake.url, timeout=0.3)
    fake.add(Reply(stall=5))
    try:
        with pytest.raises(ModelError) as info:
            model.run_turn(make_request(), RecordingSink())
    finally:
        model.close()
    assert info.value.kind == "timeout"


def test_connection_refused(free_port: int) -> None:
    model = OpenAICompatModel("gpt-4.1-mini", base_url=f"http://127.0.0.1:{free_port}/v1")
    try:
        with pytest.raises(ModelError) as info:
            model.run_turn(make_request(), RecordingSink())
    finally:
        model.close()
    assert info.value.kind == "connection" and info.value.retryable


def test_a_failing_sink_is_not_a_model_error(fake: FakeProvider, model: Any) -> None:
    class Broken(RuntimeError):
        pass

    class BrokenSink:
        def text(self, delta: str) -> None:
            raise Broken("the stream store is down")

    fake.add(text_reply("Hi"))
    with pytest.raises(Broken):
        model.run_turn(make_request(), BrokenSink())


def test_history_maps_to_chat_messages(fake: FakeProvider, model: Any) -> None:
    calls = [
        ToolCall(id="call_1", name="lookup_order", args={"order_id": "42"}),
        ToolCall(id="call_2", name="refund", args={"order_id": "42", "amount": 10.0}),
        ToolCall(id="call_3", name="track_shipment", args={"order_id": "42"}),
    ]
    rejected = json.dumps({"rejected": True, "by": "alice", "reason": "too much"})
    history = [
        Message(role="user", content="Refund order 42"),
        Message(role="assistant", content="", tool_calls=calls),
        Message(role="tool", tool_call_id="call_1", name="lookup_order", content='{"id": "42"}'),
        Message(role="tool", tool_call_id="call_2", name="refund", content=rejected, is_error=True),
        Message(
            role="tool",
            tool_call_id="call_3",
            name="track_shipment",
            content='{"error": "carrier down"}',
            is_error=True,
        ),
        Message(role="assistant", content="I could not refund it."),
        Message(role="user", content="Why?"),
    ]
    fake.add(text_reply("Because."))
    model.run_turn(make_request(history), RecordingSink())

    assert fake.last_body["messages"] == [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Refund order 42"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.args)},
                }
                for c in calls
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"id": "42"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": rejected},
        {"role": "tool", "tool_call_id": "call_3", "content": '{"error": "carrier down"}'},
        {"role": "assistant", "content": "I could not refund it."},
        {"role": "user", "content": "Why?"},
    ]


def test_an_mcp_tools_name_is_sent_as_one_the_api_takes_and_named_back(
    fake: FakeProvider, model: Any
) -> None:
    piece = {
        "index": 0,
        "id": "call_m",
        "type": "function",
        "function": {"name": "files_read_file", "arguments": '{"path": "a"}'},
    }
    fake.add(
        Reply(
            chunks=openai_stream(
                [chunk(calls=[piece]), chunk(finish="tool_calls"), usage_chunk(3, 2)]
            )
        )
    )
    earlier = ToolCall(id="call_0", name="files.read_file", args={"path": "z"})
    history = [
        Message(role="user", content="read"),
        Message(role="assistant", content="", tool_calls=[earlier]),
        Message(role="tool", content="zz", tool_call_id="call_0", name="files.read_file"),
    ]
    tools = [ToolSpec(name="files.read_file"), ToolSpec(name="lookup")]

    response = model.run_turn(make_request(tools=tools, messages=history), RecordingSink())

    assert response.tool_calls == [
        ToolCall(id="call_m", name="files.read_file", args={"path": "a"})
    ]
    sent = fake.last_body
    assert [t["function"]["name"] for t in sent["tools"]] == ["files_read_file", "lookup"]
    [assistant] = [m for m in sent["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["function"]["name"] == "files_read_file"


def test_cached_prompt_tokens_are_counted_and_billed_at_the_cached_price(
    fake: FakeProvider, model: Any
) -> None:
    """OpenAI caches long prompts by itself and says how many of the prompt's tokens it
    read from the cache (`prompt_tokens_details.cached_tokens`, within `prompt_tokens`):
    they are billed at the model's cached-input price ($0.10/M for gpt-4.1-mini)."""
    fake.add(
        text_reply(
            "Hi",
            prompt=3000,
            completion=100,
            prompt_tokens_details={"cached_tokens": 2048, "audio_tokens": 0},
        )
    )
    usage = model.run_turn(make_request(), RecordingSink()).usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        3000,
        2048,
        0,
    )
    billed = (952 * 0.40 + 2048 * 0.10 + 100 * 1.60) / 1e6
    assert usage.cost == pytest.approx(billed)
    assert usage.cost_source == "price_table"
