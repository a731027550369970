"""Which trace a run joins (agent_jobs/observability/tracing.py): the caller's, named by a
`traceparent` it sent, or a root `run` of its own — never the span of the server's own
request. A run started over HTTP with no trace context hung on the request span an ASGI
instrumentation had made current."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_jobs.observability import tracing

CALLER = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Tracing on, with a provider of the test's own (the global one is left alone)."""
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    return found


def test_a_run_asked_for_without_a_trace_gets_its_own_root_not_the_requests_span(
    exporter: InMemorySpanExporter,
) -> None:
    tracer = tracing._tracer
    assert tracer is not None
    # The span an instrumentation makes current for the request, with no traceparent in it.
    request_span = tracer.start_as_current_span("POST /v1/runs")
    with request_span as request, tracing.extracted({"user-agent": "curl"}):
        kept = tracing.context_for_run("r1", "support", None)
    assert kept is not None
    request_trace = format(request.get_span_context().trace_id, "032x")
    assert kept["traceparent"].split("-")[1] != request_trace
    [root] = [s for s in exporter.get_finished_spans() if s.name == "run"]
    assert root.parent is None and format(root.context.trace_id, "032x") in kept["traceparent"]


def test_a_run_asked_for_with_a_traceparent_joins_the_callers_trace(
    exporter: InMemorySpanExporter,
) -> None:
    tracer = tracing._tracer
    assert tracer is not None
    given = {"traceparent": f"00-{CALLER}-b7ad6b7169203331-01"}
    with tracer.start_as_current_span("POST /v1/runs"), tracing.extracted(given):
        kept = tracing.context_for_run("r2", "support", None)
    assert kept is not None and kept["traceparent"].split("-")[1] == CALLER
    assert not [s for s in exporter.get_finished_spans() if s.name == "run"]
