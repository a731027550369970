"""`AnthropicModel` against a local server speaking the Messages API's SSE."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Iterator
from email.utils import formatdate
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
    anthropic_stream,
    json_error,
    make_request,
)

from agent_jobs.errors import ConfigurationError, ModelError
from agent_jobs.messages import Message, ModelSettings, ToolCall, ToolSpec
from agent_jobs.models.anthropic import AnthropicModel
from agent_jobs.models.base import Model
from tests.support.waiting import TIMEOUT

MODEL = "claude-haiku-4-5"


def start(input_tokens: int = 200, **cache: int) -> dict[str, Any]:
    usage = {"input_tokens": input_tokens, "output_tokens": 1, **cache}
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return {"type": "message_start", "message": message}


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def tool_start(index: int, id: str, name: str) -> dict[str, Any]:
    block = {"type": "tool_use", "id": id, "name": name, "input": {}}
    return {"type": "content_block_start", "index": index, "content_block": block}


def json_piece(index: int, partial: str) -> dict[str, Any]:
    delta = {"type": "input_json_delta", "partial_json": partial}
    return {"type": "content_block_delta", "index": index, "delta": delta}


def finish(output_tokens: int = 40, reason: str = "end_turn") -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def text_reply(*pieces: str) -> Reply:
    return Reply(chunks=anthropic_stream([start(), *text_block(0, *pieces), *finish()]))


@pytest.fixture
def model(fake: FakeProvider) -> Iterator[AnthropicModel]:
    """The adapter with prompt caching off: the requests as mapped, with no breakpoints
    (caching has tests of its own, in test_anthropic_cache.py)."""
    m = AnthropicModel(
        MODEL, api_key=API_KEY, base_url=fake.url, timeout=TIMEOUT, prompt_cache=False
    )
    yield m
    m.close()


def test_it_is_a_model(model: AnthropicModel) -> None:
    assert isinstance(model, Model)
    assert model.name == "anthropic:claude-haiku-4-5"


def test_text_streams_to_the_sink_as_it_arrives(fake: FakeProvider, model: Any) -> None:
    gate = Gate()
    events = [start(), {"type": "ping"}, *text_block(0, "Order ", "42 ", "shipped."), *finish()]
    chunks = anthropic_stream(events)
    chunks.insert(4, gate)  # after the first text delta
    fake.add(Reply(chunks=chunks))
    sink = RecordingSink(on_first=gate.opened.set)

    response = model.run_turn(make_request(), sink)

    assert fake.gate_timeouts == 0, "the first delta reached the sink only after the stream"
    assert sink.deltas == ["Order ", "42 ", "shipped."]
    assert response.text == "Order 42 shipped."
    assert response.model == MODEL
    assert (response.usage.input_tokens, response.usage.output_tokens) == (200, 40)
    # Priced from the built-in table: 200 * $1/M + 40 * $5/M.
    assert response.usage.cost == pytest.approx(0.0004)
    assert response.usage.cost_source == "price_table"

    sent = fake.requests[0]
    assert sent.path == "/v1/messages"
    # Older SDKs send the key as `x-api-key`, newer ones as a bearer token.
    sent_key = sent.headers.get("x-api-key") or sent.headers["authorization"].removeprefix(
        "Bearer "
    )
    assert sent_key == API_KEY
    assert sent.body["stream"] is True
    assert sent.body["max_tokens"] == 4096
    assert sent.body["system"] == "You are a support agent."
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where is order 42?"}]}
    ]
    assert "thinking" not in sent.body


def test_cached_input_counts_as_input(fake: FakeProvider, model: Any) -> None:
    events = [start(10, cache_read_input_tokens=90), *text_block(0, "Hi"), *finish(5)]
    fake.add(Reply(chunks=anthropic_stream(events)))
    usage = model.run_turn(make_request(), RecordingSink()).usage
    assert (usage.input_tokens, usage.output_tokens) == (100, 5)


def test_tool_uses_assemble_from_split_json(fake: FakeProvider, model: Any) -> None:
    events = [
        start(),
        *text_block(0, "Checking both."),
        tool_start(1, "toolu_a", "lookup_order"),
        json_piece(1, ""),
        json_piece(1, '{"order'),
        json_piece(1, '_id": "42"}'),
        {"type": "content_block_stop", "index": 1},
        tool_start(2, "toolu_b", "track_shipment"),
        json_piece(2, '{"order_id": "42", '),
        json_piece(2, '"carrier": null}'),
        {"type": "content_block_stop", "index": 2},
        tool_start(3, "toolu_c", "list_orders"),  # no input at all
        {"type": "content_block_stop", "index": 3},
        *finish(reason="tool_use"),
    ]
    fake.add(Reply(chunks=anthropic_stream(events)))
    tools = [ToolSpec(name="lookup_order", description="Find an order"), ToolSpec(name="x")]

    response = model.run_turn(make_request(tools=tools), RecordingSink())

    assert response.text == "Checking both."
    assert response.tool_calls == [
        ToolCall(id="toolu_a", name="lookup_order", args={"order_id": "42"}),
        ToolCall(id="toolu_b", name="track_shipment", args={"order_id": "42", "carrier": None}),
        ToolCall(id="toolu_c", name="list_orders", args={}),
    ]
    assert fake.last_body["tools"] == [
        {
            "name": "lookup_order",
            "description": "Find an order",
            "input_schema": {"type": "object", "properties": {}},
        },
        {"name": "x", "input_schema": {"type": "object", "properties": {}}},
    ]


def test_tool_use_input_streams_to_the_sink_as_it_arrives(fake: FakeProvider, model: Any) -> None:
    events = [
        start(),
        *text_block(0, "Refunding."),
        tool_start(1, "toolu_a", "refund"),
        json_piece(1, ""),
        json_piece(1, '{"order'),
        json_piece(1, '_id": "42", "amount": 5.0, "note": "caf\u00e9 \u2603"}'),
        {"type": "content_block_stop", "index": 1},
        tool_start(2, "toolu_b", "lookup_order"),
        json_piece(2, '{"order_id": "7"}'),
        {"type": "content_block_stop", "index": 2},
        tool_start(3, "toolu_c", "list_orders"),  # no input at all: nothing streams
        {"type": "content_block_stop", "index": 3},
        *finish(reason="tool_use"),
    ]
    gate = Gate()
    chunks = anthropic_stream(events)
    chunks.insert(7, gate)  # after the first piece of input: the rest waits for the sink
    fake.add(Reply(chunks=chunks))
    sink = RecordingSink(on_first_args=gate.opened.set)

    response = model.run_turn(make_request(), sink)

    assert fake.gate_timeouts == 0, "the input reached the sink only after the stream"
    assert sink.args == [
        ArgsPiece("toolu_a", "refund", '{"order', 0, 0),
        ArgsPiece("toolu_a", "refund", '_id": "42", "amount": 5.0, "note": "café ☃"}', 0, 7),
        ArgsPiece("toolu_b", "lookup_order", '{"order_id": "7"}', 1, 0),
    ]
    assert sink.events[0] == "Refunding."
    written = sink.written()
    assert {call.id: call.args for call in response.tool_calls} == {
        **{call_id: json.loads(text) for call_id, text in written.items()},
        "toolu_c": {},
    }


def test_input_sent_whole_with_the_block_start_streams_as_one_piece(
    fake: FakeProvider, model: Any
) -> None:
    block = {"type": "tool_use", "id": "toolu_a", "name": "refund", "input": {"order_id": "42"}}
    events = [
        start(),
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_stop", "index": 0},
        *finish(reason="tool_use"),
    ]
    fake.add(Reply(chunks=anthropic_stream(events)))
    sink = RecordingSink()

    response = model.run_turn(make_request(), sink)

    assert sink.args == [ArgsPiece("toolu_a", "refund", '{"order_id": "42"}', 0, 0)]
    assert response.tool_calls == [ToolCall(id="toolu_a", name="refund", args={"order_id": "42"})]


def test_a_sink_that_takes_only_text_still_gets_the_reply(fake: FakeProvider, model: Any) -> None:
    events = [
        start(),
        *text_block(0, "One moment."),
        tool_start(1, "toolu_a", "lookup_order"),
        json_piece(1, '{"order_id": "42"}'),
        {"type": "content_block_stop", "index": 1},
        *finish(reason="tool_use"),
    ]
    fake.add(Reply(chunks=anthropic_stream(events)))
    sink = TextOnlySink()

    response = model.run_turn(make_request(), sink)

    assert sink.deltas == ["One moment."]
    assert response.tool_calls == [
        ToolCall(id="toolu_a", name="lookup_order", args={"order_id": "42"})
    ]


def test_malformed_tool_json_is_an_invalid_response(fake: FakeProvider, model: Any) -> None:
    events = [start(), tool_start(0, "t1", "lookup_order"), json_piece(0, '{"order_id": 4')]
    fake.add(Reply(chunks=anthropic_stream([*events, *finish(reason="max_tokens")])))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "invalid_response"


def test_rate_limit_with_an_http_date_then_success(fake: FakeProvider, model: Any) -> None:
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down"}}
    when = formatdate(time.time() + 30, usegmt=True)
    fake.add(json_error(429, body, {"Retry-After": when}), text_reply("Fine now."))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    error = info.value
    assert (error.kind, error.status, error.provider) == ("rate_limit", 429, "anthropic")
    assert error.retry_after is not None and 25 < error.retry_after <= 31
    assert len(fake.requests) == 1, "the SDK must not retry on its own"

    assert model.run_turn(make_request(), RecordingSink()).text == "Fine now."


def test_overloaded_529(fake: FakeProvider, model: Any) -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.add(json_error(529, body))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert (info.value.kind, info.value.status, info.value.retryable) == ("overload", 529, True)


def test_overloaded_inside_the_stream(fake: FakeProvider, model: Any) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.add(Reply(chunks=anthropic_stream([start(), *text_block(0, "Hel"), error])))
    sink = RecordingSink()
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), sink)
    assert (info.value.kind, info.value.status) == ("overload", None)
    assert sink.deltas == ["Hel"]


def test_unauthorized_never_shows_the_key(fake: FakeProvider, model: Any) -> None:
    message = f"invalid x-api-key {API_KEY}"
    body = {"type": "error", "error": {"type": "authentication_error", "message": message}}
    fake.add(json_error(401, body))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    error = info.value
    assert (error.kind, error.status, error.retryable) == ("auth", 401, False)
    shown = [str(error), repr(error), "".join(traceback.format_exception(error)), repr(model)]
    assert all(API_KEY not in text for text in shown)


def test_prompt_too_long_is_context_length(fake: FakeProvider, model: Any) -> None:
    message = "prompt is too long: 215000 tokens > 200000 maximum"
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    fake.add(json_error(400, body))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert (info.value.kind, info.value.status) == ("context_length", 400)


def test_connection_dropped_mid_stream(fake: FakeProvider, model: Any) -> None:
    fake.add(Reply(chunks=anthropic_stream([start(), *text_block(0, "Partial")]), drop=True))
    sink = RecordingSink()
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), sink)
    assert info.value.kind == "connection" and info.value.retryable
    assert "dropped mid-stream" in str(info.value)
    assert sink.deltas == ["Partial"]


def test_a_stream_that_ends_without_message_stop(fake: FakeProvider, model: Any) -> None:
    fake.add(Reply(chunks=anthropic_stream([start(), *text_block(0, "Partial")])))
    with pytest.raises(ModelError) as info:
        model.run_turn(make_request(), RecordingSink())
    assert info.value.kind == "connection"


def test_timeout_mid_stream(fake: FakeProvider) -> None:
    model = AnthropicModel(MODEL, api_key=API_KEY, base_url=fake.url, timeout=0.3)
    fake.add(Reply(chunks=anthropic_stream([start()]), stall_after_chunks=5))
    try:
        with pytest.raises(ModelError) as info:
            model.run_turn(make_request(), RecordingSink())
    finally:
        model.close()
    assert info.value.kind == "timeout" and info.value.retryable


def test_connection_refused(free_port: int) -> None:
    model = AnthropicModel(MODEL, api_key=API_KEY, base_url=f"http://127.0.0.1:{free_port}")
    try:
        with pytest.raises(ModelError) as info:
            model.run_turn(make_request(), RecordingSink())
    finally:
        model.close()
    assert info.value.kind == "connection"


def test_litellm_cost_header(fake: FakeProvider, model: Any) -> None:
    reply = text_reply("Hi")
    reply.headers["x-litellm-response-cost"] = "0.0123"
    fake.add(reply)
    usage = model.run_turn(make_request(), RecordingSink()).usage
    assert (usage.cost, usage.cost_source) == (pytest.approx(0.0123), "provider")


def test_history_maps_to_messages_turns(fake: FakeProvider, model: Any) -> None:
    calls = [
        ToolCall(id="toolu_1", name="lookup_order", args={"order_id": "42"}),
        ToolCall(id="toolu_2", name="refund", args={"order_id": "42", "amount": 10.0}),
        ToolCall(id="toolu_3", name="track_shipment", args={"order_id": "42"}),
    ]
    rejected = json.dumps({"rejected": True, "by": "alice", "reason": "too much"})
    history = [
        Message(role="user", content="Refund order 42"),
        Message(role="assistant", content="Let me look.", tool_calls=calls),
        Message(role="tool", tool_call_id="toolu_1", name="lookup_order", content='{"id": "42"}'),
        Message(
            role="tool", tool_call_id="toolu_2", name="refund", content=rejected, is_error=True
        ),
        Message(
            role="tool",
            tool_call_id="toolu_3",
            name="track_shipment",
            content='{"error": "carrier down"}',
            is_error=True,
        ),
        Message(role="user", content="Also, why?"),
    ]
    fake.add(text_reply("Because."))
    model.run_turn(make_request(history), RecordingSink())

    assert fake.last_body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Refund order 42"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                *({"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in calls),
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"id": "42"}'},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": rejected,
                    "is_error": True,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_3",
                    "content": '{"error": "carrier down"}',
                    "is_error": True,
                },
                {"type": "text", "text": "Also, why?"},
            ],
        },
    ]


def test_reasoning_effort_turns_on_thinking_at_the_start_of_a_turn(
    fake: FakeProvider, model: Any
) -> None:
    fake.add(text_reply("Hi"), text_reply("Done"))
    settings = ModelSettings(reasoning_effort="medium", max_tokens=2000, temperature=0.5)
    model.run_turn(make_request(settings=settings), RecordingSink())
    body = fake.last_body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["max_tokens"] == 2000 + 4096  # room for the answer after the budget
    assert "temperature" not in body  # the API refuses sampling parameters

    # Inside a tool loop the thinking blocks would have to come back; they cannot, so no thinking.
    call = ToolCall(id="toolu_1", name="lookup_order", args={})
    history = [
        Message(role="user", content="Where is order 42?"),
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", tool_call_id="toolu_1", content="{}"),
    ]
    model.run_turn(make_request(history, settings=settings), RecordingSink())
    body = fake.last_body
    assert "thinking" not in body
    assert body["max_tokens"] == 2000


def test_a_bad_reasoning_effort_is_refused_early() -> None:
    with pytest.raises(ConfigurationError):
        AnthropicModel(MODEL, api_key=API_KEY, reasoning_effort="extreme")
