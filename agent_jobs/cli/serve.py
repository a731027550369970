"""`agent-jobs serve`: the HTTP API and the approval inbox page (the `api` extra).

With `AGENT_JOBS_BROKER_URL` the server hands runs to the Celery workers (the durable
door of `agent_jobs.http.door`). Without it, runs are driven in the server's own
process by the inline runner, whose door is here: only the command line and the
package root reach a runner.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any, Literal

import click

from .. import metrics, tracing
from ..client import Client
from ..controls import Forked, Retried
from ..dispatch import CeleryDispatcher, celery_client
from ..errors import ConfigurationError, TooManyRunsError
from ..http import API_EXTRA
from ..http.door import Door, DurableDoor
from ..loading import load_app
from ..logs import configure_logging
from ..notify.sender import start_sender
from ..notify.webhook import check as check_webhook
from ..reconciliation import Reconciliation, record_reconciliation
from ..runners import InlineRunner
from ..runs import RunRequest
from ..settings import Settings, get_settings
from ..store import Store
from ..store import runs as run_rows
from ..streams.base import StreamBackend
from .common import EXIT_USAGE, fail, handle_errors

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)

# Database connections the server keeps (10 more on a burst): its requests run on a
# pool of 40 threads, most of them done in a query or two.
DB_POOL_SIZE = 10
# Seconds open event streams get to end when the server is asked to stop.
GRACEFUL_SHUTDOWN = 3


class InlineDoor:
    """Runs driven in this process by the inline runner; frames from its memory streams
    (entry ids are positions: 1, 2, …). A decision recorded here releases the waiting
    turn at once; one recorded elsewhere, at the runner's next look at the database."""

    runner = "inline"
    entry_id = re.compile(r"^\d{1,12}$")

    def __init__(self, runner: InlineRunner, runs_per_actor: int = 50) -> None:
        self.inline = runner
        # Each run this process drives holds a thread until it ends, a run parked on a
        # person too: an actor may have this many going at once.
        self.runs_per_actor = runs_per_actor
        self.store = runner.store
        self.app = runner.app
        self.streams: StreamBackend = runner.streams
        # A run id is taken by the first request that names it: the check and the start
        # are one step for the requests of this process.
        self._admitting = threading.Lock()

    def admit(self, request: RunRequest) -> tuple[str, bool]:
        with self._admitting:
            if request.run_id is not None and self.store.find_run(request.run_id) is not None:
                return request.run_id, False
            with self.store.connect() as conn:
                going = run_rows.unfinished_of(conn, request.actor, "inline")
            if going >= self.runs_per_actor:
                raise TooManyRunsError(
                    f"actor {request.actor!r} has {going} runs going in this server, the most "
                    "one actor may (AGENT_JOBS_API_INLINE_RUNS_PER_ACTOR): let one end, or "
                    "serve with a broker, whose workers hold no thread for a waiting run"
                )
            run_id = self.inline.start(
                request.agent,
                request.input,
                actor=request.actor,
                thread_id=request.thread_id,
                run_id=request.run_id,
                persona=request.persona,
                metadata=request.metadata,
                if_busy=request.if_busy,
            )
        return run_id, True

    def decide(
        self,
        run_id: str,
        call_id: str,
        decision: Literal["approve", "reject"],
        *,
        actor: str,
        reason: str | None,
        args_sha256: str | None,
    ) -> bool:
        return self.inline.signal(
            run_id, call_id, decision, actor=actor, reason=reason, args_sha256=args_sha256
        )

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        return self.inline.answer(run_id, request_id, answers, actor=actor)

    def reconcile(self, run_id: str, call_id: str, decision: Reconciliation) -> bool:
        # An inline run dies with its process and never waits on an unknown outcome: this
        # refuses, unless the call is a durable run's (then the sweep wakes it).
        with self.store.begin() as conn:
            record_reconciliation(conn, self.app, run_id, call_id, decision)
        return True

    def post_message(self, run_id: str, text: str, *, target: str) -> str:
        return self.inline.post_message(run_id, text, target=target)

    def cancel(self, run_id: str, *, keep_inbox: bool) -> list[str]:
        return self.inline.cancel(run_id, "user", keep_inbox=keep_inbox)

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        return self.inline.pause(run_id, actor=actor)

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        return self.inline.resume(run_id, actor=actor)

    def retry(self, run_id: str, *, actor: str) -> Retried:
        return self.inline.retry(run_id, actor=actor)

    def fork(self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False) -> Forked:
        return self.inline.fork(run_id, at, actor=actor, keep_decisions=keep_decisions)

    def close(self) -> None:
        self.store.engine.dispose()


