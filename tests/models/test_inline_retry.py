"""The attempt marker on the inline runner: the same reader rule, no services needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_app import build_app
from fakeprovider import API_KEY, FakeProvider, Reply, anthropic_reply, openai_reply
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
