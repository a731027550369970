"""Provider rate limits shared by every worker, end to end: real worker processes (each
test on its pool), the real OpenAI-compatible adapter, and a local provider server that
notes when each request arrives and what it reported for it, and answers 429 with a
Retry-After on command.

What the server sees: the fleet's requests (and tokens) never exceed the key's buckets
(a second's worth at once, then a sixtieth of the per-minute limit a second), nothing
arrives while the key is paused, every run completes. What the workers show: a step that
waits is a countdown in the broker (its journal row held back, `not_before`), never a
sleeping worker, and waiting counts neither as an attempt nor as a retry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.models.registry import ProviderSettings
from agent_jobs.ratelimits import buckets
from agent_jobs.settings import Settings
from tests.models.e2e_app import build_app
from tests.models.fakeprovider import FakeProvider, Recorded, Reply, json_error, openai_reply
from tests.support.cluster import Cluster
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually
from tests.support.workers import ROOT, Process

KEY = "sk-rate-limits-3b9d1f7a5c2e4d6b8a0c"
# Seconds: how much sooner than its place a request may seem to reach the server. The
# server sees a request some time after its grant, and not always the same time: on a
# loaded machine a process's first request (which builds its HTTP client) came 0.31 s
# later than the ones after it, so a window that starts on it looks that much shorter.
# A limiter that the workers do not share, or none, overruns this by several a second.
JITTER = 0.6


class Provider:
    """The provider's side: when each request arrived and the tokens reported for it
    (the prompt, about four characters a token, and the answer's). `refuse_next` makes
    the next request a 429 with that Retry-After.

    The `openai` agent is asked for one read, then answers; `openai-chat` answers."""

    def __init__(self, completion_tokens: int = 20) -> None:
        self.completion_tokens = completion_tokens
        self.lock = threading.Lock()
        self.arrivals: list[float] = []  # time.monotonic(), every request
        self.answered: list[tuple[float, int]] = []  # (arrival, tokens reported)
        self.refusals: list[tuple[float, float]] = []  # (arrival, Retry-After)
        self.refused_at: list[float] = []  # time.time() of each refusal: the logs' clock
        self._refuse: deque[float] = deque()

    def refuse_next(self, retry_after: float) -> None:
        with self.lock:
            self._refuse.append(retry_after)

    def __call__(self, request: Recorded) -> Reply:
        now = time.monotonic()
        body: dict[str, Any] = request.body
        prompt = len(json.dumps(body["messages"])) // 4
        with self.lock:
            self.arrivals.append(now)
            if self._refuse:
                seconds = self._refuse.popleft()
                self.refusals.append((now, seconds))
                self.refused_at.append(time.time())
                error = {"message": "Rate limit reached", "code": "rate_limit_exceeded"}
                return json_error(429, {"error": error}, {"Retry-After": f"{seconds:g}"})
            self.answered.append((now, prompt + self.completion_tokens))
        tokens = {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens}
        if body.get("tools") and body["messages"][-1]["role"] != "tool":
            return openai_reply(
                ["Let me look. "], [("call_7", "lookup_order", {"order_id": "7"})], **tokens
            )
        return openai_reply(["Order 7 ", "is delivered."], **tokens)

    def count(self) -> int:
        with self.lock:
            return len(self.arrivals)


class Fleet:
    """The cluster's workers on the `e2e_app` agents, whose OpenAI base URL is the
    provider server's; a client that enqueues (and never calls a model)."""

    def __init__(self, cluster: Cluster, server: FakeProvider, provider: Provider) -> None:
        self.cluster = cluster
        self.server = server
        self.provider = provider
        unused = SecretStr("unused")
        app = build_app(ProviderSettings(openai_api_key=unused, anthropic_api_key=unused))
        settings = Settings(
            broker_url=cluster.broker, database_url=cluster.pg_url, queue=SESSION_QUEUE
        )
        self.client = Client(cluster.store, app, settings, CeleryDispatcher(cluster.celery))
        self.workers: list[Process] = []

    def worker(self, concurrency: int, limits: dict[str, Any] | None, **extra: str) -> Process:
        env = {
            "AGENT_JOBS_APP": "e2e_app:app",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "models")]),
            "AGENT_JOBS_OPENAI_BASE_URL": f"{self.server.url}/v1",
            "AGENT_JOBS_OPENAI_API_KEY": KEY,
            "AGENT_JOBS_ANTHROPIC_API_KEY": "unused",  # the app's other agent
            "AGENT_JOBS_MODEL_RETRY_BASE_DELAY": "0.05",
            # The sweep is not what these tests watch (tests/test_rate_limits_recovery.py).
            "AGENT_JOBS_SWEEP_STALE_AFTER": "60",
        }
        if limits is not None:
            env["AGENT_JOBS_RATE_LIMITS"] = json.dumps(limits)
        proc = self.cluster.worker(concurrency=concurrency, **env, **extra)
        self.workers.append(proc)
        return proc

    def start(self, agent: str, count: int) -> list[str]:
        return [
            self.client.enqueue_run(agent, f"Where is order 7? ({n})", actor="user-7")
            for n in range(count)
        ]

    def finish(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            run = self.cluster.wait(run_id)
            assert run.status == "completed", (run.error, self.logs()[-6000:])

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.workers)

    def model_rows(self, run_ids: list[str]) -> list[dict[str, Any]]:
        return [
            row
            for run_id in run_ids
            for row in self.cluster.store.journal(run_id)
            if row["step"].startswith("model:")
        ]

    def task_spans(self) -> list[tuple[float, float]]:
        """(start, end) in time.time() of each task a worker finished: Celery's line, the
        moment it was written and how long the task took."""
        found = re.findall(
            r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [^\]]*\] Task \S+ "
            r"succeeded in ([0-9.]+)s",
            self.logs(),
        )
        spans = []
        for stamp, took in found:
            end = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            spans.append((end - float(took), end))
        return spans

    def waits(self) -> list[float]:
        """Every wait for capacity the limiter gave a step (its deferral's log line)."""
        return [float(s) for s in re.findall(r"retry: waiting ([0-9.]+)s", self.logs())]