def build_door(settings: Settings) -> Door:
    """The durable door with a broker; the inline runner's without."""
    store = Store.from_url(settings.database_url, pool_size=DB_POOL_SIZE)
    if settings.broker_url:
        dispatcher = CeleryDispatcher(celery_client(settings.broker_url, settings.queue))
        client = Client(store, load_app(settings.app), settings, dispatcher)
        return DurableDoor.from_settings(settings, client, settings.api_max_streams)
    # The models run here: an unusable AGENT_JOBS_MODEL is an error, as for `run`.
    app = load_app(settings.app, strict_model=True)
    runner = InlineRunner(app, store, settings=settings)
    return InlineDoor(runner, settings.api_inline_runs_per_actor)


def build_app(settings: Settings | None = None) -> FastAPI:
    """The server's app from the settings (tokens checked before anything connects)."""
    try:
        from ..http.auth import TokenTable
        from ..http.factory import create_app
    except ImportError:
        raise ConfigurationError(API_EXTRA) from None
    settings = settings or get_settings()
    TokenTable.from_secret(settings.api_tokens)
    tracing.check(settings)  # a missing extra is refused before anything connects
    check_webhook(settings)  # so is a webhook without a secret
    door = build_door(settings)
    start_sender(door.store, settings)  # runs' notifications, from this process too
    tracing.setup(settings)  # after the app, which may have set OpenTelemetry up itself
    # AGENT_JOBS_METRICS_PORT: the metrics on their port, and at GET /metrics too.
    metrics.serve(settings, store=door.store)
    return create_app(door, settings)


_default: FastAPI | None = None
_default_lock = threading.Lock()


def default_app() -> FastAPI:
    """`agent_jobs.http:app`: built on first use, once."""
    global _default
    with _default_lock:
        if _default is None:
            _default = build_app()
        return _default


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="The port."
)
@handle_errors
def serve(host: str, port: int) -> None:
    """Serve the HTTP API and the approval inbox page (needs the api extra).

    Every request but GET /healthz and the page itself carries a bearer token of
    AGENT_JOBS_API_TOKENS (a JSON object of token to actor). With AGENT_JOBS_BROKER_URL
    runs go to the workers; without it they run in this process (the inline runner).
    """
    try:
        import uvicorn
    except ImportError:
        fail(API_EXTRA, EXIT_USAGE)
    settings = get_settings()
    app = build_app(settings)
    # From here on: what migrating the embedded database said is not the server's log.
    configure_logging()
    runner = "the workers (durable)" if settings.broker_url else "this process (inline)"
    log.info("serving the HTTP API on %s:%s; runs go to %s", host, port, runner)
    from ..http.connections import connection_cap, protocol

    cap = connection_cap(settings.api_max_connections)
    if cap < settings.api_max_connections:
        log.warning(
            "holding at most %d connections at once, not %d: the open-files limit leaves "
            "no room for more (raise it with `ulimit -n`)",
            cap,
            settings.api_max_connections,
        )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,  # our handlers (AGENT_JOBS_LOG_FORMAT) print uvicorn's records
        log_level="info",
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        # A request's headers have a deadline; connections past the cap are 503.
        http=protocol(settings.api_header_timeout, cap),
    )
