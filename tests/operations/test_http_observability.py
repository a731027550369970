"""`agent-jobs serve` with metrics and traces on: `GET /metrics` behind a token, the live
stream's lag counted, and a caller's trace context kept with the run it starts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.redis_server import free_port
from tests.support.serve import Stack, assert_error, events, open_stack

OBSERVED_BROKER_DB = 11
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("observed")
    env = {
        "AGENT_JOBS_METRICS_PORT": str(free_port()),
        "AGENT_JOBS_OTEL": "1",
        "OTEL_TRACES_EXPORTER": "none",
    }
    with open_stack(pg_url, redis_url, OBSERVED_BROKER_DB, tmp, "serve-observed", **env) as made:
        yield made


def samples(text: str, name: str) -> list[float]:
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def lags_timed(stack: Stack) -> float:
    """How many frames the server has timed the lag of, in all (the module's other
    tests stream too, in any order)."""
    reply = stack.call("bob", "GET", "/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return sum(samples(reply.text, "agent_jobs_stream_lag_seconds_count"))


def test_the_metrics_are_served_behind_a_token_with_the_streams_lag(stack: Stack) -> None:
    assert_error(stack.call(None, "GET", "/metrics"), 401, "AuthenticationError")
    before = lags_timed(stack)
    run_id = stack.start("user-7", agent="chat", text="hello")
    with stack.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
        frames = [e.frame for e in events(reply) if e.data is not None]
    assert frames[-1]["type"] == "done"
    assert lags_timed(stack) - before == len(frames)  # every frame handed on, timed once
    reply = stack.call("bob", "GET", "/metrics")
    assert len(samples(reply.text, "agent_jobs_stream_lag_seconds_count")) == 1  # one series
    assert samples(reply.text, "agent_jobs_approvals_pending") == [0]


def test_a_run_started_over_http_keeps_the_callers_trace(stack: Stack) -> None:
    reply = stack.call(
        "user-7",
        "POST",
        "/v1/runs",
        json={"agent": "chat", "input": "traced"},
        headers={"traceparent": TRACEPARENT},
    )
    assert reply.status_code == 201, reply.text
    run = stack.doors.store.get_run(reply.json()["run_id"])
    assert run.trace_context is not None
    assert run.trace_context["traceparent"].split("-")[1] == TRACE_ID
    with stack.stream("user-7", f"/v1/runs/{run.run_id}/stream") as streamed:
        assert [e.frame for e in events(streamed) if e.data is not None][-1]["type"] == "done"
    # A malformed header is no trace: the run gets a root of its own.
    reply = stack.call(
        "user-7",
        "POST",
        "/v1/runs",
        json={"agent": "chat", "input": "untraced"},
        headers={"traceparent": "00-nonsense"},
    )
    other = stack.doors.store.get_run(reply.json()["run_id"])
    assert other.trace_context is not None
    assert TRACE_ID not in other.trace_context["traceparent"]
