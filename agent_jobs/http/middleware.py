"""What every answer of the server carries, and the largest body it reads.

Plain ASGI (not Starlette's `BaseHTTPMiddleware`): event streams pass through untouched.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import TokenTable, actor_for
from .errors import AuthenticationError, PayloadTooLargeError

# The page's script and style come from this server alone; nothing inline runs (a
# run's text that looks like markup cannot become a script), no other origin is
# reached, no form is sent anywhere, the page is framed by no one.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
# A run's input may be 1,000,000 characters; JSON escapes can make that a few MB.
MAX_BODY = 8 * 1024 * 1024


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` to every answer, and `Cache-Control: no-store` to the
    API's (they hold runs' data and are asked for with a token)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        private = not str(scope.get("path", "")).startswith("/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                if private and b"cache-control" not in present:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyLimit:
    """What a request's body may cost, judged before the app reads it:

    - a body is read only from a caller with a known token (else 401, not a byte read):
      every route that takes a body needs one;
    - its size is counted as the bytes arrive, whatever the headers declare: past `limit`
      it is refused (413) and no more is read. A body must declare its size
      (`Content-Length`: chunks alone are 411) and declare it once (a length and chunks
      together, the shape of a smuggled request, are 400);
    - it holds at most `MAX_VALUES` JSON values, nested at most `MAX_DEPTH` deep (else
      413): what it costs parsed stays within a few times its size.

    The app then reads the body as it was received.
    """

    def __init__(self, app: ASGIApp, tokens: TokenTable, limit: int = MAX_BODY) -> None:
        self.app = app
        self.tokens = tokens
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        names = [name.lower() for name, _ in scope.get("headers", [])]
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        chunked = b"transfer-encoding" in names
        lengths = names.count(b"content-length")
        length = headers.get(b"content-length")
        if chunked and lengths:
            message = "send a body with one Content-Length header, not in chunks as well"
            await _refuse(send, 400, message, "BadRequestError")
            return
        if lengths > 1:
            await _refuse(send, 400, "send one Content-Length header", "BadRequestError")
            return
        if chunked:
            message = "send the body with a Content-Length header, not in chunks"
            await _refuse(send, 411, message, "LengthRequiredError")
            return
        if length is None or length.strip() in (b"", b"0"):
            await self.app(scope, receive, send)  # no body
            return
        if not length.strip().isdigit() or int(length) > self.limit:
            await _refuse(send, 413, self._too_large(), PayloadTooLargeError.__name__)
            return
        try:
            actor_for(self.tokens, _header(headers, b"authorization"))
        except AuthenticationError as exc:
            await _refuse(send, 401, str(exc), AuthenticationError.__name__, _BEARER)
            return
        body = await self._read(receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive, send: Send) -> bytes | None:
        """The body, counted as it arrives; None once refused (or the client went)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _refuse(send, 413, self._too_large(), PayloadTooLargeError.__name__)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        shape = json_shape(body)
        if shape is not None and (shape[0] > MAX_VALUES or shape[1] > MAX_DEPTH):
            said = (
                f"the body holds more than {MAX_VALUES} JSON values or nests deeper than "
                f"{MAX_DEPTH}: no request needs that"
            )
            await _refuse(send, 413, said, PayloadTooLargeError.__name__)
            return None
        return body

    def _too_large(self) -> str:
        return f"the body is larger than {self.limit} bytes"


# What a JSON body may hold: far more than any request of the API needs.
MAX_VALUES = 10_000
MAX_DEPTH = 32
_TOKEN = re.compile(rb'"[^"]*"|[,:\[\]{}]')
_OPENS = re.compile(rb"\s*[\[{]")
_BEARER = [(b"www-authenticate", b"Bearer")]


def json_shape(body: bytes) -> tuple[int, int] | None:
    """(how many values, how deep) a JSON document holds, counted without parsing it or
    copying more than its escapes out: a scan (in C) from one string or separator to the
    next, which stops once either bound is passed. None for a body that is not a JSON
    object or array (the app refuses it)."""
    if not _OPENS.match(body):
        return None
    if b"\\" in body:  # escapes first: then a string is `"` to the next `"`
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    values, depth, deepest = 1, 0, 0
    for seen, found in enumerate(_TOKEN.finditer(body)):
        char = body[found.start()]
        if char == 0x22:  # a string, skipped whole
            if seen > 4 * MAX_VALUES:  # strings with no separator between: not JSON
                return seen, deepest
        elif char in b",:":
            values += 1
            if values > MAX_VALUES:
                break
        elif char in b"{[":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
        else:
            depth -= 1
    return values, deepest


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read already, then what the client sends next
    (its disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(
    send: Send,
    status: int,
    message: str,
    kind: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps({"error": message, "type": kind}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    # A body left unread (or half read) cannot be told from the next request: the
    # connection ends with the answer.
    headers += [(b"connection", b"close"), *(extra or ()), *SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
