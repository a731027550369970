"""Prometheus metrics (the `metrics` extra): what the workers, the approvals listener and
`serve` count, and the port a scrape reads them on.

Off unless `AGENT_JOBS_METRICS_PORT` is set: `prometheus_client` is then never imported
and every recording function returns at once. On, `setup` builds the metrics (a missing
extra is a `ConfigurationError` naming it) and `bind` takes the port; a scrape needs
`Authorization: Bearer <AGENT_JOBS_METRICS_TOKEN>` when the token is set, and the port
may listen beyond loopback only with a token.

A prefork worker's pool processes each count in files of their own (prometheus_client's
multiprocess mode, set up by the worker's main process before it forks), and its main
process serves their sum; `agent_jobs_approvals_pending` is read from Postgres at each
scrape (agent_jobs/observability/scrape.py).

What the runners report goes through `agent_jobs.observability.observe`, once the transaction that
recorded it has committed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..settings import Settings, get_settings
from . import scrape

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from ..store import Store

log = logging.getLogger(__name__)

EXTRA = "pip install 'agent-jobs[metrics]'"

# Seconds. A step is a local write (milliseconds) up to a model call of minutes; a human
# decision takes seconds to days; a live frame is handed on in milliseconds.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DECISION_BUCKETS = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 14400, 43200, 86400, 259200)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _Metrics:
    """The metrics, named as docs/operating.md ("Metrics and traces") documents them."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        # Registered nowhere: what a scrape reads is chosen in `setup` (the objects
        # themselves, or the files of every process).
        def counter(name: str, what: str, labels: Iterable[str] = ()) -> Counter:
            return Counter(name, what, list(labels), registry=None)

        def histogram(name: str, what: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, what, registry=None, buckets=buckets)

        self.runs_started = counter("agent_jobs_runs_started", "Runs started", ["agent"])
        self.runs_finished = counter(
            "agent_jobs_runs_finished", "Runs ended, by status", ["agent", "status"]
        )
        self.step_seconds = Histogram(
            "agent_jobs_step_seconds",
            "Time a step took to carry out, by kind (model, tool, local)",
            ["kind"],
            registry=None,
            buckets=STEP_BUCKETS,
        )
        self.step_retries = counter(
            "agent_jobs_step_retries", "Attempts of steps beyond their first", ["kind"]
        )
        self.dead_letters = counter(
            "agent_jobs_dead_letters", "Steps given up after too many attempts"
        )
        self.decision_seconds = histogram(
            "agent_jobs_decision_seconds",
            "Time from an approval request to its decision",
            DECISION_BUCKETS,
        )
        self.tokens = counter(
            "agent_jobs_tokens",
            "Model tokens spent, by model and direction",
            ["model", "direction"],
        )
        self.cost = counter("agent_jobs_cost_usd", "Model cost in USD, where known", ["model"])
        self.stream_lag = histogram(
            "agent_jobs_stream_lag_seconds",
            "Time from a live frame's creation to a reader handing it on",
            LAG_BUCKETS,
        )
        self.approval_messages = counter(
            "agent_jobs_approval_messages",
            "Messages the approvals listener settled, by outcome",
            ["outcome"],
        )

    def all(self) -> list[Any]:
        return [value for value in vars(self).values()]


_metrics: _Metrics | None = None  # set once `setup` turned metrics on
_registry: Any = None  # what a scrape reads
_lock = threading.Lock()


def enabled() -> bool:
    return _metrics is not None


# --- recording (each a no-op while metrics are off) ------------------------------------------


def run_started(agent: str) -> None:
    if _metrics is not None:
        _metrics.runs_started.labels(agent).inc()


def run_finished(agent: str, status: str) -> None:
    if _metrics is not None:
        _metrics.runs_finished.labels(agent, status).inc()


def step(kind: str, seconds: float | None, retries: int = 0) -> None:
    """A step's outcome recorded: how long it took to carry out (None: it was not carried
    out, e.g. given up), and its attempts beyond the first."""
    if _metrics is None:
        return
    if seconds is not None:
        _metrics.step_seconds.labels(kind).observe(max(0.0, seconds))
    if retries > 0:
        _metrics.step_retries.labels(kind).inc(retries)


def dead_letter() -> None:
    if _metrics is not None:
        _metrics.dead_letters.inc()


def tokens(model: str | None, input_tokens: int, output_tokens: int, cost: float | None) -> None:
    if _metrics is None:
        return
    name = model or "unknown"
    _metrics.tokens.labels(name, "input").inc(max(0, input_tokens))
    _metrics.tokens.labels(name, "output").inc(max(0, output_tokens))
    if cost is not None and cost > 0:
        _metrics.cost.labels(name).inc(cost)


def decision(seconds: float) -> None:
    if _metrics is not None:
        _metrics.decision_seconds.observe(max(0.0, seconds))


def approval_message(outcome: str) -> None:
    if _metrics is not None:
        _metrics.approval_messages.labels(outcome).inc()