@pytest.fixture
def fleet(cluster: Cluster) -> Iterator[Fleet]:
    provider = Provider()
    with FakeProvider(responder=provider) as server:
        yield Fleet(cluster, server, provider)


def assert_within(
    arrivals: list[float], per_minute: float, costs: list[float] | None = None
) -> None:
    """However the arrivals are windowed, no more went than the bucket lets: a second's
    worth at once, then a sixtieth of the limit a second (a request may reach the server
    up to `JITTER` sooner than its place; one may go on a full bucket and owe the rest)."""
    rate, costs = per_minute / 60, costs or [1.0] * len(arrivals)
    depth = max(1.0, rate)
    ordered = sorted(zip(arrivals, costs, strict=True))
    for i, (start, _) in enumerate(ordered):
        spent = 0.0
        for end, cost in ordered[i:]:
            spent += cost
            allowed = depth + rate * (end - start + JITTER) + max(0.0, max(costs) - depth)
            assert spent <= allowed, (
                f"{spent:g} in {end - start:.3f}s from arrival {i}: over {allowed:g} "
                f"(limit {per_minute:g} a minute)"
            )


def test_the_fleets_requests_stay_under_the_limit_and_a_429_pauses_every_worker(
    fleet: Fleet,
) -> None:
    per_minute = 240  # four a second, four at once
    limits = {
        "anthropic:*": {"requests_per_minute": 1},
        "openai:*": {"requests_per_minute": per_minute},
    }
    for _ in range(2):
        fleet.worker(2, limits)
    run_ids = fleet.start("openai", 16)  # a read between two model calls each: 32 calls
    provider = fleet.provider
    # After ten requests the provider says: too many, come back in 2 s.
    eventually(
        lambda: provider.count() >= 10,
        what="ten requests at the provider",
        every=0.01,
        context=lambda: fleet.logs()[-6000:],
    )
    provider.refuse_next(2.0)
    fleet.finish(run_ids)

    assert len(provider.answered) == 32 and len(provider.refusals) == 1
    assert_within(provider.arrivals, per_minute)
    # While the key was paused nothing arrived, from any worker (a request already on
    # its way when the 429 went out may land just after it).
    refused, retry_after = provider.refusals[0]
    during = [t - refused for t in provider.arrivals if refused + 0.1 <= t < refused + retry_after]
    assert during == [], during
    # Waiting was a countdown in the broker: no task was running all through the pause
    # (a worker that slept for capacity would have been, from the refusal to the end of
    # the pause: spans by the worker's log, the refusal by the same clock), steps were
    # held back in the journal...
    [refused_at] = provider.refused_at
    spans = fleet.task_spans()
    assert len(spans) >= 16, fleet.logs()[-6000:]  # a task a run, at least
    slept = [
        (start - refused_at, end - refused_at)
        for start, end in spans
        if start <= refused_at + 0.1 and end >= refused_at + retry_after
    ]
    assert slept == [], slept
    rows = fleet.model_rows(run_ids)
    held = [row for row in rows if row["not_before"] is not None]
    assert len(held) >= 16, [(r["run_id"], r["step"], r["not_before"]) for r in rows]
    # ...and a step whose place the pause voided was delivered again as a task retried.
    assert re.search(
        r"agent_jobs\.model_turn\[[0-9a-f-]+\] retry: waiting [0-9.]+s: openai:\* is", fleet.logs()
    )
    # Waiting is no attempt: every model step made one, but the refused one two.
    assert sorted(row["attempts"] for row in rows) == [1] * 31 + [2]


