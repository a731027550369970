"""OpenTelemetry traces (the `otel` extra): a span for each step of a run, parented on the
trace context the run was started in.

Off unless `AGENT_JOBS_OTEL=1`: OpenTelemetry is then never imported and every function
here returns at once. On, `setup` installs an SDK tracer provider configured by the
standard `OTEL_*` variables (`OTEL_SERVICE_NAME`, `OTEL_TRACES_EXPORTER` = otlp | console
| none, `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_SAMPLER`, …) unless the process set
one up itself, which is then used as it is.

A run keeps the W3C trace context (`traceparent`, `tracestate`) it was created in, in its
row: the current context of the process that creates it (`agent_jobs.client`, the HTTP
API, or a `start_run` task whose message headers carried one, attached while the task
runs). A run created with none gets a root span `run` of its own; a delegated run takes
its parent's, and a thread's next turn the turn's before it. Each step is then a span
named by its step, parented on that context whichever process carries it out, made once
the step's outcome has committed (`agent_jobs.observability.observe`), so a replay makes none.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..settings import Settings, get_settings

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

EXTRA = "pip install 'agent-jobs[otel]'"
# What a run keeps of a trace context: W3C's two headers, `tracestate` within W3C's
# recommended size (it comes from message headers, which anyone on the broker can write).
KEPT = ("traceparent", "tracestate")
MAX_TRACESTATE = 512

_tracer: Tracer | None = None


def enabled() -> bool:
    return _tracer is not None


def check(settings: Settings | None = None) -> None:
    """Raise `ConfigurationError` if `AGENT_JOBS_OTEL` is on and the extra is missing, or
    the `OTEL_*` variables ask for an exporter agent-jobs does not ship."""
    settings = settings or get_settings()
    if not settings.otel:
        return
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            f"AGENT_JOBS_OTEL is on but OpenTelemetry is not installed: {EXTRA}"
        ) from None
    _exporters()


def setup(settings: Settings | None = None) -> bool:
    """Turn tracing on if `AGENT_JOBS_OTEL` is; returns whether it is on."""
    global _tracer
    settings = settings or get_settings()
    if not settings.otel:
        return False
    if _tracer is not None:
        return True
    check(settings)
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):  # nobody set one up: ours
        provider = _sdk_provider()
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("agent_jobs")
    return True


def flush(timeout_millis: int = 5000) -> None:
    """Export what is buffered (a process about to exit)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis)


# --- trace contexts --------------------------------------------------------------------------


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers, to keep with a run created now; None while
    tracing is off or no span is current."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    _w3c().inject(headers)
    return _kept(headers)


def context_for_run(run_id: str, agent: str, inherited: Mapping[str, str] | None) -> Any:
    """The trace context a new run keeps: `inherited` (a delegated run's parent's, the turn
    before on the thread), else the current one, else that of a root span `run` made
    for it. None while tracing is off."""
    if _tracer is None:
        return None
    if inherited:
        return dict(inherited)
    current = carrier()
    if current is not None:
        return current
    root = _tracer.start_span(
        "run", context=_empty(), attributes={"agent_jobs.run_id": run_id, "agent_jobs.agent": agent}
    )
    root.end()
    from opentelemetry import trace

    headers: dict[str, str] = {}
    _w3c().inject(headers, context=trace.set_span_in_context(root))
    return _kept(headers)


@contextlib.contextmanager
def extracted(headers: Mapping[str, Any] | None) -> Iterator[None]:
    """Make the trace context in `headers` (W3C `traceparent`, `tracestate`) current for
    the block: a run created inside keeps it. When the headers hold none (or a malformed
    one), no context is current in the block: the span of the server's or the worker's
    own request (an HTTP framework's, Celery's, put there by an instrumentation) is not
    the caller's, and a run created inside gets a root span `run` of its own. Nothing
    while tracing is off."""
    if _tracer is None:
        yield
        return
    given = {k: v for k in KEPT if isinstance(v := (headers or {}).get(k), str)}
    kept = _kept(given)
    from opentelemetry import context as otel_context

    token = otel_context.attach(_w3c().extract(kept) if kept is not None else _empty())
    try:
        yield
    finally:
        otel_context.detach(token)


def task_headers(request: Any) -> dict[str, Any]:
    """The W3C headers of a Celery task message: Celery keeps a message's headers as
    attributes of the task's request (and a sender's custom ones under `headers` too)."""
    found: dict[str, Any] = {}
    nested = getattr(request, "headers", None)
    for key in KEPT:
        value = getattr(request, key, None)
        if value is None and isinstance(nested, dict):
            value = nested.get(key)
        if value is not None:
            found[key] = value
    return found


# --- spans -----------------------------------------------------------------------------------


def span(
    context: Mapping[str, str] | None,
    name: str,
    *,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, str | int | float],
    error: str | None = None,
) -> None:
    """A finished span `name` under `context` (a run's), from `start_ns` to `end_ns`
    (nanoseconds since the epoch); `error` marks it failed. Nothing while tracing is off
    or for a run that keeps no context."""
    if _tracer is None or not context:
        return
    from opentelemetry.trace import Status, StatusCode

    made = _tracer.start_span(
        name,
        context=_w3c().extract(dict(context)),
        attributes=dict(attributes),
        start_time=start_ns,
    )
    if error is not None:
        made.set_status(Status(StatusCode.ERROR, error[:200]))
    made.end(end_time=max(start_ns, end_ns))


# --- set-up ----------------------------------------------------------------------------------


def _sdk_provider() -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "agent-jobs"}))
    provider = TracerProvider(resource=resource)
    for name in _exporters():
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    return provider


def _exporters() -> list[str]:
    """The exporters `OTEL_TRACES_EXPORTER` names (`otlp` by default), checked."""
    wanted = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    names = [n.strip().lower() for n in wanted.split(",") if n.strip()]
    if any(n not in ("otlp", "console", "none") for n in names):
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER={wanted}: agent-jobs exports to otlp (HTTP), console or none"
        )
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if "otlp" in names and protocol and protocol != "http/protobuf":
        raise ConfigurationError(
            f"OTLP protocol {protocol!r}: agent-jobs ships the OTLP HTTP exporter "
            "(http/protobuf); point OTEL_EXPORTER_OTLP_ENDPOINT at a collector's HTTP port"
        )
    return [n for n in names if n != "none"]


def _w3c() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def _empty() -> Any:
    from opentelemetry.context import Context

    return Context()


def _kept(headers: Mapping[str, str]) -> dict[str, str] | None:
    """`traceparent` and a bounded `tracestate`, if `traceparent` is a valid context."""
    from opentelemetry import trace

    kept = {k: headers[k] for k in KEPT if k in headers}
    if len(kept.get("tracestate", "")) > MAX_TRACESTATE:
        del kept["tracestate"]
    if "traceparent" not in kept:
        return None
    valid = trace.get_current_span(_w3c().extract(kept)).get_span_context().is_valid
    return kept if valid else None
