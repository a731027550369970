"""Prometheus metrics, scraped from real workers (prefork and threads) and the approvals
listener: every event counted once, whatever process carried it and however often a
step was delivered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from agent_jobs.errors import ConfigurationError
from agent_jobs.observability import scrape
from agent_jobs.settings import Settings
from tests.support import encryption as test_encryption
from tests.support.cluster import Cluster
from tests.support.doors import SECRET, approval, signed, wait_for
from tests.support.redis_server import free_port
from tests.support.workers import ROOT, Process, worker

# A short hard time limit (2 + 0.5 s): the stubborn tool overruns it on every attempt and
# becomes a dead letter, on either pool, without killing a whole worker.
LIMITS = {"AGENT_JOBS_STEP_TIME_LIMIT": "2", "AGENT_JOBS_EAGER_BUDGET": "0.5"}
TOKEN = "scrape-token-for-tests"
REMOTE = ("model:", "tool:", "history:summarize")
NOT_RUN = ("approval:", "answers:", "agent:", "patch:")  # waits and markers: no work done


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_port(port: int, token: str | None = TOKEN) -> Samples:
    """Every sample the port serves: (name, labels) -> value."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def metrics_env(port: int, **extra: str) -> dict[str, str]:
    return {"AGENT_JOBS_METRICS_PORT": str(port), "AGENT_JOBS_METRICS_TOKEN": TOKEN, **extra}


