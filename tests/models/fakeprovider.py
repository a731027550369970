"""A local HTTP server that speaks the providers' streaming protocols, for the adapter tests.

Each request takes the next scripted `Reply`: a stream of SSE pieces (each flushed as
one HTTP/1.1 chunk), an error answer, a stall or a connection cut mid-stream. It
listens on 127.0.0.1 only and records every request it got.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_jobs.messages import Message, ModelRequest, ModelSettings, ToolSpec


@dataclass
class Gate:
    """A point in a stream where the server waits until the test opens it."""

    opened: threading.Event = field(default_factory=threading.Event)
    timeout: float = 5.0


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes | Gate] = field(default_factory=list)
    body: bytes | None = None  # a whole body (error answers) instead of a stream
    drop: bool = False  # cut the connection after the chunks, before the body ends
    stall: float = 0.0  # seconds to wait before answering at all
    stall_after_chunks: float = 0.0  # seconds to wait after the chunks, body unfinished


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


def openai_stream(chunks: Iterable[dict[str, Any]], *, done: bool = True) -> list[bytes | Gate]:
    """Chat Completions SSE: one `data:` line per chunk, then `data: [DONE]`."""
    pieces: list[bytes | Gate] = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
    if done:
        pieces.append(b"data: [DONE]\n\n")
    return pieces


def anthropic_stream(events: Iterable[dict[str, Any]]) -> list[bytes | Gate]:
    """Messages API SSE: `event:` and `data:` lines per event."""
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]


def json_error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    """An error answer with a JSON body."""
    return Reply(status=status, headers=headers or {}, body=json.dumps(body).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handlers: nothing outlives the test
    block_on_close = True

    def __init__(self, provider: FakeProvider) -> None:
        self.provider = provider
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (a timeout test) makes our writes fail; that is expected.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        provider = self.server.provider
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        provider.record(
            Recorded(
                method="POST",
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )
        reply = provider.next_reply()
        if reply.stall and provider.stopping.wait(reply.stall):
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Connection", "close")
        if reply.body is not None:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in reply.chunks:
            if isinstance(piece, Gate):
                if not piece.opened.wait(piece.timeout):
                    provider.gate_timeouts += 1
                continue
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        if reply.stall_after_chunks:
            provider.stopping.wait(reply.stall_after_chunks)
            self.close_connection = True
            return
        if reply.drop:
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")


class FakeProvider:
    """The server: start it, script replies, read what it was sent, stop it."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.gate_timeouts = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake provider is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)

    def next_reply(self) -> Reply:
        with self._lock:
            if self.replies:
                return self.replies.popleft()
        return json_error(500, {"error": {"message": "the test scripted no reply"}})

    @property
    def last_body(self) -> Any:
        return self.requests[-1].body

    def start(self) -> FakeProvider:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- helpers of the adapter tests ---------------------------------------------------

API_KEY = "sk-test-5e5e5e5e5e5e5e5e5e5e5e5e"


class RecordingSink:
    """Keeps every delta and can call back on the first one."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.deltas: list[str] = []
        self.on_first = on_first

    def text(self, delta: str) -> None:
        self.deltas.append(delta)
        if len(self.deltas) == 1 and self.on_first is not None:
            self.on_first()


def make_request(
    messages: list[Message] | None = None,
    *,
    tools: list[ToolSpec] | None = None,
    settings: ModelSettings | None = None,
    system: str = "You are a support agent.",
) -> ModelRequest:
    """A model request with a one-line user question unless told otherwise."""
    return ModelRequest(
        run_id="run-1",
        agent="support",
        step=0,
        system=system,
        messages=messages or [Message(role="user", content="Where is order 42?")],
        tools=tools or [],
        settings=settings or ModelSettings(),
    )
