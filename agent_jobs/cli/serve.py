"""`agent-jobs serve`: the HTTP API and the approval inbox page (the `api` extra).

With `AGENT_JOBS_BROKER_URL` the server hands runs to the Celery workers; without it,
runs are driven in the server's own process by the inline runner (`agent_jobs/serving.py`
builds the app either way).
"""

from __future__ import annotations

import logging

import click

from ..logs import configure_logging
from ..serving import API_EXTRA, build_app
from ..settings import get_settings
from .common import EXIT_USAGE, fail, handle_errors

log = logging.getLogger(__name__)

# Seconds open event streams get to end when the server is asked to stop.
GRACEFUL_SHUTDOWN = 3


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
