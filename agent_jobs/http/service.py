"""The server's own routes: `GET /healthz`, `GET /openapi.json`, `GET /v1/me`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from .auth import CallerDep
from .bodies import Health, Me
from .errors import DATABASE_ERRORS, ERROR_RESPONSES, ErrorBody
from .state import server

router = APIRouter()


@router.get(
    "/healthz",
    response_model=Health,
    tags=["service"],
    responses={503: {"model": ErrorBody, "description": "The database does not answer"}},
)
def healthz(request: Request) -> JSONResponse:
    """200 `{"ok": true}` when the database answers; 503 otherwise. No token needed."""
    try:
        with server(request).door.store.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DATABASE_ERRORS:
        return JSONResponse(
            {
                "ok": False,
                "error": "the database is unreachable",
                "type": "ServiceUnavailableError",
            },
            status_code=503,
        )
    return JSONResponse({"ok": True})


@router.get("/openapi.json", tags=["service"], responses=ERROR_RESPONSES)
def openapi(request: Request, caller: CallerDep) -> dict[str, Any]:
    """This API's OpenAPI document (behind a token, as every route but /healthz)."""
    document: dict[str, Any] = request.app.openapi()
    return document


@router.get("/v1/me", response_model=Me, tags=["service"], responses=ERROR_RESPONSES)
def me(caller: CallerDep) -> Me:
    """The token's actor and the roles the app gives it."""
    return Me(actor=caller.actor, roles=sorted(caller.roles))
