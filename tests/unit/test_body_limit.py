"""What a request body may cost, judged before the app reads it
(agent_jobs/http/middleware.py `BodyLimit`), driven as ASGI in this process. The same
refusals against a real `agent-jobs serve`: tests/doors/test_http_api.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agent_jobs.http.auth import TokenTable
from agent_jobs.http.middleware import MAX_DEPTH, MAX_VALUES, BodyLimit, json_shape

TOKEN = "t" * 32
LIMIT = 1000


class Recorder:
    """The app behind the limit: what it was given to read, if it was called, and how
    many of the client's messages were taken in all (`taken`)."""

    def __init__(self) -> None:
        self.read: bytes | None = None
        self.taken = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.read = body
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def call(headers: dict[str, str], chunks: list[bytes]) -> tuple[int, dict[str, Any], Recorder]:
    """(status, answer, the app) for a POST with `headers` whose body arrives as
    `chunks`."""
    app = Recorder()
    limited = BodyLimit(app, TokenTable({TOKEN: "alice"}), limit=LIMIT)
    pending = [
        {"type": "http.request", "body": c, "more_body": n < len(chunks) - 1}
        for n, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/runs",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(limited(scope, receive, send))
    app.taken = len(chunks) - len(pending)
    body = json.loads(sent[1]["body"]) if sent[0]["status"] != 201 else {}
    return sent[0]["status"], body, app


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_the_bytes_that_arrive_are_counted_whatever_the_length_says() -> None:
    # A length under the limit, and more bytes than it says (as a server that trusted
    # the header would read them): refused once the count passes the limit.
    status, said, app = call({**AUTH, "Content-Length": "5"}, [b"x" * 600] * 5)
    assert status == 413 and said["type"] == "PayloadTooLargeError"
    assert app.read is None and app.taken == 2


def test_a_body_within_the_limit_reaches_the_app_as_it_was_sent() -> None:
    sent = [b'{"agent": "chat", ', b'"input": "hi"}']
    status, _, app = call({**AUTH, "Content-Length": str(len(b"".join(sent)))}, sent)
    assert status == 201 and app.read == b"".join(sent)


@pytest.mark.parametrize(
    ("headers", "status", "kind"),
    [
        ({"Content-Length": "10"}, 401, "AuthenticationError"),
        ({"Content-Length": "10", "Authorization": "Bearer nope"}, 401, "AuthenticationError"),
        ({**AUTH, "Content-Length": "5", "Transfer-Encoding": "chunked"}, 400, "BadRequestError"),
        ({**AUTH, "Transfer-Encoding": "chunked"}, 411, "LengthRequiredError"),
        ({**AUTH, "Content-Length": str(LIMIT + 1)}, 413, "PayloadTooLargeError"),
        ({**AUTH, "Content-Length": "ten"}, 413, "PayloadTooLargeError"),
    ],
    ids=["no-token", "unknown-token", "length-and-chunks", "chunks", "too-long", "not-a-length"],
)
def test_refused_before_a_byte_of_the_body_is_read(
    headers: dict[str, str], status: int, kind: str
) -> None:
    got, said, app = call(headers, [b"{}" * 5])
    assert (got, said["type"]) == (status, kind)
    assert app.read is None and app.taken == 0


def test_the_shape_of_a_json_body_is_counted_without_parsing_it() -> None:
    tricky = {"a": 'x,:[{\\"', "b": [1, 2, {"c": []}], "d": "\\\\"}
    assert json_shape(json.dumps(tricky).encode()) == (9, 4)
    assert json_shape(b'"a string"') is None and json_shape(b"not json") is None
    wide = json.dumps({f"k{n}": 0 for n in range(MAX_VALUES + 1)}).encode()
    assert json_shape(wide)[0] > MAX_VALUES  # type: ignore[index]
    deep = b"[" * (MAX_DEPTH + 5) + b"]" * (MAX_DEPTH + 5)
    assert json_shape(deep)[1] > MAX_DEPTH  # type: ignore[index]
    status, said, _ = call({**AUTH, "Content-Length": str(len(deep))}, [deep])
    assert status == 413 and "nests deeper" in said["error"]
