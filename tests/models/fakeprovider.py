"""A local HTTP server that speaks the providers' streaming protocols, for the adapter tests.

Each request takes the next scripted `Reply`: a stream of SSE pieces (each flushed as
one HTTP/1.1 chunk), an error answer, a stall or a connection cut mid-stream. It
listens on 127.0.0.1 only and records every request it got.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_jobs.messages import Message, ModelRequest, ModelSettings, ToolSpec
from tests.support.waiting import TIMEOUT


@dataclass
class Gate:
    """A point in a stream where the server waits until the test opens it."""

    opened: threading.Event = field(default_factory=threading.Event)
    timeout: float = TIMEOUT  # a guard against a hang: a gate that times out fails its test
    reached: threading.Event = field(default_factory=threading.Event)  # the server waits here


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
    interval: float = 0.0  # seconds between two pieces, as a model streams its tokens


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    # `time.perf_counter()` as the first chunk of a streamed body was about to go out
    # (the benchmark's "first byte").
    first_chunk_at: float | None = None


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
        recorded = Recorded(
            method="POST",
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        provider.record(recorded)
        reply = provider.next_reply(recorded)
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
        for n, piece in enumerate(reply.chunks):
            if n and reply.interval and provider.stopping.wait(reply.interval):
                self.close_connection = True
                return
            if isinstance(piece, Gate):
                piece.reached.set()
                if not piece.opened.wait(piece.timeout):
                    provider.gate_timeouts += 1
                continue
            if recorded.first_chunk_at is None:
                recorded.first_chunk_at = time.perf_counter()
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
    """The server: start it, script replies, read what it was sent, stop it.

    Scripted replies are served first come, first served; when none is left,
    `responder` (if given) makes the reply from the request.
    """

    def __init__(self, responder: Callable[[Recorded], Reply] | None = None) -> None:
        self.responder = responder
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

    def next_reply(self, request: Recorded | None = None) -> Reply:
        with self._lock:
            if self.replies:
                return self.replies.popleft()
        if self.responder is not None and request is not None:
            return self.responder(request)
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


@dataclass(frozen=True)
class ArgsPiece:
    """A piece of a tool call's arguments, as a sink was handed it."""

    call_id: str
    name: str
    args_delta: str
    index: int
    offset: int


class RecordingSink:
    """Keeps every delta (text and tool-call arguments, each in order and both in
    `events`) and can call back on the first text delta or the first arguments piece."""

    def __init__(
        self,
        on_first: Callable[[], None] | None = None,
        *,
        on_first_args: Callable[[], None] | None = None,
    ) -> None:
        self.deltas: list[str] = []
        self.args: list[ArgsPiece] = []
        self.events: list[str | ArgsPiece] = []
        self.on_first = on_first
        self.on_first_args = on_first_args

    def text(self, delta: str) -> None:
        self.deltas.append(delta)
        self.events.append(delta)
        if len(self.deltas) == 1 and self.on_first is not None:
            self.on_first()

    def tool_call_delta(
        self, call_id: str, name: str, args_delta: str, *, index: int, offset: int
    ) -> None:
        piece = ArgsPiece(call_id, name, args_delta, index, offset)
        self.args.append(piece)
        self.events.append(piece)
        if len(self.args) == 1 and self.on_first_args is not None:
            self.on_first_args()

    def written(self) -> dict[str, str]:
        """Each call's arguments text as its pieces add up, checking that each piece
        starts where the one before it ended."""
        texts: dict[str, str] = {}
        for piece in self.args:
            so_far = texts.get(piece.call_id, "")
            assert piece.offset == len(so_far), (piece, so_far)
            texts[piece.call_id] = so_far + piece.args_delta
        return texts


class TextOnlySink:
    """A sink written before tool-call arguments streamed: text only."""

    def __init__(self) -> None:
        self.deltas: list[str] = []

    def text(self, delta: str) -> None:
        self.deltas.append(delta)


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