@pytest.mark.pools_named
def test_the_fleets_tokens_stay_under_the_limit_estimated_then_corrected(fleet: Fleet) -> None:
    per_minute = 12_000  # two hundred tokens a second
    provider = fleet.provider
    provider.completion_tokens = 50
    for _ in range(2):
        # A call may use 200 tokens of output: taken up front with its prompt, and what
        # it did not use given back when the provider reports its usage.
        fleet.worker(
            2,
            {"openai:*": {"tokens_per_minute": per_minute}},
            pool="threads",
            AGENT_JOBS_MODEL_MAX_TOKENS="200",
        )
    # A run every half second: each call's estimate (about 240 tokens: 1.2 s of the
    # bucket) is more than comes in between, what each really uses (60 to 100) less.
    # (A slow machine only spaces them more: more comes in between.)
    started = time.monotonic()
    run_ids = []
    for n in range(12):
        run_ids.append(fleet.client.enqueue_run("openai-chat", f"Order 7? ({n})", actor="u"))
        time.sleep(max(0.0, started + 0.5 * (n + 1) - time.monotonic()))
    fleet.finish(run_ids)

    arrivals = [t for t, _ in provider.answered]
    tokens = [float(n) for _, n in provider.answered]
    assert len(arrivals) == 12 and all(60 < n < 100 for n in tokens), tokens
    assert_within(arrivals, per_minute, tokens)
    # The corrections gave back what calls did not use, so no call waited long, by the
    # limiter's own clock: never longer than one estimate takes to come in (a bucket
    # owing one call's excess, refilled). Paced by the estimates alone each call would
    # have waited some 0.7 s longer than the one before: the twelfth about 7 s.
    estimate = max(tokens) - provider.completion_tokens + 200  # the prompt, max_tokens
    assert max(fleet.waits(), default=0.0) <= estimate / (per_minute / 60), fleet.waits()


@pytest.mark.pools_named
def test_waiting_for_capacity_is_no_retry_of_the_step(fleet: Fleet) -> None:
    """A step that waits longer than a step's time limit is deferred again and again (a
    delayed message must not outlive the broker's visibility timeout): none of that is a
    retry. With one retry allowed, a 429 after several deferrals is still retried."""
    per_minute = 20  # one every three seconds
    fleet.worker(
        2,
        {"openai:*": {"requests_per_minute": per_minute}},
        pool="threads",
        AGENT_JOBS_STEP_TIME_LIMIT="1",  # deferred a second at a time
        AGENT_JOBS_MODEL_MAX_RETRIES="1",
    )
    provider = fleet.provider
    run_ids = fleet.start("openai-chat", 2)
    eventually(
        lambda: provider.count() >= 1,
        what="the first request at the provider",
        every=0.01,
        context=lambda: fleet.logs()[-6000:],
    )
    provider.refuse_next(0.5)  # the second run's call, three seconds on
    fleet.finish(run_ids)

    assert len(provider.answered) == 2 and len(provider.refusals) == 1
    assert_within(provider.arrivals, per_minute)
    [late] = [r for r in fleet.model_rows(run_ids) if r["attempts"] == 2]
    assert late["not_before"] is not None
    requests = [e.data for e in fleet.client.events(late["run_id"]) if e.type == "agent/request"]
    assert [(r.get("kind"), r.get("action"), r["outcome"]) for r in requests] == [
        ("rate_limit", "retry", "error"),
        (None, None, "ok"),
    ]
    deferred = re.findall(r"model_turn\[[0-9a-f-]+\] retry: waiting [0-9.]+s", fleet.logs())
    assert len(deferred) >= 3, fleet.logs()[-6000:]


@pytest.mark.pools_named
def test_with_no_limits_set_the_workers_spend_no_redis_command_on_them(fleet: Fleet) -> None:
    fleet.worker(2, None, pool="threads")
    fleet.finish(fleet.start("openai", 2))
    client = redis.Redis.from_url(fleet.cluster.broker)
    try:
        scripts = [buckets._TAKE, buckets._PAUSE, buckets._CORRECT]
        shas = [hashlib.sha1(script.encode()).hexdigest() for script in scripts]
        assert client.script_exists(*shas) == [False, False, False]  # never run here
        assert client.keys("agent_jobs:ratelimit:*") == []
    finally:
        client.close()
