"""Anthropic prompt caching against the local protocol server: where a request carries
`cache_control`, what a billed response's cache reads and writes come to in the usage, the
ledger and the cost, and the setting that turns it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_app import build_app
from fakeprovider import (
    API_KEY,
    FakeProvider,
    RecordingSink,
    Reply,
    anthropic_reply,
    anthropic_stream,
    make_request,
)
from pydantic import SecretStr

from agent_jobs import InlineRunner, Store
from agent_jobs.messages import Message, ToolCall, ToolSpec, Usage
from agent_jobs.models.anthropic import AnthropicModel
from agent_jobs.models.pricing import PriceTable
from agent_jobs.models.registry import ProviderSettings, resolve_model
from agent_jobs.settings import Settings
from agent_jobs.store import usage
from tests.support.builders import add_run
from tests.support.waiting import TIMEOUT

MODEL = "claude-haiku-4-5"
EPHEMERAL = {"type": "ephemeral"}
TOOLS = [
    ToolSpec(name="lookup_order", input_schema={"type": "object", "properties": {}}),
    ToolSpec(name="refund", input_schema={"type": "object", "properties": {}}),
]


@pytest.fixture
def model(fake: FakeProvider) -> Iterator[AnthropicModel]:
    m = AnthropicModel(MODEL, api_key=API_KEY, base_url=fake.url, timeout=TIMEOUT)
    yield m
    m.close()


def marks(body: dict[str, Any]) -> list[str]:
    """Where the request's cache breakpoints are: `tools[i]`, `system`, `messages[i]`
    (on the message's last block: no other block carries one)."""
    found = [f"tools[{i}]" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += ["system" for block in system if "cache_control" in block]
    for i, message in enumerate(body["messages"]):
        blocks = message["content"]
        assert all("cache_control" not in b for b in blocks[:-1]), message
        if "cache_control" in blocks[-1]:
            assert blocks[-1]["cache_control"] == EPHEMERAL
            found.append(f"messages[{i}]")
    return found


def after_a_decision() -> list[Message]:
    """A turn that stopped on an action for a person and goes on once it is decided."""
    return [
        Message(role="user", content="Refund order 42"),
        Message(
            role="assistant",
            content="Refunding.",
            tool_calls=[ToolCall(id="toolu_1", name="refund", args={"order_id": "42"})],
        ),
        Message(role="tool", tool_call_id="toolu_1", name="refund", content='{"refunded": 5}'),
    ]


def test_the_first_request_marks_the_tools_the_system_and_the_question(
    fake: FakeProvider, model: AnthropicModel
) -> None:
    fake.add(anthropic_reply(["Hi"]))
    model.run_turn(make_request(tools=TOOLS), RecordingSink())
    body = fake.last_body
    assert marks(body) == ["tools[1]", "system", "messages[0]"]
    assert body["system"] == [
        {"type": "text", "text": "You are a support agent.", "cache_control": EPHEMERAL}
    ]
    assert body["tools"][1]["cache_control"] == EPHEMERAL


def test_the_request_after_a_decision_reads_the_history_and_writes_it_whole(
    fake: FakeProvider, model: AnthropicModel
) -> None:
    """Four breakpoints, the API's most: the tools, the system prompt, the history up to
    the last assistant turn (what the request before ended on), and the whole history."""
    fake.add(anthropic_reply(["Done."]))
    model.run_turn(make_request(after_a_decision(), tools=TOOLS), RecordingSink())
    body = fake.last_body
    assert marks(body) == ["tools[1]", "system", "messages[0]", "messages[2]"]
    assert body["messages"][2]["content"][-1] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": '{"refunded": 5}',
        "cache_control": EPHEMERAL,
    }


def test_a_long_tool_loop_marks_where_the_request_before_ended(
    fake: FakeProvider, model: AnthropicModel
) -> None:
    history = [
        *after_a_decision(),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="toolu_2", name="lookup_order", args={"order_id": "7"})],
        ),
        Message(role="tool", tool_call_id="toolu_2", name="lookup_order", content="{}"),
    ]
    fake.add(anthropic_reply(["Done."]))
    model.run_turn(make_request(history, tools=TOOLS), RecordingSink())
    assert marks(fake.last_body) == ["tools[1]", "system", "messages[2]", "messages[4]"]


