"""What every answer of the server carries, and the largest body it reads.

Plain ASGI (not Starlette's `BaseHTTPMiddleware`): event streams pass through untouched.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import PayloadTooLargeError

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
    """Refuses a body larger than `limit` (413) before reading it. The size must be
    declared (`Content-Length`): a chunked body, whose size is known only once it has
    been read, is refused (411)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers", []))
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.limit:
                message = f"the body is larger than {self.limit} bytes"
                await _refuse(send, 413, message, PayloadTooLargeError.__name__)
                return
            if length is None and b"transfer-encoding" in headers:
                message = "send the body with a Content-Length header, not in chunks"
                await _refuse(send, 411, message, "LengthRequiredError")
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, message: str, kind: str) -> None:
    body = json.dumps({"error": message, "type": kind}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += SECURITY_HEADERS
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
