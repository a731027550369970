"""The attempt marker on the inline runner: the same reader rule, no services needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_app import build_app
from fakeprovider import API_KEY, FakeProvider, Reply, anthropic_reply, json_error, openai_reply
from pydantic import SecretStr

from agent_jobs import InlineRunner, Store
from agent_jobs.models.registry import ProviderSettings
from agent_jobs.settings import Settings
from agent_jobs.streams.text import assemble_text, is_attempt_marker


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_dropped_stream_is_retried_and_the_reader_keeps_only_the_retry(
    fake: FakeProvider, tmp_path: Path, adapter: str
) -> None:
    build = openai_reply if adapter == "openai" else anthropic_reply
    doomed = build(["The order ", "is lo"])
    cut = 2 if adapter == "openai" else 4  # right after the second text piece
    fake.add(Reply(chunks=doomed.chunks[:cut], drop=True), build(["Order 42 ", "has shipped."]))
    key = SecretStr(API_KEY)
    app = build_app(
        ProviderSettings(
            openai_api_key=key,
            openai_base_url=f"{fake.url}/v1",
            anthropic_api_key=key,
            anthropic_base_url=fake.url,
        )
    )
    store = Store.from_url(f"sqlite:///{tmp_path / 'inline.db'}")
    runner = InlineRunner(app, store, settings=Settings(model_retry_base_delay=0.01))
    try:
        run_id = runner.start(f"{adapter}-chat", "Where is 42?", actor="user-7")
        frames = list(runner.frames(run_id))
        run = runner.wait(run_id)
    finally:
        store.engine.dispose()
        for spec in app.agents.values():
            close = getattr(spec.model, "close", None)
            if close is not None:
                close()

    assert run.status == "completed" and run.output == "Order 42 has shipped."
    markers = [f for f in frames if is_attempt_marker(f)]
    assert [(m["step"], m["attempt"]) for m in markers] == [("model:1", 2)]
    assert assemble_text(frames) == run.output
    assert [f["text"] for f in frames if f["type"] == "text_delta"] == [
        "The order ",
        "is lo",
        "Order 42 ",
        "has shipped.",
    ]


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_retried_run_streams_the_arguments_of_its_replayed_model_step_once(
    fake: FakeProvider, tmp_path: Path, adapter: str
) -> None:
    build = openai_reply if adapter == "openai" else anthropic_reply
    args = {"order_id": "7"}
    refused = {"error": {"type": "invalid_request_error", "message": "bad request"}}
    fake.add(
        build(["Looking. "], [("call_7", "lookup_order", args)]),
        json_error(400, refused),  # model:2 fails the run
    )
    key = SecretStr(API_KEY)
    app = build_app(
        ProviderSettings(
            openai_api_key=key,
            openai_base_url=f"{fake.url}/v1",
            anthropic_api_key=key,
            anthropic_base_url=fake.url,
        )
    )
    store = Store.from_url(f"sqlite:///{tmp_path / 'inline.db'}")
    runner = InlineRunner(app, store, settings=Settings(model_retry_base_delay=0.01))
    try:
        run_id = runner.start(adapter, "Where is 7?", actor="user-7")
        assert runner.wait(run_id).status == "failed"
        failed = list(runner.frames(run_id))
        fake.add(build(["Order 7 ", "is delivered."]))
        # The retry drives the run from its start: model:1 is read back from the journal.
        assert runner.retry(run_id, actor="user-7").steps == ["model:2"]
        run = runner.wait(run_id)
        frames = list(runner.frames(run_id))
    finally:
        store.engine.dispose()
        for spec in app.agents.values():
            close = getattr(spec.model, "close", None)
            if close is not None:
                close()

    assert run.status == "completed" and run.output == "Order 7 is delivered."
    assert len(fake.requests) == 3  # model:1 once, model:2 twice
    pieces = [f for f in frames if f["type"] == "tool_call_delta"]
    assert pieces == [f for f in failed if f["type"] == "tool_call_delta"]
    assert [(f["call_id"], f["name"], f["step"]) for f in pieces] == [
        ("call_7", "lookup_order", "model:1")
    ] * 2
    assert json.loads("".join(f["args_delta"] for f in pieces)) == args
    first_call = next(i for i, f in enumerate(frames) if f["type"] == "tool_call")
    assert frames.index(pieces[-1]) < first_call