# --- whole replies, as the end-to-end tests and the benchmark script them -------------

# A tool call as a reply asks for it: (call id, tool name, arguments).
CallSpec = tuple[str, str, dict[str, Any]]


def _halves(text: str) -> tuple[str, str]:
    middle = max(1, len(text) // 2)
    return text[:middle], text[middle:]


def openai_reply(
    texts: Iterable[str],
    calls: Iterable[CallSpec] = (),
    *,
    prompt_tokens: int = 100,
    completion_tokens: int = 20,
    model: str = "gpt-4.1-mini-2025-04-14",
    headers: dict[str, str] | None = None,
) -> Reply:
    """A streamed Chat Completions reply: text pieces (one chunk each, the first with the
    role), then the tool calls, each call's arguments split in two and the calls
    interleaved, then the finish and a usage chunk."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-e2e",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = []
    for i, text in enumerate(texts):
        delta: dict[str, Any] = {"role": "assistant"} if i == 0 else {}
        chunks.append(chunk({**delta, "content": text}))
    specs = list(calls)
    halves = [_halves(json.dumps(args)) for _, _, args in specs]
    for index, (call_id, name, _) in enumerate(specs):
        head = {"index": index, "id": call_id, "type": "function"}
        function = {"name": name, "arguments": halves[index][0]}
        chunks.append(chunk({"tool_calls": [{**head, "function": function}]}))
    for index in range(len(specs)):
        tail = {"index": index, "function": {"arguments": halves[index][1]}}
        chunks.append(chunk({"tool_calls": [tail]}))
    chunks.append(chunk({}, "tool_calls" if specs else "stop"))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    chunks.append({**chunk({}), "choices": [], "usage": usage})
    return Reply(headers=dict(headers or {}), chunks=openai_stream(chunks))


def anthropic_reply(
    texts: Iterable[str],
    calls: Iterable[CallSpec] = (),
    *,
    input_tokens: int = 100,
    output_tokens: int = 20,
    model: str = "claude-haiku-4-5-20251001",
    headers: dict[str, str] | None = None,
    head: int = 1,
    cache_read: int | None = None,
    cache_write: int | None = None,
) -> Reply:
    """A streamed Messages reply: a text block (one delta per piece), then one tool_use
    block per call with its input JSON split in two, then the stop and the usage.
    `cache_read` and `cache_write`, when given, are the prompt-cache tokens the message's
    start reports (`cache_read_input_tokens`, `cache_creation_input_tokens`), billed
    apart from `input_tokens` as the API does.

    `head` is how many leading events go out as one chunk: 3 sends the message start,
    the text block start and the first text delta together, as a provider often does.
    """
    message: dict[str, Any] = {
        "id": "msg_e2e",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    if cache_read is not None:
        message["usage"]["cache_read_input_tokens"] = cache_read
    if cache_write is not None:
        message["usage"]["cache_creation_input_tokens"] = cache_write
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    pieces = list(texts)
    index = 0
    if pieces:
        text_block = {"type": "text", "text": ""}
        events.append({"type": "content_block_start", "index": 0, "content_block": text_block})
        for text in pieces:
            delta = {"type": "text_delta", "text": text}
            events.append({"type": "content_block_delta", "index": 0, "delta": delta})
        events.append({"type": "content_block_stop", "index": 0})
        index = 1
    specs = list(calls)
    for call_id, name, args in specs:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        for part in _halves(json.dumps(args)):
            delta = {"type": "input_json_delta", "partial_json": part}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    stop = {"stop_reason": "tool_use" if specs else "end_turn", "stop_sequence": None}
    events.append(
        {"type": "message_delta", "delta": stop, "usage": {"output_tokens": output_tokens}}
    )
    events.append({"type": "message_stop"})
    chunks = anthropic_stream(events)
    if head > 1:
        chunks = [b"".join(p for p in chunks[:head] if isinstance(p, bytes)), *chunks[head:]]
    return Reply(headers=dict(headers or {}), chunks=chunks)