def start_listener(cluster: Cluster, channel: str, port: int) -> Process:
    env = cluster.env(
        AGENT_JOBS_APPROVALS_CHANNEL=channel,
        AGENT_JOBS_APPROVAL_SECRET=SECRET,
        **metrics_env(port),
    )
    args = [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen"]
    proc = Process(args, env, "listener").start(ready="listening on channel")
    cluster.procs.append(proc)
    return proc


def local_steps(journal: list[dict[str, Any]]) -> int:
    """The run's steps a pass carried out itself."""
    return sum(
        1
        for row in journal
        if row["state"] == "done" and not row["step"].startswith(REMOTE + NOT_RUN)
    )


def test_workers_and_the_listener_count_each_event_once(cluster: Cluster, worker_pool: str) -> None:
    worker_port, listener_port = free_port(), free_port()
    proc = cluster.worker(concurrency=2, **metrics_env(worker_port, **LIMITS))
    wait_for(lambda: f"metrics on http://127.0.0.1:{worker_port}/metrics" in proc.log(), "the port")
    channel = f"agent_jobs:approvals:{os.getpid()}"
    start_listener(cluster, channel, listener_port)

    def scrape_worker() -> Samples:
        return scrape_port(worker_port)

    def scrape_listener() -> Samples:
        return scrape_port(listener_port)

    # A run parked on an approval: one call pending, from every target alike.
    asked = time.monotonic()  # no later than the approval was asked for
    gated = cluster.client.enqueue_run("gated", "go", actor="user-7")
    wait_for(lambda: cluster.store.get_run(gated).status == "awaiting_approval", "the approval")
    [call] = cluster.store.pending_calls(gated)
    assert value(scrape_worker(), "agent_jobs_approvals_pending") == 1
    assert value(scrape_listener(), "agent_jobs_approvals_pending") == 1

    # The decision through the listener's stream door: recorded and timed there.
    client = redis.Redis.from_url(cluster.broker)
    try:
        time.sleep(0.2)  # the call waits a moment for its decision
        client.xadd(channel, {"message": json.dumps(signed(approval(gated, call["call_id"])))})
    finally:
        client.close()
    assert cluster.wait(gated).status == "completed"
    decided = time.monotonic() - asked  # no sooner than the decision was recorded

    # A step that overruns its time limit on every attempt: a dead letter, the run failed.
    stubborn = cluster.client.enqueue_run("stubborn", "go", actor="user-7")
    run = cluster.wait(stubborn)
    assert run.status == "failed" and "gave up after 3 attempts" in (run.error or "")

    listener = scrape_listener()
    assert value(listener, "agent_jobs_decision_seconds_count") == 1
    # The wait it timed: at least the test's moment, at most from the ask to the end.
    assert 0.2 <= value(listener, "agent_jobs_decision_seconds_sum") <= decided
    assert value(listener, "agent_jobs_approval_messages_total", outcome="recorded") == 1
    assert value(listener, "agent_jobs_approvals_pending") == 0

    journals = {r: cluster.store.journal(r) for r in (gated, stubborn)}
    usage = [u for r in (gated, stubborn) for u in cluster.store.usage(r)]

    def settled() -> Samples | None:
        # The stubborn run's last pass reports once it has committed: a moment after.
        got = scrape_worker()
        return (
            got
            if value(got, "agent_jobs_runs_finished_total", agent="stubborn", status="failed")
            else None
        )

    got = wait_for(settled, f"the worker's counts\n{cluster.logs()}")
    assert value(got, "agent_jobs_approvals_pending") == 0
    for agent in ("gated", "stubborn"):
        assert value(got, "agent_jobs_runs_started_total", agent=agent) == 1
    assert value(got, "agent_jobs_runs_finished_total", agent="gated", status="completed") == 1
    assert value(got, "agent_jobs_runs_finished_total", agent="stubborn", status="failed") == 1
    # Steps by kind: gated ran model:1, model:2, tool:call_1 and tool:call_2 (after its
    # approval); stubborn ran model:1, and its tool never finished an attempt.
    assert value(got, "agent_jobs_step_seconds_count", kind="model") == 3
    assert value(got, "agent_jobs_step_seconds_count", kind="tool") == 2
    locals_ = sum(local_steps(j) for j in journals.values())
    assert locals_ > 10
    assert value(got, "agent_jobs_step_seconds_count", kind="local") == locals_
    assert value(got, "agent_jobs_step_seconds_sum", kind="model") > 0
    # The stubborn tool: delivered three times, given up on the fourth. Counted once.
    assert value(got, "agent_jobs_dead_letters_total") == 1
    assert value(got, "agent_jobs_step_retries_total", kind="tool") == 2
    assert value(got, "agent_jobs_step_retries_total", kind="model") == 0
    # Tokens by model and direction, as the usage ledger has them.
    spent: Counter[tuple[str, str]] = Counter()
    for row in usage:
        spent[(row["model"], "input")] += row["input_tokens"]
        spent[(row["model"], "output")] += row["output_tokens"]
    assert spent and all(n > 0 for n in spent.values())
    for (model, direction), tokens in spent.items():
        assert value(got, "agent_jobs_tokens_total", model=model, direction=direction) == tokens
    # A scrape without the token is refused.
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape_port(worker_port, token=None)
    assert refused.value.code == 401
    refused.value.close()


def test_a_worker_with_the_port_set_and_no_extra_stops_with_one_line(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    shim = tmp_path / "shim"
    (shim / "prometheus_client").mkdir(parents=True)
    (shim / "prometheus_client" / "__init__.py").write_text(
        "raise ImportError('No module named prometheus_client')\n"
    )
    env = cluster.env(**metrics_env(free_port()), PYTHONPATH=f"{shim}:{ROOT}")
    proc = worker(env, name="no-extra").start()
    assert proc.proc is not None
    assert proc.proc.wait(timeout=30) != 0
    errors = [line for line in proc.log().splitlines() if "agent-jobs[metrics]" in line]
    assert errors == [
        "error: AGENT_JOBS_METRICS_PORT is set but prometheus-client is not installed: "
        "pip install 'agent-jobs[metrics]'"
    ], proc.log()
    assert "Traceback" not in proc.log()
    # The listener says the same, in the same words, and exits 2.
    listen = subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen"],
        env={**env, "AGENT_JOBS_APPROVAL_SECRET": SECRET},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listen.returncode == 2, listen.stderr
    assert listen.stderr.strip().splitlines() == [errors[0]], listen.stderr


# --- the port and a prefork worker's files, in this process ---------------------------------


def test_the_port_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    from agent_jobs.observability import metrics

    settings = Settings(metrics_port=free_port(), metrics_addr="0.0.0.0")
    with pytest.raises(ConfigurationError, match="AGENT_JOBS_METRICS_TOKEN"):
        metrics.bind(settings)
    assert scrape.loopback("127.0.0.1") and scrape.loopback("::1")
    assert scrape.loopback("localhost") and not scrape.loopback("0.0.0.0")


def test_the_port_answers_metrics_only_with_the_token() -> None:
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("probe", "a probe", registry=registry).inc(3)
    port = free_port()
    server = scrape.make_server("127.0.0.1", port, scrape.wsgi_app(registry, TOKEN))
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert value(scrape_port(port), "probe_total") == 3
        for token in (None, "wrong", TOKEN + "x"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                scrape_port(port, token=token)
            assert refused.value.code == 401
            refused.value.close()
        with pytest.raises(urllib.error.HTTPError) as missing:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/other")
            request.add_header("Authorization", f"Bearer {TOKEN}")
            urllib.request.urlopen(request, timeout=5)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_dead_processs_counts_are_folded_into_the_archive_and_kept(tmp_path: Path) -> None:
    from prometheus_client import mmap_dict

    key = mmap_dict.mmap_key(
        "agent_jobs_dead_letters", "agent_jobs_dead_letters_total", [], [], "x"
    )
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid, count in ((gone.pid, 2.0), (os.getpid(), 5.0)):
        files = mmap_dict.MmapedDict(str(tmp_path / f"counter_{pid}.db"))
        files.write_value(key, count, 0.0)
        files.close()

    def total() -> float:
        collector = scrape.ProcessFiles(str(tmp_path))
        [family] = list(collector.collect())
        return sum(s.value for s in family.samples if s.name.endswith("_total"))

    assert total() == 7  # the dead process's 2 folded in, the live one's 5 as they are
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["counter_archive.db", f"counter_{os.getpid()}.db"])
    assert total() == 7  # and nothing is counted twice on the next scrape


def test_stream_lag_is_read_from_the_entry_id(tmp_path: Path) -> None:
    """In a process of its own: metrics on, a frame written 250 ms before it is handed on."""
    code = """
import sys, time
from agent_jobs.observability import metrics
from agent_jobs.settings import Settings
assert metrics.setup(Settings(metrics_port=1, database_url=sys.argv[1]))
now = time.time()
metrics.observe_stream_lag(f"{int(now * 1000) - 250}-3", now=now)
metrics.observe_stream_lag("not-an-id", now=now)
body, kind = metrics.exposition()
assert kind.startswith("text/plain"), kind
lines = dict(l.rsplit(" ", 1) for l in body.decode().splitlines() if l and l[0] != "#")
assert lines["agent_jobs_stream_lag_seconds_count"] == "1.0", lines
assert 0.24 < float(lines["agent_jobs_stream_lag_seconds_sum"]) < 0.26, lines
"""
    env = test_encryption.bare_environ()
    done = subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'none.db'}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_off_neither_extra_is_imported(tmp_path: Path) -> None:
    """With neither setting, a run goes through every hook, and neither prometheus_client
    nor OpenTelemetry's tracing SDK is imported (the worker's modules loaded too; redis-py
    imports OpenTelemetry's metrics of its own accord when it is installed)."""
    code = """
import sys
import tasks, tasks.runtime  # the worker's modules and their signal handlers
from agent_jobs import InlineRunner, Store
from tests.support.apps import app
runner = InlineRunner(app, Store.from_url(sys.argv[1]), poll_interval=0.05)
run = runner.run("w1", "go", actor="user-7", timeout=30)
assert run.status == "completed", run
ours = (
    "prometheus_client", "opentelemetry.sdk.trace", "opentelemetry.trace.propagation.tracecontext"
)
loaded = sorted(m for m in sys.modules if m.startswith(ours))
assert not loaded, loaded
"""
    env = test_encryption.bare_environ()
    url = f"sqlite:///{tmp_path / 'off.db'}"
    done = subprocess.run(
        [sys.executable, "-c", code, url],
        env={**env, "AGENT_JOBS_DATABASE_URL": url, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_scrape_token_is_masked_in_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_jobs.logs import known_secrets
    from agent_jobs.settings import get_settings

    monkeypatch.setenv("AGENT_JOBS_METRICS_TOKEN", TOKEN)
    get_settings.cache_clear()
    try:
        assert TOKEN in known_secrets()
    finally:
        get_settings.cache_clear()
