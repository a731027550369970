"""The OpenTelemetry GenAI semantic conventions on the steps' spans, with the real Anthropic
adapter against the local protocol server: on the inline runner (an in-memory exporter),
and across real Celery worker processes that write every span they finish to a file of
their own (tests/models/e2e_otel.py) — one span per step that ran, none for a replay,
also when the worker that ran a model step is killed and another replays it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_app import build_app
from fakeprovider import API_KEY, FakeProvider, anthropic_reply
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from pydantic import SecretStr
from test_durable_e2e import FAST_RECOVERY, REFUND_ARGS, Deployment

from agent_jobs import (
    AgentApp,
    InlineRunner,
    ScriptedModel,
    SlidingWindowHistory,
    Store,
    summarize_with_model,
)
from agent_jobs.messages import Message, ModelRequest, ModelSettings, ToolCall
from agent_jobs.models.anthropic import AnthropicModel
from agent_jobs.models.registry import ProviderSettings
from agent_jobs.observability import genai as genai_attributes
from agent_jobs.observability import tracing
from agent_jobs.settings import Settings
from agent_jobs.steps import InvokeTool, ModelTurn, Summarize, dump
from tests.support.apps.otel import read_spans
from tests.support.waiting import TIMEOUT, eventually

SPANS_BROKER_DB = 2
REQUESTED = "claude-haiku-4-5"
ANSWERED = "claude-haiku-4-5-20251001"  # what the server says answered (a dated snapshot)
WAITS = ("approval:", "answers:", "agent:", "patch:")  # not work a step does
PRICE_IN, PRICE_OUT = 1.00, 5.00  # claude-haiku-4-5, USD per million tokens


def billed(uncached: int, output: int, *, write: int = 0, read: int = 0) -> float:
    return (uncached * PRICE_IN + write * PRICE_IN * 1.25 + read * PRICE_IN * 0.1) / 1e6 + (
        output * PRICE_OUT / 1e6
    )


def chat(
    inputs: int, output: int, *, write: int = 0, read: int = 0
) -> dict[str, str | int | float]:
    """A model step's GenAI attributes, for a call billed `inputs` uncached input tokens."""
    expected: dict[str, str | int | float] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": REQUESTED,
        "gen_ai.response.model": ANSWERED,
        "gen_ai.usage.input_tokens": inputs + write + read,
        "gen_ai.usage.output_tokens": output,
        "agent_jobs.cost_usd": pytest.approx(billed(inputs, output, write=write, read=read)),
    }
    if write:
        expected["gen_ai.usage.cache_creation.input_tokens"] = write
    if read:
        expected["gen_ai.usage.cache_read.input_tokens"] = read
    return expected


def tool(name: str, call_id: str) -> dict[str, str]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
    }


def genai_of(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if k.startswith("gen_ai.") or k.endswith("_usd")}


def test_the_names_are_the_semantic_conventions_packages() -> None:
    names = {**chat(1, 1, write=1, read=1), **tool("t", "c")}
    assert set(names) - {"agent_jobs.cost_usd"} == {
        gen_ai.GEN_AI_OPERATION_NAME,
        gen_ai.GEN_AI_PROVIDER_NAME,
        gen_ai.GEN_AI_REQUEST_MODEL,
        gen_ai.GEN_AI_RESPONSE_MODEL,
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS,
        gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
        gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
        gen_ai.GEN_AI_TOOL_NAME,
        gen_ai.GEN_AI_TOOL_CALL_ID,
    }


# --- the inline runner ----------------------------------------------------------------------


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Tracing on, with a provider of the test's own (the global one is left alone)."""
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    return found