def test_with_no_tools_only_the_system_prompt_is_marked(
    fake: FakeProvider, model: AnthropicModel
) -> None:
    """With no tool to call, the next request waits for the user: most likely past the
    cache's five minutes, so writing the history would cost 1.25x for nothing."""
    history = [
        Message(role="user", content="Hello"),
        Message(role="assistant", content="Hi, how can I help?"),
        Message(role="user", content="Where is order 42?"),
    ]
    fake.add(anthropic_reply(["Shipped."]))
    model.run_turn(make_request(history), RecordingSink())
    assert marks(fake.last_body) == ["system"]


def test_caching_off_sends_no_breakpoint(fake: FakeProvider) -> None:
    off = AnthropicModel(
        MODEL, api_key=API_KEY, base_url=fake.url, timeout=TIMEOUT, prompt_cache=False
    )
    try:
        fake.add(anthropic_reply(["Done."]))
        off.run_turn(make_request(after_a_decision(), tools=TOOLS), RecordingSink())
    finally:
        off.close()
    body = fake.last_body
    assert "cache_control" not in json.dumps(body)
    assert body["system"] == "You are a support agent."


def test_the_setting_turns_caching_off(monkeypatch: pytest.MonkeyPatch) -> None:
    key = SecretStr(API_KEY)
    assert isinstance(
        on := resolve_model(f"anthropic:{MODEL}", settings=_settings(key)), AnthropicModel
    )
    assert on.prompt_cache
    monkeypatch.setenv("AGENT_JOBS_ANTHROPIC_CACHE", "0")
    monkeypatch.setenv("AGENT_JOBS_ANTHROPIC_API_KEY", API_KEY)
    off = resolve_model(f"anthropic:{MODEL}")
    assert isinstance(off, AnthropicModel) and not off.prompt_cache


def _settings(key: SecretStr) -> ProviderSettings:
    return ProviderSettings(anthropic_api_key=key)


def test_a_billed_response_counts_and_prices_cache_reads_and_writes(
    fake: FakeProvider, model: AnthropicModel
) -> None:
    """The API bills `input_tokens` (uncached), `cache_creation_input_tokens` at 1.25x
    and `cache_read_input_tokens` at 0.1x the input price; all three are input."""
    fake.add(
        anthropic_reply(
            ["Hi"], input_tokens=100, output_tokens=50, cache_read=8000, cache_write=2000
        )
    )
    usage = model.run_turn(make_request(tools=TOOLS), RecordingSink()).usage
    assert (usage.input_tokens, usage.output_tokens) == (10_100, 50)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (8000, 2000)
    # claude-haiku-4-5: $1 input, $5 output per million tokens.
    billed = (100 * 1.00 + 2000 * 1.25 + 8000 * 0.10 + 50 * 5.00) / 1_000_000
    assert usage.cost == pytest.approx(billed) and usage.cost_source == "price_table"
    uncached = PriceTable().cost(MODEL, 10_100, 50)
    assert uncached is not None and usage.cost < uncached


def test_the_counts_of_the_message_delta_win(fake: FakeProvider, model: AnthropicModel) -> None:
    """message_delta carries cumulative counts, which replace message_start's."""
    events: list[dict[str, Any]] = [
        *_events(anthropic_reply(["Hi"], input_tokens=10, cache_read=0, cache_write=0)),
    ]
    for event in events:
        if event["type"] == "message_delta":
            event["usage"] = {
                "input_tokens": 10,
                "output_tokens": 7,
                "cache_read_input_tokens": 300,
                "cache_creation_input_tokens": 40,
            }
    fake.add(Reply(chunks=anthropic_stream(events)))
    usage = model.run_turn(make_request(), RecordingSink()).usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (350, 300, 40)
    assert usage.output_tokens == 7


def _events(reply: Reply) -> list[dict[str, Any]]:
    found = []
    for chunk in reply.chunks:
        assert isinstance(chunk, bytes)
        for line in chunk.decode().splitlines():
            if line.startswith("data: "):
                found.append(json.loads(line[len("data: ") :]))
    return found


