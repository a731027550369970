"""The real adapters on the durable runner: Celery worker subprocesses, Postgres, Redis.

The workers load `e2e_app:app`, whose agents are configured like a deployment's: a
model string (`openai:gpt-4.1-mini`, `anthropic:claude-haiku-4-5`) and the provider
settings in the environment, which point at the fake provider running in this process.
Worker logs are kept at DEBUG level (Celery and the SDKs), so the check that API keys
appear in no log is a check of everything the libraries could say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from e2e_app import MODELS, build_app
from fakeprovider import CallSpec, FakeProvider, Gate, Reply, anthropic_reply, openai_reply
from pydantic import SecretStr
from sqlalchemy import inspect, text

from agent_jobs import RunView
from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.messages import Message
from agent_jobs.models.pricing import PriceTable
from agent_jobs.models.registry import ProviderSettings
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.streams.base import stream_key
from agent_jobs.streams.text import assemble_text, is_attempt_marker
from tests.support.services import truncate_all
from tests.support.waiting import TIMEOUT, eventually
from tests.support.workers import ROOT, Process, service_env, start_beat, worker

HERE = Path(__file__).resolve().parent
E2E_BROKER_DB = 13
CRASH_BROKER_DB = 14
KEYS = {
    "openai": "sk-e2e-openai-7f3a9c2b4d6e8f1a0b2c",
    "anthropic": "sk-ant-e2e-5d4c3b2a1f0e9d8c7b6a",
}
FAST_RECOVERY = {
    "AGENT_JOBS_STEP_LEASE": "1.5",
    "AGENT_JOBS_SWEEP_STALE_AFTER": "1",
    "AGENT_JOBS_SWEEP_INTERVAL": "0.5",
}
# Provider variables of this machine must not reach the workers: the test sets its own.
_FOREIGN = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENROUTER_API_KEY",
    "LITELLM_API_KEY",
    "VLLM_API_KEY",
)


class Deployment:
    """Workers (and beat) on a broker of their own, a client, and what to read back."""

    def __init__(self, broker: str, pg_url: str, fake: FakeProvider, tmp: Path) -> None:
        self.broker = broker
        self.pg_url = pg_url
        self.fake = fake
        self.tmp = tmp
        self.procs: list[Process] = []
        self.redis = redis.Redis.from_url(broker)
        self.redis.flushdb()
        self.store = Store.from_url(pg_url)
        self.celery = celery_client(broker)
        # This process only enqueues and decides: its copy of the app needs the agents
        # and tools, never a model call, so it is given dummy provider settings.
        unused = SecretStr("unused")
        app = build_app(ProviderSettings(openai_api_key=unused, anthropic_api_key=unused))
        settings = Settings(broker_url=broker, database_url=pg_url)
        self.client = Client(self.store, app, settings, CeleryDispatcher(self.celery))

    def env(self, **extra: str) -> dict[str, str]:
        env = service_env(
            self.broker,
            self.pg_url,
            AGENT_JOBS_APP="e2e_app:app",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
            AGENT_JOBS_OPENAI_BASE_URL=f"{self.fake.url}/v1",
            AGENT_JOBS_OPENAI_API_KEY=KEYS["openai"],
            AGENT_JOBS_ANTHROPIC_BASE_URL=self.fake.url,
            AGENT_JOBS_ANTHROPIC_API_KEY=KEYS["anthropic"],
            OPENAI_LOG="debug",
            ANTHROPIC_LOG="debug",
            **extra,
        )
        for name in _FOREIGN:
            env.pop(name, None)
        return env

    def worker(self, concurrency: int, **extra: str) -> Process:
        proc = worker(self.env(**extra), concurrency=concurrency, name="e2e")
        proc.args = ["--loglevel=DEBUG" if a.startswith("--loglevel") else a for a in proc.args]
        self.procs.append(proc)
        return proc.start(ready="ready.")

    def beat(self, **extra: str) -> Process:
        proc = start_beat(self.env(**extra), self.tmp)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.procs)

    def entries(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """The run's stream as it is in Redis: (entry id, frame) in order."""
        raw: Any = self.redis.xrange(stream_key(run_id))
        return [(entry.decode(), json.loads(fields[b"frame"])) for entry, fields in raw]

    def frames(self, run_id: str) -> list[dict[str, Any]]:
        return [frame for _, frame in self.entries(run_id)]

    def raw_stream(self, run_id: str) -> str:
        raw: Any = self.redis.xrange(stream_key(run_id))
        return repr(raw)

    def database_text(self) -> str:
        """Every row of every table, as text: where a leaked key would be found."""
        with self.store.connect() as conn:
            names = inspect(conn).get_table_names()
            return "\n".join(
                repr(conn.execute(text(f'SELECT * FROM "{name}"')).all()) for name in names
            )

    def until(self, what: str, check: Callable[[], bool]) -> None:
        eventually(check, what=what, context=lambda: self.logs()[-6000:])

    def wait(self, run_id: str) -> RunView:
        self.until(f"run {run_id} to finish", lambda: self.store.get_run(run_id).finished)
        return self.store.get_run(run_id)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.celery.close()
        self.redis.close()
        self.store.engine.dispose()


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def _clean(deployment: Deployment) -> None:
    truncate_all(deployment.store)
    deployment.fake.replies.clear()
    deployment.fake.requests.clear()
    deployment.fake.gate_timeouts = 0


