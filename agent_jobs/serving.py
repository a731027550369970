"""The HTTP server, assembled: its door to the runs and its app (`agent-jobs serve`,
`agent_jobs.http:app`).

With a broker the door's commands wake the Celery workers and frames are read from Redis
Streams; without one, the inline runner drives runs in this process and frames are read
from its memory. This is the one module that joins the HTTP door to a runner: the
`agent_jobs.http` package knows neither the runners nor the command line.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from . import startup
from .client import Client
from .dispatch import CeleryDispatcher, celery_client
from .errors import ConfigurationError
from .http.door import INLINE_ENTRY_ID, Door, durable_door
from .loading import load_app
from .runners import InlineRunner
from .schedules.ticker import start_ticker
from .settings import Settings, get_settings
from .store import Store

if TYPE_CHECKING:
    from fastapi import FastAPI

API_EXTRA = "the HTTP API needs the api extra: pip install 'agent-jobs[api]'"
# Database connections the server keeps (10 more on a burst): its requests run on a
# pool of 40 threads, most of them done in a query or two.
DB_POOL_SIZE = 10


def build_door(settings: Settings) -> Door:
    """The workers' door with a broker; the inline runner's without."""
    store = Store.from_url(settings.database_url, pool_size=DB_POOL_SIZE)
    if settings.broker_url:
        dispatcher = CeleryDispatcher(celery_client(settings.broker_url, settings.queue))
        client = Client(store, load_app(settings.app), settings, dispatcher)
        return durable_door(settings, client, settings.api_max_streams)
    # The models run here: an unusable AGENT_JOBS_MODEL is an error, as for `run`.
    app = load_app(settings.app, strict_model=True)
    # Each run this process drives holds a thread until it ends, a run parked on a person
    # too: an actor may have this many going at once.
    runner = InlineRunner(
        app, store, settings=settings, runs_per_actor=settings.api_inline_runs_per_actor
    )
    # Its schedules start their runs here, as beat's tick does with a broker.
    start_ticker(store, app, runner.wake, settings)
    return Door("inline", runner.commands, runner.streams, INLINE_ENTRY_ID)


def build_app(settings: Settings | None = None) -> FastAPI:
    """The server's app from the settings (tokens checked before anything connects)."""
    try:
        from .http.auth import TokenTable
        from .http.factory import create_app
    except ImportError:
        raise ConfigurationError(API_EXTRA) from None
    settings = settings or get_settings()
    TokenTable.from_secret(settings.api_tokens)
    startup.check(settings)  # refused before anything connects
    door = build_door(settings)
    # AGENT_JOBS_METRICS_PORT: the metrics on their port, and at GET /metrics too.
    startup.start(door.store, settings, serve_metrics=True)
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