def test_a_price_entry_may_give_its_own_cache_prices() -> None:
    table = PriceTable().merged({})
    from agent_jobs.models.pricing import load_price_table

    custom = load_price_table(
        {"house-model": {"input": 2.0, "output": 4.0, "cache_write": 3.0, "cache_read": 0.5}}
    )
    assert custom.cost("house-model", 1000, 0, cache_read_tokens=600, cache_write_tokens=300) == (
        pytest.approx((100 * 2.0 + 300 * 3.0 + 600 * 0.5) / 1_000_000)
    )
    assert table.cost(MODEL, 1000, 0, cache_read_tokens=1000) == pytest.approx(1000 * 0.1 / 1e6)


def test_the_ledger_holds_what_the_provider_billed(fake: FakeProvider, tmp_path: Path) -> None:
    """A run on the inline runner: its first call writes the cache, the one after the
    tool's result reads it; the usage ledger holds each call's figures and cost."""
    fake.add(
        anthropic_reply(
            ["Looking. "],
            [("toolu_7", "lookup_order", {"order_id": "7"})],
            input_tokens=20,
            output_tokens=30,
            cache_write=3000,
        ),
        anthropic_reply(
            ["Order 7 is delivered."], input_tokens=60, output_tokens=12, cache_read=3000
        ),
    )
    key = SecretStr(API_KEY)
    app = build_app(
        ProviderSettings(openai_api_key=key, anthropic_api_key=key, anthropic_base_url=fake.url)
    )
    store = Store.from_url(f"sqlite:///{tmp_path / 'inline.db'}")
    runner = InlineRunner(app, store, settings=Settings())
    try:
        run = runner.run("anthropic", "Where is order 7?", actor="user-7", timeout=TIMEOUT)
        rows = store.usage(run.run_id)
        totals = store.totals(run.run_id)
    finally:
        store.engine.dispose()
        for spec in app.agents.values():
            close = getattr(spec.model, "close", None)
            if close is not None:
                close()

    assert run.status == "completed", run.error
    first, second = (r.body for r in fake.requests)
    assert marks(first) == ["tools[1]", "system", "messages[0]"]
    assert marks(second) == ["tools[1]", "system", "messages[0]", "messages[2]"]
    figures = [
        (
            r["step"],
            r["input_tokens"],
            r["cache_write_tokens"],
            r["cache_read_tokens"],
            r["output_tokens"],
        )
        for r in rows
    ]
    assert figures == [("model:1", 3020, 3000, 0, 30), ("model:2", 3060, 0, 3000, 12)]
    costs = [(20 * 1.0 + 3000 * 1.25 + 30 * 5.0) / 1e6, (60 * 1.0 + 3000 * 0.1 + 12 * 5.0) / 1e6]
    assert [r["cost"] for r in rows] == [pytest.approx(c) for c in costs]
    assert {r["cost_source"] for r in rows} == {"price_table"}
    # The run's totals (status, GET /v1/runs/{id}) say what the cache took.
    assert (totals["input_tokens"], totals["cache_read_tokens"], totals["cache_write_tokens"]) == (
        3020 + 3060,
        3000,
        3000,
    )
    assert totals["cost"] == pytest.approx(sum(costs))


@pytest.mark.processes  # the CLI as a user runs it
def test_status_says_what_the_cache_took(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'status.db'}"
    store = Store.from_url(url, auto_upgrade=True)
    add_run(store, "cached-1")
    with store.begin() as conn:
        for step, spent in (
            ("model:1", Usage(input_tokens=3020, output_tokens=30, cache_write_tokens=3000)),
            ("model:2", Usage(input_tokens=3060, output_tokens=12, cache_read_tokens=3000)),
        ):
            usage.charge(
                conn,
                run_id="cached-1",
                thread_id="t1",
                actor="u",
                day="2026-12-05",
                step=step,
                kind="turn",
                model="claude",
                spent=spent,
            )
    store.engine.dispose()
    env = {**os.environ, "AGENT_JOBS_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "status", "cached-1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "tokens in 6080 (3000 read from the cache, 3000 written to it) out 42" in done.stdout