@pytest.fixture(scope="module")
def deployment(
    pg_url: str, redis_url: str, provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """Three worker processes on broker 13: two reads can run at once beside a coordinator."""
    broker = redis_url.rsplit("/", 1)[0] + f"/{E2E_BROKER_DB}"
    d = Deployment(broker, pg_url, provider, tmp_path_factory.mktemp("e2e"))
    try:
        # A model error the waterfall retries is retried after a twentieth of a second.
        d.worker(concurrency=3, AGENT_JOBS_MODEL_RETRY_BASE_DELAY="0.05")
        yield d
    finally:
        d.close()


@pytest.fixture
def e2e(deployment: Deployment) -> Deployment:
    _clean(deployment)
    return deployment


@pytest.fixture
def crash_cluster(
    pg_url: str, redis_url: str, provider: FakeProvider, tmp_path: Path
) -> Iterator[Deployment]:
    """A deployment of its own on broker 14, whose workers a test may kill."""
    broker = redis_url.rsplit("/", 1)[0] + f"/{CRASH_BROKER_DB}"
    d = Deployment(broker, pg_url, provider, tmp_path)
    try:
        _clean(d)
        yield d
    finally:
        d.close()


# --- the script of a run: two reads at once, a refund to approve, an answer ---------------

TEXTS = [
    ["Let me check ", "both orders. "],
    ["Order 42 is lost; ", "I will refund it. "],
    ["Refunded ", "order 42."],
]
TOKENS = [(120, 30), (310, 25), (420, 12)]  # (input, output) the provider reports per call
HEADER_COSTS = ["0.0011", "0.0022", "0.0033"]  # what a LiteLLM proxy says each call cost
REFUND_ARGS = {"order_id": "42", "amount": 5.0}


def call_ids(adapter: str) -> list[str]:
    prefix = "call" if adapter == "openai" else "toolu"
    return [f"{prefix}_e2e_{n}" for n in ("a", "b", "c")]


def reply(
    adapter: str,
    texts: list[str],
    calls: list[CallSpec],
    tokens: tuple[int, int],
    headers: dict[str, str] | None = None,
) -> Reply:
    if adapter == "openai":
        return openai_reply(
            texts, calls, prompt_tokens=tokens[0], completion_tokens=tokens[1], headers=headers
        )
    return anthropic_reply(
        texts, calls, input_tokens=tokens[0], output_tokens=tokens[1], headers=headers
    )


def script(adapter: str, cost_source: str) -> list[Reply]:
    a, b, c = call_ids(adapter)
    calls: list[list[CallSpec]] = [
        [(a, "lookup_order", {"order_id": "42"}), (b, "lookup_order", {"order_id": "7"})],
        [(c, "refund", REFUND_ARGS)],
        [],
    ]
    return [
        reply(
            adapter,
            TEXTS[i],
            calls[i],
            TOKENS[i],
            {"x-litellm-response-cost": HEADER_COSTS[i]} if cost_source == "provider" else None,
        )
        for i in range(3)
    ]


def tool_results_sent(adapter: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(call id, result) of the tool results a model request carried, in its order."""
    if adapter == "openai":
        return [
            (m["tool_call_id"], json.loads(m["content"]))
            for m in body["messages"]
            if m["role"] == "tool"
        ]
    return [
        (block["tool_use_id"], json.loads(block["content"]))
        for m in body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_result"
    ]


def assert_no_key(d: Deployment, run_id: str, adapter: str) -> None:
    key = KEYS[adapter]
    # The key did travel, to the provider and nowhere else.
    sent = [r.headers.get("authorization") or r.headers.get("x-api-key") for r in d.fake.requests]
    assert sent and all(key in (h or "") for h in sent)
    journal = json.dumps(d.store.journal(run_id), default=str)
    assert "model:1" in journal and key not in journal
    assert key not in d.database_text()
    assert key not in d.raw_stream(run_id)
    log = d.logs()
    # The logs are at DEBUG level, the SDKs' and HTTP clients' lines included.
    assert "agent_jobs.model_turn" in log and "HTTP Request: POST" in log
    assert key not in log


@pytest.mark.parametrize(
    ("adapter", "cost_source"),
    [
        ("openai", "price_table"),
        ("openai", "provider"),
        ("anthropic", "price_table"),
        ("anthropic", "provider"),
    ],
)
def test_a_durable_run_with_a_read_fan_out_and_an_approval(
    e2e: Deployment, adapter: str, cost_source: str
) -> None:
    e2e.fake.add(*script(adapter, cost_source))
    a, b, c = call_ids(adapter)

    run_id = e2e.client.enqueue_run(adapter, "Where are orders 42 and 7?", actor="user-7")
    e2e.until("awaiting approval", lambda: e2e.store.get_run(run_id).status == "awaiting_approval")
    # The frames go out once the pass that parked the run has committed: a moment after.
    e2e.until(
        "the approval request streamed",
        lambda: any(f["type"] == "approval_request" for f in e2e.frames(run_id)),
    )
    request = next(f for f in e2e.frames(run_id) if f["type"] == "approval_request")
    assert (request["call_id"], request["tool"], request["args"]) == (c, "refund", REFUND_ARGS)
    assert e2e.client.decide(
        run_id, c, "approve", actor="alice", args_sha256=request["args_sha256"]
    )
    run = e2e.wait(run_id)

    assert run.status == "completed", (run.error, e2e.logs()[-6000:])
    assert run.output == "Refunded order 42."

    # The thread: the reads' results in call order (the first read is the slower one),
    # then the refund's, then the answer.
    messages = e2e.store.thread_messages(run.thread_id)
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    tools = [m for m in messages if m.role == "tool"]
    assert [m.tool_call_id for m in tools] == [a, b, c]
    assert [json.loads(m.content) for m in tools[:2]] == [
        {"order_id": "42", "status": "lost"},
        {"order_id": "7", "status": "delivered"},
    ]
    assert json.loads(tools[2].content)["refunded"] == 5.0
    assert [m.content for m in messages if m.role == "assistant"] == ["".join(t) for t in TEXTS]
    assert [[call.id for call in m.tool_calls] for m in messages if m.role == "assistant"] == [
        [a, b],
        [c],
        [],
    ]
    # A fan-out: both reads were scheduled in one pass, before either result was taken.
    seq = {j["step"]: j["seq"] for j in e2e.store.journal(run_id)}
    assert seq[f"tool:{a}"] < seq[f"tool:{b}"] < seq[f"persist:toolexec:{a}"]

    # What the provider was sent: the tools, then the results in call order.
    assert [r.path for r in e2e.fake.requests] == [
        "/v1/chat/completions" if adapter == "openai" else "/v1/messages"
    ] * 3
    bodies = [r.body for r in e2e.fake.requests]
    assert bodies[0]["stream"] is True
    assert sorted(t.get("name") or t["function"]["name"] for t in bodies[0]["tools"]) == [
        "lookup_order",
        "refund",
    ]
    assert [cid for cid, _ in tool_results_sent(adapter, bodies[1])] == [a, b]
    assert [cid for cid, _ in tool_results_sent(adapter, bodies[2])] == [a, b, c]

    # The usage ledger: the provider's token counts, and a cost that says where it came from.
    model = MODELS[adapter].split(":", 1)[1]
    prices = PriceTable()
    ledger = e2e.store.usage(run_id)
    assert [row["step"] for row in ledger] == ["model:1", "model:2", "model:3"]
    for row, (tokens_in, tokens_out), header in zip(ledger, TOKENS, HEADER_COSTS, strict=True):
        assert (row["input_tokens"], row["output_tokens"]) == (tokens_in, tokens_out)
        assert row["model"].startswith(model)  # the dated snapshot the provider named
        assert row["cost_source"] == cost_source
        expected = (
            float(header)
            if cost_source == "provider"
            else prices.cost(model, tokens_in, tokens_out)
        )
        assert row["cost"] == pytest.approx(expected)

    # The stream: every text piece as its own frame, in order, each model's text before
    # the frames its reply caused.
    frames = e2e.frames(run_id)
    kinds = [f["type"] for f in frames]
    deltas = [f["text"] for f in frames if f["type"] == "text_delta"]
    assert deltas == [piece for texts in TEXTS for piece in texts]
    at = {f["text"]: i for i, f in enumerate(frames) if f["type"] == "text_delta"}
    results = [i for i, k in enumerate(kinds) if k == "tool_result"]
    calls = [i for i, k in enumerate(kinds) if k == "tool_call"]
    assert at[TEXTS[0][1]] < calls[0]
    assert results[1] < at[TEXTS[1][0]] < at[TEXTS[1][1]] < calls[2]
    assert results[2] < at[TEXTS[2][0]] < at[TEXTS[2][1]] < kinds.index("done")
    assert frames[-1]["type"] == "done" and frames[-1]["output"] == run.output
    assert assemble_text(frames) == "".join(deltas)
    # The calls' arguments streamed as the model wrote them, once each (the run was
    # replayed after its approval: a replay streams nothing again).
    assert_arguments_streamed(frames, {a: "model:1", b: "model:1", c: "model:2"})

    assert_no_key(e2e, run_id, adapter)


def assert_arguments_streamed(frames: list[dict[str, Any]], calls: dict[str, str]) -> None:
    """Each call's `tool_call_delta` frames: tagged with the model step that wrote them,
    chained by offset, once each, all before the call's `tool_call` frame, adding up to
    its arguments."""
    for call_id, step in calls.items():
        pieces = [
            (i, f)
            for i, f in enumerate(frames)
            if f["type"] == "tool_call_delta" and f["call_id"] == call_id
        ]
        call_at = [i for i, f in enumerate(frames) if f["type"] == "tool_call"]
        call_at = [i for i in call_at if frames[i]["call_id"] == call_id]
        assert len(pieces) >= 2 and len(call_at) == 1, (call_id, pieces, call_at)
        assert all(i < call_at[0] for i, _ in pieces)
        assert {(f["step"], f["attempt"]) for _, f in pieces} == {(step, 1)}
        assert {f["name"] for _, f in pieces} == {frames[call_at[0]]["tool"]}
        written = ""
        for _, f in pieces:
            assert f["offset"] == len(written)
            written += f["args_delta"]
        assert json.loads(written) == frames[call_at[0]]["args"]


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_tail_shows_the_arguments_being_written_then_the_call(
    e2e: Deployment, adapter: str
) -> None:
    a, _, _ = call_ids(adapter)
    args = {"order_id": "7"}
    e2e.fake.add(
        reply(adapter, ["Looking. "], [(a, "lookup_order", args)], (60, 9)),
        reply(adapter, ["Order 7 ", "is delivered."], [], (70, 5)),
    )
    run_id = e2e.client.enqueue_run(adapter, "Where is order 7?", actor="user-7")
    run = e2e.wait(run_id)
    assert run.status == "completed", (run.error, e2e.logs()[-6000:])
    assert_arguments_streamed(e2e.frames(run_id), {a: "model:1"})

    tail = subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "tail", run_id],
        env=e2e.env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )

    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    # The pieces, printed as they came on a line of their own, then the call itself.
    writing = lines.index(f"… lookup_order {json.dumps(args)}")
    assert lines[writing - 1] == "Looking. "
    assert lines[writing + 1] == '→ lookup_order({"order_id": "7"}) auto_executed'


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_rejected_key_fails_the_run_without_showing_the_key(
    e2e: Deployment, adapter: str
) -> None:
    key = KEYS[adapter]
    # Providers echo (part of) a bad key back; a careless adapter would journal it.
    body: dict[str, Any] = {
        "error": {"message": f"Incorrect API key provided: {key}.", "code": "invalid_api_key"}
    }
    if adapter == "anthropic":
        body = {"type": "error", "error": {"type": "authentication_error", "message": key}}
    e2e.fake.add(Reply(status=401, body=json.dumps(body).encode()))

    run_id = e2e.client.enqueue_run(f"{adapter}-chat", "hello", actor="user-7")
    run = e2e.wait(run_id)

    assert run.status == "failed"
    assert "401" in (run.error or "") and "[redacted]" in (run.error or "")
    assert e2e.store.usage(run_id) == []
    assert_no_key(e2e, run_id, adapter)


# --- a model step whose attempt fails mid-stream -------------------------------------------


def _partial_then_final(adapter: str) -> tuple[Reply, Reply]:
    """A reply cut after its first two text pieces, and the whole reply that follows."""
    doomed = reply(adapter, ["The order ", "is lo"], [], (50, 9))
    cut = 2 if adapter == "openai" else 4  # right after the second text piece
    final = reply(adapter, ["Order 42 ", "has shipped."], [], (50, 7))
    return Reply(chunks=doomed.chunks[:cut], drop=True), final


def assert_retried_behind_the_marker(d: Deployment, run_id: str, adapter: str) -> None:
    run = d.wait(run_id)
    assert run.status == "completed", (run.error, d.logs()[-6000:])
    assert run.output == "Order 42 has shipped."
    assert len(d.fake.requests) == 2
    assert {j["step"]: j for j in d.store.journal(run_id)}["model:1"]["attempts"] == 2

    frames = d.frames(run_id)
    model_frames = [
        (f["type"], f.get("text") or f.get("status"))
        for f in frames
        if f["type"] == "text_delta" or is_attempt_marker(f)
    ]
    assert model_frames == [
        ("text_delta", "The order "),
        ("text_delta", "is lo"),
        ("status", "retrying"),
        ("text_delta", "Order 42 "),
        ("text_delta", "has shipped."),
    ]
    at = next(i for i, f in enumerate(frames) if is_attempt_marker(f))
    assert (frames[at]["step"], frames[at]["attempt"]) == ("model:1", 2)
    assert frames[at + 1] == {
        "type": "text_delta",
        "run_id": run_id,
        "text": "Order 42 ",
        "step": "model:1",
        "attempt": 2,
    }
    # A reader that drops the failed attempt's partial text has exactly the answer.
    assert assemble_text(frames) == run.output
    assert "".join(f.get("text", "") for f in frames) != run.output
    # Only the attempt that finished reached the ledger and the thread.
    ledger = d.store.usage(run_id)
    assert [(r["input_tokens"], r["output_tokens"]) for r in ledger] == [(50, 7)]
    assert d.store.thread_messages(run.thread_id)[-1] == Message(
        role="assistant", content="Order 42 has shipped."
    )
    assert_no_key(d, run_id, adapter)


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_connection_dropped_mid_stream_is_retried_behind_the_attempt_marker(
    e2e: Deployment, adapter: str
) -> None:
    e2e.fake.add(*_partial_then_final(adapter))
    run_id = e2e.client.enqueue_run(f"{adapter}-chat", "Where is 42?", actor="user-7")
    assert_retried_behind_the_marker(e2e, run_id, adapter)
    # The waterfall saw a dropped connection, and retried it.
    requests = [e.data for e in e2e.client.events(run_id) if e.type == "agent/request"]
    assert [(r.get("outcome"), r.get("kind"), r.get("action")) for r in requests] == [
        ("error", "connection", "retry"),
        ("ok", None, None),
    ]


# --- a model step killed mid-stream ------------------------------------------------------


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_model_step_killed_mid_stream_runs_again_behind_the_attempt_marker(
    crash_cluster: Deployment, adapter: str
) -> None:
    cluster = crash_cluster
    # The first attempt streams two pieces, then the provider holds the stream open.
    gate = Gate()
    doomed, final = _partial_then_final(adapter)
    doomed = Reply(chunks=[*doomed.chunks, gate])
    cluster.fake.add(doomed, final)

    first = cluster.worker(concurrency=1, **FAST_RECOVERY)
    run_id = cluster.client.enqueue_run(f"{adapter}-chat", "Where is 42?", actor="user-7")

    def partial_streamed() -> bool:
        deltas = [f for f in cluster.frames(run_id) if f["type"] == "text_delta"]
        return gate.reached.is_set() and len(deltas) == 2

    cluster.until("mid-stream", partial_streamed)
    first.kill()
    gate.opened.set()  # the held stream ends on a closed socket

    cluster.worker(concurrency=1, **FAST_RECOVERY)
    cluster.beat(**FAST_RECOVERY)
    assert_retried_behind_the_marker(cluster, run_id, adapter)


# --- a replay by a fresh worker streams nothing again --------------------------------------


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_worker_killed_after_the_model_step_leaves_its_arguments_streamed_once(
    crash_cluster: Deployment, adapter: str
) -> None:
    cluster = crash_cluster
    _, _, c = call_ids(adapter)
    cluster.fake.add(
        reply(adapter, ["Refunding. "], [(c, "refund", REFUND_ARGS)], (80, 20)),
        reply(adapter, ["Refunded ", "order 42."], [], (90, 8)),
    )
    first = cluster.worker(concurrency=1, **FAST_RECOVERY)
    run_id = cluster.client.enqueue_run(adapter, "Refund order 42", actor="user-7")
    cluster.until(
        "the approval request streamed",
        lambda: any(f["type"] == "approval_request" for f in cluster.frames(run_id)),
    )
    before = cluster.frames(run_id)
    # model:1 is journaled and the run parked: the worker that ran it dies, with
    # whatever it kept of the run's replay.
    first.kill()
    cluster.worker(concurrency=1, **FAST_RECOVERY)
    request = next(f for f in before if f["type"] == "approval_request")
    assert cluster.client.decide(
        run_id, c, "approve", actor="alice", args_sha256=request["args_sha256"]
    )
    run = cluster.wait(run_id)

    assert run.status == "completed", (run.error, cluster.logs()[-6000:])
    assert run.output == "Refunded order 42."
    assert len(cluster.fake.requests) == 2  # model:1 ran once, model:2 once
    journal = {j["step"]: j for j in cluster.store.journal(run_id)}
    assert journal["model:1"]["attempts"] == 1
    frames = cluster.frames(run_id)
    # The new worker replayed model:1 from the journal and streamed none of it again.
    assert frames[: len(before)] == before
    assert not any(is_attempt_marker(f) for f in frames)
    later = frames[len(before) :]
    assert [f for f in later if f.get("step") == "model:1"] == []
    assert [f["type"] for f in later if f["type"] == "tool_call_delta"] == []
    assert_arguments_streamed(frames, {c: "model:1"})
