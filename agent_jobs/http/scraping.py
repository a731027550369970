"""`GET /metrics` of `agent-jobs serve`: the server's Prometheus metrics
(agent_jobs/observability/metrics.py), when `AGENT_JOBS_METRICS_PORT` turned them on, for
a scraper that reaches the API and not the metrics port."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..observability import metrics
from .auth import authenticate, bearer_token
from .errors import ERROR_RESPONSES, NotFoundError
from .state import server

router = APIRouter()


@router.get("/metrics", tags=["service"], response_class=Response, responses=ERROR_RESPONSES)
def scrape(request: Request) -> Response:
    """The metrics in Prometheus's text format. The bearer is `AGENT_JOBS_METRICS_TOKEN`
    (what a scraper of the metrics port sends) or any API token; 404 while metrics are off."""
    if not metrics.enabled():
        raise NotFoundError("metrics are off: set AGENT_JOBS_METRICS_PORT to turn them on")
    wanted = server(request).settings.metrics_token
    given = bearer_token(request)
    if (
        wanted is None
        or given is None
        or not hmac.compare_digest(given.encode(), wanted.get_secret_value().encode())
    ):
        authenticate(request)  # then it must be an API token
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)
