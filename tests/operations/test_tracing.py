"""OpenTelemetry spans across real worker processes: a run started by a Celery client inside
a span of its own has a span for every step that ran, in the caller's trace, whichever
worker carried the step, and none for a step a replay read back."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.leases import Leases
from tests.support import apps
from tests.support.apps.otel import read_spans
from tests.support.cluster import Cluster
from tests.support.doors import cli, wait_for
from tests.support.services import SESSION_QUEUE
from tests.support.workers import ROOT, worker

# A service of its own: Celery, the OpenTelemetry SDK and its Celery instrumentation, never
# agent_jobs. It sends `start_run` inside a span `checkout`; the instrumentation's publish
# span, whose context the message carries, is the caller's span the run's steps hang on.
_CALLER = """
import json, sys
import celery
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

broker, queue, agent = sys.argv[1:4]
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
CeleryInstrumentor().instrument()
app = celery.Celery(broker=broker)
with trace.get_tracer("caller").start_as_current_span("checkout"):
    sent = app.send_task(
        "agent_jobs.start_run", kwargs={"agent": agent, "input": "go", "actor": "user-7"},
        queue=queue,
    )
[publish] = [s for s in exporter.get_finished_spans() if s.name != "checkout"]
assert not [m for m in sys.modules if m.split(".")[0] in ("agent_jobs", "tasks")]
print(json.dumps({
    "run_id": sent.id,
    "trace_id": format(publish.context.trace_id, "032x"),
    "span_id": format(publish.context.span_id, "016x"),
}))
"""

WAITS = ("approval:", "answers:", "agent:", "patch:")  # not work a step does


def send_from_a_traced_caller(cluster: Cluster, agent: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _CALLER, cluster.broker, SESSION_QUEUE, agent],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    sent: dict[str, str] = json.loads(done.stdout)
    return sent


def traced(spans: Path, **extra: str) -> dict[str, str]:
    """What a process needs to write its spans to `spans` (its app's own exporter)."""
    return {
        "AGENT_JOBS_APP": "tests.support.apps.otel:app",
        "TEST_SPANS_DIR": str(spans),
        "OTEL_TRACES_EXPORTER": "none",
        **extra,
    }


def test_every_step_is_a_span_in_the_callers_trace(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    """Worker A takes the run's first steps and is killed in the middle of a slow read;
    worker B, started then, runs that read again (its second attempt), replays what A did,
    and, after a person approves the action from the command line, runs the rest."""
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    extra = traced(spans_dir, AGENT_JOBS_OTEL="1")
    first = cluster.worker(concurrency=2, **extra)
    # Its processes beat before one dies: a worker that starts later knows them to take.
    leases = Leases.from_url(cluster.broker)
    try:
        beating = 2 if worker_pool == "prefork" else 1
        wait_for(lambda: len(leases.processes()) >= beating, "the worker's beats")
    finally:
        leases.client.close()
    sent = send_from_a_traced_caller(cluster, "traced")
    run_id = sent["run_id"]
    wait_for(
        lambda: any(what == "slow:start" for what, _ in apps.executed(run_id)),
        f"the slow read\n{cluster.logs()}",
    )
    first.kill()
    cluster.procs.remove(first)
    before = {span["pid"] for span in read_spans(spans_dir)}

    cluster.worker(concurrency=2, **extra)
    wait_for(
        lambda: cluster.store.get_run(run_id).status == "awaiting_approval",
        f"the approval\n{cluster.logs()}\n{cluster.store.journal(run_id)}",
    )
    [call] = cluster.store.pending_calls(run_id)
    approve = ("approve", run_id, call["call_id"], "--actor", "alice")
    approved = cli(*approve, env=cluster.env(**extra))
    assert approved.returncode == 0, approved.stderr
    run = cluster.wait(run_id)
    assert run.status == "completed", run.error

    journal = {row["step"]: row for row in cluster.store.journal(run_id)}
    ran = {step for step in journal if not step.startswith(WAITS)}
    decision = f"approval:{call['call_id']}"
    assert {"model:1", "tool:call_1", "tool:call_2", "tool:call_3", "model:3"} <= ran
    assert journal["tool:call_2"]["attempts"] == 2  # the slow read, run again by B

    def all_spans() -> list[dict[str, Any]] | None:
        got = read_spans(spans_dir)
        mine = [s for s in got if s["attributes"].get("agent_jobs.run_id") == run_id]
        return mine if ran | {decision} <= {s["name"] for s in mine} else None

    spans = wait_for(all_spans, f"every step's span\n{cluster.logs()}")
    # One span per step that ran (a replayed step made none, nor did the killed attempt),
    # and one for the decision.
    assert Counter(span["name"] for span in spans) == Counter([*ran, decision])
    by_name = {span["name"]: span for span in spans}
    for span in spans:
        # In the caller's trace, on the caller's span.
        assert span["trace_id"] == sent["trace_id"], span
        assert span["parent_id"] == sent["span_id"], span
        attributes = span["attributes"]
        assert attributes["agent_jobs.step"] == span["name"]
        assert attributes["agent_jobs.run_id"] == run_id
        expected = journal[span["name"]]["attempts"] if span["name"] != decision else 1
        assert attributes["agent_jobs.attempt"] == (expected or 1), span
        assert span["end"] >= span["start"]
        assert attributes["agent_jobs.outcome"] == (
            "approve" if span["name"] == decision else "done"
        )
    assert by_name["tool:call_2"]["attributes"]["agent_jobs.attempt"] == 2
    # A's processes took the first steps, B's the slow read again and the rest; the
    # decision was the command line's.
    assert by_name["model:1"]["pid"] in before
    for step in ("tool:call_2", "tool:call_3", "model:3"):
        assert by_name[step]["pid"] not in before, step
    assert by_name[decision]["pid"] not in {s["pid"] for s in spans if s["name"] != decision}
    # The run keeps the caller's context in its row, not in what `status --json` shows.
    assert run.trace_context is not None
    assert run.trace_context["traceparent"].split("-")[1:3] == [sent["trace_id"], sent["span_id"]]
    assert "traceparent" not in json.dumps(run.model_dump(mode="json"))


@pytest.mark.pools_named
def test_with_tracing_off_there_are_no_spans_and_no_context(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    cluster.worker(concurrency=2, **traced(spans_dir))
    sent = send_from_a_traced_caller(cluster, "w1")
    run = cluster.wait(sent["run_id"])
    assert run.status == "completed"
    assert run.trace_context is None
    assert read_spans(spans_dir) == []


_SERVICE = """
import json
from opentelemetry import trace
from agent_jobs.client import Client

client = Client.from_settings()
with trace.get_tracer("service").start_as_current_span("request") as span:
    inside = client.enqueue_run("w1", "go", actor="user-7")
outside = client.enqueue_run("w1", "go", actor="user-7")
context = span.get_span_context()
print(json.dumps({
    "inside": inside,
    "outside": outside,
    "trace_id": format(context.trace_id, "032x"),
    "span_id": format(context.span_id, "016x"),
}))
"""


@pytest.mark.pools_named  # no worker: what the client writes
def test_a_run_enqueued_through_the_client_keeps_the_current_context(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    """Inside a span, the run keeps that span's context; outside any, a root span `run`
    of its own."""
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    env = cluster.env(**traced(spans_dir, AGENT_JOBS_OTEL="1"))
    done = subprocess.run(
        [sys.executable, "-c", _SERVICE],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    sent = json.loads(done.stdout)
    inside = cluster.store.get_run(sent["inside"]).trace_context
    assert inside is not None
    assert inside["traceparent"].split("-")[1:3] == [sent["trace_id"], sent["span_id"]]
    outside = cluster.store.get_run(sent["outside"]).trace_context
    assert outside is not None
    _, trace_id, span_id, _ = outside["traceparent"].split("-")
    assert trace_id != sent["trace_id"]
    [root] = [s for s in read_spans(spans_dir) if s["name"] == "run"]
    assert (root["trace_id"], root["span_id"], root["parent_id"]) == (trace_id, span_id, None)
    assert root["attributes"] == {"agent_jobs.run_id": sent["outside"], "agent_jobs.agent": "w1"}


@pytest.mark.pools_named
def test_a_run_created_untraced_gets_a_root_in_the_worker(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    """This process traces nothing: the run it enqueues has no context, and the worker
    that starts it gives it a root span `run`, which its steps hang on."""
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    cluster.worker(concurrency=2, **traced(spans_dir, AGENT_JOBS_OTEL="1"))
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.trace_context is not None
    _, trace_id, root_id, _ = run.trace_context["traceparent"].split("-")

    def spans() -> list[dict[str, Any]] | None:
        got = read_spans(spans_dir)
        return got if any(s["name"] == "model:3" for s in got) else None

    got = wait_for(spans, "the run's spans")
    [root] = [s for s in got if s["name"] == "run"]
    assert (root["trace_id"], root["span_id"], root["parent_id"]) == (trace_id, root_id, None)
    steps = [s for s in got if s["name"] != "run"]
    assert {s["name"] for s in steps} >= {"model:1", "tool:call_1", "tool:call_4", "model:3"}
    assert all((s["trace_id"], s["parent_id"]) == (trace_id, root_id) for s in steps)


@pytest.mark.pools_named
def test_a_worker_with_tracing_on_and_no_extra_stops_with_one_line(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    shim = tmp_path / "shim"
    (shim / "opentelemetry").mkdir(parents=True)
    (shim / "opentelemetry" / "__init__.py").write_text(
        "raise ImportError('No module named opentelemetry')\n"
    )
    env = cluster.env(AGENT_JOBS_OTEL="1", PYTHONPATH=f"{shim}:{ROOT}")
    proc = worker(env, name="no-otel").start()
    assert proc.proc is not None
    assert proc.proc.wait(timeout=30) != 0
    errors = [line for line in proc.log().splitlines() if "agent-jobs[otel]" in line]
    assert errors == [
        "error: AGENT_JOBS_OTEL is on but OpenTelemetry is not installed: "
        "pip install 'agent-jobs[otel]'"
    ], proc.log()
    assert "Traceback" not in proc.log()


_BY_HAND = """
import json, sys
import celery

broker, queue = sys.argv[1:3]
app = celery.Celery(broker=broker)
ids = []
for traceparent in sys.argv[3:]:
    sent = app.send_task(
        "agent_jobs.start_run", kwargs={"agent": "w1", "input": "go", "actor": "user-7"},
        queue=queue, headers={"traceparent": traceparent},
    )
    ids.append(sent.id)
print(json.dumps(ids))
"""


@pytest.mark.pools_named
def test_a_traceparent_put_in_the_headers_by_hand_is_kept_and_a_bad_one_ignored(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    cluster.worker(concurrency=2, **traced(spans_dir, AGENT_JOBS_OTEL="1"))
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    bad = "00-0af7651916cd43dd8448eb211c80319c-00000000000000000000-01\n<script>"
    done = subprocess.run(
        [sys.executable, "-c", _BY_HAND, cluster.broker, SESSION_QUEUE, good, bad],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    kept, ignored = json.loads(done.stdout)
    assert cluster.wait(kept).trace_context == {"traceparent": good}
    own = cluster.wait(ignored).trace_context
    assert own is not None and own["traceparent"] != bad
    assert own["traceparent"].split("-")[1] != "0af7651916cd43dd8448eb211c80319c"
