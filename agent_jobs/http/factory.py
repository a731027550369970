"""The ASGI app of `agent-jobs serve`: built by `create_app` around a door to the runs."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI

from ..settings import Settings
from . import controls, decisions, errors, history, page, reconcile, runs, scraping, service
from .auth import TokenTable, authenticate
from .connections import QuietRepeats
from .door import Door
from .middleware import BodyLimit, SecurityHeaders
from .state import STATE_KEY, ServerState, StreamSlots

DESCRIPTION = """Start agent runs, follow their live frames, decide on their actions.

Every route but `GET /healthz` (and the inbox page `GET /`) takes
`Authorization: Bearer <token>`, a token of `AGENT_JOBS_API_TOKENS`. Refusals are
`{"error": "<what to fix>", "type": "<ErrorType>"}`."""


def _no_request_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (newer releases) off: with a tracer provider set up
    (`AGENT_JOBS_OTEL`), it made a trace of every request, health probes included, and
    put a run asked for with no trace context under its request span. The server's
    traces are its runs' (docs/operating.md, "Traces"); its metrics are Prometheus'."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    off = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}
    return {"telemetry": off}


def create_app(door: Door, settings: Settings, *, routers: Iterable[APIRouter] = ()) -> FastAPI:
    """The app serving `door`. More routes (`routers`) are added after the API's own.

    Refuses (`ConfigurationError`) without usable `AGENT_JOBS_API_TOKENS`.
    """
    tokens = TokenTable.from_secret(settings.api_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # An error the loop reports over and over (accept() out of file descriptors)
        # is logged once a while, not once each.
        asyncio.get_running_loop().set_exception_handler(QuietRepeats())
        yield
        door.close()

    app = FastAPI(
        **_no_request_telemetry(),
        title="agent-jobs",
        version=page.package_version(),
        description=DESCRIPTION,
        # The OpenAPI document is a route of ours, behind a token; no docs pages (they
        # load scripts from a CDN, which the page's policy forbids).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    slots = StreamSlots(settings.api_max_streams, settings.api_max_streams_per_actor)
    state = ServerState(door, tokens, settings, slots)
    setattr(app.state, STATE_KEY, state)
    errors.install(app, authenticate)
    for router in (
        service.router,
        history.router,  # before runs: `/v1/runs/stream` is no run id
        runs.router,
        decisions.router,
        reconcile.router,
        controls.router,
        page.router,
        scraping.router,
        *routers,
    ):
        app.include_router(router)
    app.mount("/static", page.static_files(), name="static")
    app.add_middleware(BodyLimit, tokens=tokens)
    app.add_middleware(SecurityHeaders)
    return app