def test_the_inline_runners_spans_carry_the_genai_attributes(
    fake: FakeProvider, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    fake.add(
        anthropic_reply(
            ["Looking. "],
            [("toolu_7", "lookup_order", {"order_id": "7"})],
            input_tokens=20,
            output_tokens=30,
            cache_write=3000,
        ),
        anthropic_reply(["Delivered."], input_tokens=60, output_tokens=12, cache_read=3000),
    )
    key = SecretStr(API_KEY)
    app = build_app(
        ProviderSettings(openai_api_key=key, anthropic_api_key=key, anthropic_base_url=fake.url)
    )
    store = Store.from_url(f"sqlite:///{tmp_path / 'inline.db'}")
    try:
        runner = InlineRunner(app, store, settings=Settings())
        run = runner.run("anthropic", "Where is order 7?", actor="user-7", timeout=TIMEOUT)
        steps = [row["step"] for row in store.journal(run.run_id)]
    finally:
        store.engine.dispose()
        for spec in app.agents.values():
            getattr(spec.model, "close", lambda: None)()
    assert run.status == "completed", run.error

    spans = [s for s in exporter.get_finished_spans() if s.name != "run"]
    assert Counter(s.name for s in spans) == Counter(steps)
    found = {s.name: genai_of(dict(s.attributes or {})) for s in spans}
    assert found.pop("model:1") == chat(20, 30, write=3000)
    assert found.pop("model:2") == chat(60, 12, read=3000)
    assert found.pop("tool:toolu_7") == tool("lookup_order", "toolu_7")
    assert all(not extra for extra in found.values()), found  # local steps carry none


def test_a_failed_step_a_summary_and_an_unknown_agent(exporter: InMemorySpanExporter) -> None:
    """A model step that failed names what it asked for and no usage; a tool step that
    failed still names its tool; a summary is a `chat` of the summarizer's model; an
    intent that cannot be described gives nothing (the span keeps its own attributes)."""
    app = AgentApp()
    summarizer = AnthropicModel(REQUESTED, api_key=API_KEY)
    window = SlidingWindowHistory(max_messages=4, summarize=summarize_with_model(summarizer))
    app.agent("a", model=ScriptedModel([{"text": "hi"}], name="scripted"), history=window)
    request = ModelRequest(run_id="r", agent="a", step=0, system="s", messages=[])
    failed = genai_attributes.attributes(app, dump(ModelTurn(request=request)), None)
    assert failed == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
    }
    chosen = request.model_copy(update={"settings": ModelSettings(model="other-model")})
    asked = genai_attributes.attributes(app, ModelTurn(request=chosen), None)
    assert asked["gen_ai.request.model"] == "other-model"
    call = ToolCall(id="c1", name="refund")
    invoke = InvokeTool(run_id="r", agent="a", actor="u", call=call, offered=["refund"])
    assert genai_attributes.attributes(app, dump(invoke), None) == tool("refund", "c1")
    summary = Summarize(run_id="r", agent="a", messages=[Message(role="user", content="x")])
    usage = {"input_tokens": 40, "output_tokens": 4, "cost": 0.0001}
    described = genai_attributes.attributes(app, dump(summary), {"model": ANSWERED, "usage": usage})
    assert described == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": REQUESTED,
        "gen_ai.response.model": ANSWERED,
        "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.output_tokens": 4,
        "agent_jobs.cost_usd": 0.0001,
    }
    unknown = request.model_copy(update={"agent": "nobody"})
    assert genai_attributes.attributes(app, dump(ModelTurn(request=unknown)), None) == {}
    assert genai_attributes.attributes(app, {"type": "persist_user"}, None) == {}


# --- real workers ---------------------------------------------------------------------------


class TracedDeployment(Deployment):
    """Workers that load e2e_otel:app, tracing on, each process writing its spans to `spans`."""

    def __init__(self, broker: str, pg_url: str, fake: FakeProvider, tmp: Path) -> None:
        super().__init__(broker, pg_url, fake, tmp)
        self.spans = tmp / "spans"
        self.spans.mkdir()

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env(**extra)
        env.update(
            AGENT_JOBS_APP="e2e_otel:app",
            AGENT_JOBS_OTEL="1",
            OTEL_TRACES_EXPORTER="none",
            TEST_SPANS_DIR=str(self.spans),
        )
        return env

    def spans_of(self, run_id: str) -> list[dict[str, Any]]:
        """The run's steps' spans (not the root `run` the worker made for it)."""
        return [
            s
            for s in read_spans(self.spans)
            if s["attributes"].get("agent_jobs.run_id") == run_id and s["name"] != "run"
        ]


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def traced(
    pg_url: str, redis_url: str, provider: FakeProvider, tmp_path: Path
) -> Iterator[TracedDeployment]:
    broker = redis_url.rsplit("/", 1)[0] + f"/{SPANS_BROKER_DB}"
    provider.replies.clear()
    provider.requests.clear()
    d = TracedDeployment(broker, pg_url, provider, tmp_path)
    try:
        yield d
    finally:
        d.close()


def ran(d: Deployment, run_id: str) -> list[str]:
    """The steps the run carried out (a person's wait is none)."""
    return [j["step"] for j in d.store.journal(run_id) if not j["step"].startswith(WAITS)]


def wait_for_spans(d: TracedDeployment, run_id: str, steps: list[str]) -> list[dict[str, Any]]:
    def every_step() -> list[dict[str, Any]] | None:
        spans = d.spans_of(run_id)
        return spans if set(steps) <= {s["name"] for s in spans} else None

    return eventually(every_step, what="every step's span", context=lambda: d.logs()[-6000:])


