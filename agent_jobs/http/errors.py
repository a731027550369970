"""Errors as the HTTP API answers them: `{"error": "<what to fix>", "type": "<ErrorType>"}`.

Every answer that is not a success has this shape: the library's typed errors, the
door's own (below), FastAPI's validation errors (422), unknown routes and methods, a
service that cannot be reached (503) and anything unexpected (500, with no detail).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.exceptions
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    AgentJobsError,
    ApprovalError,
    ConfigurationError,
    Conflict,
    Forbidden,
    InvalidRequestError,
    PayloadBlobError,
    TooManyRunsError,
    UnknownAgentError,
    UnknownCallError,
    UnknownQuestionError,
    UnknownRunError,
    UnknownThreadError,
)
from ..errors import PayloadTooLargeError as TooLargeToKeep

log = logging.getLogger(__name__)
Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


class ApiError(AgentJobsError):
    """A request the HTTP API refuses; `status` is the HTTP status it answers with."""

    status = 400


class AuthenticationError(ApiError):
    """No bearer token, or one the server does not know."""

    status = 401


class PermissionDeniedError(ApiError):
    """The token's actor may not do this."""

    status = 403


class NotFoundError(ApiError):
    """No such thing here (or none this actor may see)."""

    status = 404


class ConflictError(ApiError):
    """The request clashes with what is recorded: already decided, the run has ended."""

    status = 409


class PayloadTooLargeError(ApiError):
    status = 413


class ServiceUnavailableError(ApiError):
    """A service the answer needs cannot be reached, or the server is at its limit."""

    status = 503


class ErrorBody(BaseModel):
    """What every refusal carries."""

    error: str
    type: str


# How the library's own errors are answered, the first that matches: the status and, for
# a refusal, the type the API names it by (docs/doors.md, "Errors"); else its own name.
# The routes check nothing the domain checks: its typed refusals are mapped here alone.
LIBRARY_ANSWERS: tuple[tuple[type, int, str | None], ...] = (
    (Forbidden, 403, "PermissionDeniedError"),
    (UnknownRunError, 404, None),
    (UnknownThreadError, 404, None),
    (UnknownCallError, 404, None),
    (UnknownQuestionError, 404, "NotFoundError"),
    (UnknownAgentError, 422, None),
    (InvalidRequestError, 422, None),
    (TooManyRunsError, 429, None),
    (TooLargeToKeep, 413, None),  # a payload over AGENT_JOBS_PAYLOAD_MAX
    (PayloadBlobError, 500, None),  # a payload kept apart is missing or altered
    (Conflict, 409, "ConflictError"),
    (ApprovalError, 409, "ConflictError"),
    (ConfigurationError, 500, None),
)
DATABASE_ERRORS = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)
REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No bearer token, or an unknown one"},
    403: {"model": ErrorBody, "description": "The token's actor may not do this"},
    422: {"model": ErrorBody, "description": "The request is malformed"},
}


def error_response(
    status: int, message: str, type_: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message, "type": type_}, status_code=status, headers=headers)


def answer_of(exc: AgentJobsError) -> tuple[int, str]:
    """The status `exc` is answered with, and the type it is named by."""
    if isinstance(exc, ApiError):
        return exc.status, type(exc).__name__
    for kind, status, named in LIBRARY_ANSWERS:
        if isinstance(exc, kind):
            return status, named or type(exc).__name__
    return 400, type(exc).__name__


def answer_error(exc: AgentJobsError) -> JSONResponse:
    status, named = answer_of(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return error_response(status, str(exc), named, headers)


def validation_message(exc: RequestValidationError) -> str:
    """`field: what is wrong` for each fault, the way a run request's faults read."""
    faults = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        faults.append(f"{'.'.join(loc) or '(request)'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(faults)


async def _library(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AgentJobsError)
    return answer_error(exc)


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(422, validation_message(exc), "InvalidRequestError")


def _starlette(authenticate: Callable[[Request], object]) -> Handler:
    """Starlette's own refusals: an unknown route (404), a method a route lacks (405).
    Every request but a handful carries a token (`authenticate` checks it): an unknown
    route without one is refused as any other request would be, and says nothing of what
    exists."""

    async def refused(request: Request, exc: Exception) -> JSONResponse:
        return _http(request, exc, authenticate)

    return refused


def _http(
    request: Request, exc: Exception, authenticate: Callable[[Request], object]
) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        try:
            if not request.url.path.startswith("/static/"):  # the page's assets are public
                authenticate(request)
        except AuthenticationError as refused:
            return answer_error(refused)
        message = f"no such route: {request.method} {request.url.path}"
        return error_response(404, message, "NotFoundError")
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(405, message, "MethodNotAllowedError", dict(exc.headers or {}))
    return error_response(exc.status_code, str(exc.detail), "HTTPError", dict(exc.headers or {}))


async def _unreachable(request: Request, exc: Exception) -> JSONResponse:
    what = "the database" if isinstance(exc, DATABASE_ERRORS) else "Redis"
    log.warning("%s %s: %s is unreachable: %s", request.method, request.url.path, what, exc)
    return error_response(
        503, f"{what} is unreachable; try again shortly", "ServiceUnavailableError"
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(500, "the server failed; its log says why", "InternalError")


def install(app: FastAPI, authenticate: Callable[[Request], object]) -> None:
    """Answer every refusal of `app` as an `ErrorBody` (`authenticate`: the token check
    an unknown route gets too)."""
    app.add_exception_handler(AgentJobsError, _library)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _starlette(authenticate))
    for kind in (*DATABASE_ERRORS, *REDIS_ERRORS):
        app.add_exception_handler(kind, _unreachable)
    app.add_exception_handler(Exception, _unexpected)