def observe_stream_lag(entry_id: str | bytes, now: float | None = None) -> None:
    """A reader hands on a live frame: its lag since the frame was written, read from its
    Redis Stream entry id (`<milliseconds>-<sequence>`, Redis's clock). An id that is not
    one is ignored."""
    if _metrics is None:
        return
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    millis, _, _ = text.partition("-")
    if not millis.isdigit():
        return
    lag = (time.time() if now is None else now) - int(millis) / 1000
    _metrics.stream_lag.observe(max(0.0, lag))


# --- turning metrics on ----------------------------------------------------------------------


def setup(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    multiprocess_dir: str | None = None,
) -> bool:
    """Turn metrics on if `AGENT_JOBS_METRICS_PORT` is set; returns whether they are on.

    `store` is where the pending approvals are counted at a scrape (by default a small
    engine of its own, made at the first scrape). `multiprocess_dir`: a process about to
    fork children that each count (a prefork worker's main process) counts in files
    there, emptied now; a directory in `PROMETHEUS_MULTIPROC_DIR` is used the same way.
    Raises `ConfigurationError` when the extra is missing.
    """
    global _metrics, _registry
    settings = settings or get_settings()
    if settings.metrics_port is None:
        return False
    with _lock:
        if _metrics is not None:
            return True
        if multiprocess_dir is not None:
            scrape.prepare_dir(multiprocess_dir)
            os.environ[scrape.MULTIPROC_ENV] = multiprocess_dir
        try:
            import prometheus_client
            from prometheus_client import values as values_module
        except ImportError:
            raise ConfigurationError(
                f"AGENT_JOBS_METRICS_PORT is set but prometheus-client is not installed: {EXTRA}"
            ) from None
        # The kind of value is chosen when prometheus_client is first imported: choose
        # again, since the directory may have been set since.
        values: Any = values_module  # its functions are untyped
        values.ValueClass = values.get_value_class()
        metrics = _Metrics()
        registry = prometheus_client.CollectorRegistry()
        path = os.environ.get(scrape.MULTIPROC_ENV)
        if path:
            registry.register(scrape.ProcessFiles(path))
        else:
            for metric in metrics.all():
                registry.register(metric)
            registry.register(prometheus_client.ProcessCollector(registry=None))
        registry.register(scrape.PendingApprovals(settings, store))
        _metrics, _registry = metrics, registry
    return True


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus's text format, and its content type: what `serve` answers
    at `GET /metrics`. Raises `ConfigurationError` while metrics are off."""
    if _registry is None:
        raise ConfigurationError("metrics are off: set AGENT_JOBS_METRICS_PORT to turn them on")
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(_registry), CONTENT_TYPE_LATEST


# --- the port --------------------------------------------------------------------------------

_server: WSGIServer | None = None
_serving: threading.Thread | None = None


def serve(settings: Settings | None = None, *, store: Store | None = None) -> bool:
    """`setup`, `bind` and `start_serving` in one: for a process that does not fork (the
    listener, `serve`). Returns whether metrics are on."""
    settings = settings or get_settings()
    if not setup(settings, store=store):
        return False
    bind(settings)
    start_serving()
    return True


def bind(settings: Settings | None = None) -> None:
    """Take the metrics port (no answers yet: `start_serving`). Raises `ConfigurationError`
    when it cannot be taken, or would listen beyond loopback with no token."""
    global _server
    settings = settings or get_settings()
    port, addr = settings.metrics_port, settings.metrics_addr
    if port is None or _server is not None:
        return
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    if not token and not scrape.loopback(addr):
        raise ConfigurationError(
            f"AGENT_JOBS_METRICS_ADDR={addr} lets others scrape the metrics: set "
            "AGENT_JOBS_METRICS_TOKEN (a scrape then sends `Authorization: Bearer <token>`), "
            "or listen on 127.0.0.1"
        )
    try:
        _server = scrape.make_server(addr, port, scrape.wsgi_app(_Scrape(), token))
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {addr}:{port} (AGENT_JOBS_METRICS_PORT): "
            f"{exc.strerror or exc}"
        ) from None


def start_serving() -> None:
    """Answer scrapes on the bound port, from a thread of this process."""
    global _serving
    with _lock:
        if _server is None or _serving is not None:
            return
        _serving = threading.Thread(target=_server.serve_forever, name="metrics", daemon=True)
        _serving.start()
    host, port = _server.server_address[:2]
    log.info("metrics on http://%s:%d/metrics", host, port)


def close() -> None:
    """Stop answering and let the port go (a worker's main process as it stops)."""
    global _server, _serving
    server, serving, _server, _serving = _server, _serving, None, None
    if server is None:
        return
    if serving is not None:
        server.shutdown()
    server.server_close()


def _forget_in_child() -> None:
    """A forked child neither serves nor holds the port: its copy of the socket is closed
    (the parent's stays open)."""
    global _server, _serving
    if _server is not None:
        with contextlib.suppress(OSError):
            _server.socket.close()
    _server, _serving = None, None


os.register_at_fork(after_in_child=_forget_in_child)


class _Scrape:
    """The registry as it stands at each scrape (set by `setup`)."""

    def collect(self) -> Iterator[Any]:
        if _registry is not None:
            yield from _registry.collect()