def approve_when_asked(d: Deployment, run_id: str, call_id: str) -> None:
    d.until(
        "the approval request streamed",
        lambda: any(f["type"] == "approval_request" for f in d.frames(run_id)),
    )
    request = next(f for f in d.frames(run_id) if f["type"] == "approval_request")
    assert d.client.decide(
        run_id, call_id, "approve", actor="alice", args_sha256=request["args_sha256"]
    )


def test_a_durable_run_has_one_span_per_step_with_the_genai_attributes(
    traced: TracedDeployment,
) -> None:
    """Two reads at once, a refund a person approves, the answer: three model steps and
    three tool steps, each one span, carrying what the provider billed."""
    d = traced
    a, b, c = "toolu_s_a", "toolu_s_b", "toolu_s_c"
    d.fake.add(
        anthropic_reply(
            ["Checking. "],
            [(a, "lookup_order", {"order_id": "42"}), (b, "lookup_order", {"order_id": "7"})],
            input_tokens=120,
            output_tokens=30,
            cache_write=2000,
        ),
        anthropic_reply(
            ["Refunding. "],
            [(c, "refund", REFUND_ARGS)],
            input_tokens=310,
            output_tokens=25,
            cache_read=2000,
            cache_write=400,
        ),
        anthropic_reply(["Refunded."], input_tokens=90, output_tokens=12, cache_read=2400),
    )
    d.worker(concurrency=3)
    run_id = d.client.enqueue_run("anthropic", "Where are orders 42 and 7?", actor="user-7")
    approve_when_asked(d, run_id, c)
    run = d.wait(run_id)
    assert run.status == "completed", (run.error, d.logs()[-6000:])

    steps = ran(d, run_id)
    spans = wait_for_spans(d, run_id, steps)
    # One span per step that ran: none twice (a replay makes none), none missing.
    assert Counter(s["name"] for s in spans) == Counter(steps)
    found = {s["name"]: genai_of(s["attributes"]) for s in spans}
    assert found.pop("model:1") == chat(120, 30, write=2000)
    assert found.pop("model:2") == chat(310, 25, read=2000, write=400)
    assert found.pop("model:3") == chat(90, 12, read=2400)
    assert found.pop(f"tool:{a}") == tool("lookup_order", a)
    assert found.pop(f"tool:{b}") == tool("lookup_order", b)
    assert found.pop(f"tool:{c}") == tool("refund", c)
    assert all(not extra for extra in found.values()), found  # local steps carry none
    # The span's cost is the ledger's.
    ledger = {row["step"]: row for row in d.store.usage(run_id)}
    by_name = {s["name"]: s["attributes"] for s in spans}
    for step in ("model:1", "model:2", "model:3"):
        assert by_name[step]["agent_jobs.cost_usd"] == pytest.approx(ledger[step]["cost"])
        assert by_name[step]["gen_ai.usage.input_tokens"] == ledger[step]["input_tokens"]


def test_a_model_step_replayed_by_another_worker_keeps_its_one_span(
    traced: TracedDeployment,
) -> None:
    """The worker that ran model:1 is SIGKILLed once it committed and the run waits for a
    person; another worker replays model:1 from the journal and runs the rest."""
    d = traced
    c = "toolu_k_c"
    d.fake.add(
        anthropic_reply(
            ["Refunding. "], [(c, "refund", REFUND_ARGS)], input_tokens=80, output_tokens=20
        ),
        anthropic_reply(["Refunded."], input_tokens=90, output_tokens=8),
    )
    first = d.worker(concurrency=1, **FAST_RECOVERY)
    run_id = d.client.enqueue_run("anthropic", "Refund order 42", actor="user-7")
    d.until(
        "model:1 committed and its span written",
        lambda: (
            d.store.get_run(run_id).status == "awaiting_approval"
            and any(s["name"] == "model:1" for s in d.spans_of(run_id))
        ),
    )
    killed = {s["pid"] for s in d.spans_of(run_id)}
    first.kill()
    d.procs.remove(first)

    d.worker(concurrency=1, **FAST_RECOVERY)
    approve_when_asked(d, run_id, c)
    run = d.wait(run_id)
    assert run.status == "completed", (run.error, d.logs()[-6000:])
    assert len(d.fake.requests) == 2  # model:1 was not called again
    steps = ran(d, run_id)
    spans = wait_for_spans(d, run_id, steps)

    assert Counter(s["name"] for s in spans) == Counter(steps)
    [model_1] = [s for s in spans if s["name"] == "model:1"]
    assert model_1["pid"] in killed
    assert genai_of(model_1["attributes"]) == chat(80, 20)
    later = [s for s in spans if s["name"] in ("model:2", f"tool:{c}")]
    assert len(later) == 2 and all(s["pid"] not in killed for s in later)
