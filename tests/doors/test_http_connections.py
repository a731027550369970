"""What a connection may hold of `agent-jobs serve` (agent_jobs/http/connections.py):
a request's headers have a deadline, connections past the cap are answered 503 at once,
and an error the event loop repeats is logged once a while. Against a real server: 1,100
connections that never finished their headers once took it down."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from agent_jobs.http.connections import QuietRepeats
from tests.doors.test_http_serve import plain_env
from tests.support.serve import TOKENS_JSON, ApiServer
from tests.support.waiting import TIMEOUT, eventually

UNFINISHED = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Never: "  # no end of headers


@contextmanager
def serve(tmp: Path, name: str, **settings: str) -> Iterator[ApiServer]:
    """`agent-jobs serve` on the embedded default with `settings`, stopped at the end."""
    env = plain_env(tmp, AGENT_JOBS_API_TOKENS=TOKENS_JSON, **settings)
    server = ApiServer(env, name).start()
    try:
        yield server
    finally:
        server.proc.stop()


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def unfinished(server: ApiServer, stack: ExitStack) -> socket.socket:
    """A connection that sends the start of a request's headers, and never the rest."""
    conn = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
    conn.settimeout(TIMEOUT)
    conn.sendall(UNFINISHED)
    return conn


def answer(conn: socket.socket) -> bytes:
    """Everything the server sends on `conn` until it closes it."""
    got = b""
    while chunk := conn.recv(65536):
        got += chunk
    return got


def test_past_the_cap_a_connection_is_answered_503_at_once(
    tmp_path: Path, sockets: ExitStack
) -> None:
    # A deadline far off: the cap alone decides.
    with serve(tmp_path, "serve-cap", AGENT_JOBS_API_MAX_CONNECTIONS="20") as server:
        held = [unfinished(server, sockets) for _ in range(20)]
        for _ in range(5):
            said = answer(unfinished(server, sockets))
            head, _, body = said.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), said
            assert json.loads(body)["type"] == "ServiceUnavailableError"
        for conn in held:  # their clients give up: the slots are free again
            conn.close()
        eventually(server.healthy, what="/healthz to answer once the slots are free")


def test_a_connection_that_never_finishes_its_headers_is_closed_at_its_deadline(
    tmp_path: Path, sockets: ExitStack
) -> None:
    with serve(tmp_path, "serve-deadline", AGENT_JOBS_API_HEADER_TIMEOUT="1") as server:
        slow = [unfinished(server, sockets) for _ in range(5)]
        # A kept-alive connection whose second request never finishes its headers.
        kept = sockets.enter_context(socket.create_connection(("127.0.0.1", server.port)))
        kept.settimeout(TIMEOUT)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b'{"ok":true}' not in first:
            first += kept.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        kept.sendall(UNFINISHED)
        for conn in [*slow, kept]:
            assert answer(conn) == b""  # closed by the server, with nothing said
        assert server.healthy()


def test_an_error_the_loop_repeats_is_logged_once_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As `accept()` fails again and again once the process is out of file descriptors."""
    handler = QuietRepeats(every=3600)
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR):
            for _ in range(1000):
                handler(
                    loop,
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    },
                )
            handler(loop, {"message": "something else"})
        said = [r.getMessage() for r in caplog.records]
        assert said == ["socket.accept() out of system resource", "something else"]
        handler.every = 0  # the window has passed: the next one says how many it kept
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            handler(loop, {"message": "socket.accept() out of system resource"})
        assert caplog.records[0].getMessage() == (
            "socket.accept() out of system resource: 999 more times since it was last reported"
        )
    finally:
        loop.close()


def test_one_token_holds_at_most_its_share_of_the_event_streams(tmp_path: Path) -> None:
    with (
        serve(tmp_path, "serve-streams", AGENT_JOBS_API_MAX_STREAMS="4") as server,
        ExitStack() as open_streams,
    ):

        def stream(actor: str) -> httpx.Response:
            client = open_streams.enter_context(server.client(actor))
            asked = client.build_request("GET", "/v1/approvals/stream")
            reply = client.send(asked, stream=True)
            open_streams.callback(reply.close)
            return reply

        assert [stream("eve").status_code for _ in range(2)] == [200, 200]
        refused = stream("eve")  # a third: past eve's share, half of the four
        assert refused.status_code == 503
        refused.read()
        assert "its share" in refused.json()["error"]
        assert [stream("alice").status_code for _ in range(2)] == [200, 200]
        everyone = stream("carol")  # all four taken
        everyone.read()
        assert everyone.status_code == 503 and "4 event streams" in everyone.json()["error"]


def test_without_a_broker_an_actor_has_a_bounded_number_of_runs_going(tmp_path: Path) -> None:
    """Each run `serve` drives holds a thread until it ends, one parked on a person too:
    300 parked runs once held 302 threads."""
    with (
        serve(tmp_path, "serve-runs", AGENT_JOBS_API_INLINE_RUNS_PER_ACTOR="3") as server,
        server.client("user-7") as user,
        server.client("bob") as bob,
    ):
        body = {"agent": "support", "input": "refund it"}
        parked = [user.post("/v1/runs", json=body).json()["run_id"] for _ in range(3)]
        for run_id in parked:
            eventually(
                lambda run_id=run_id: (
                    user.get(f"/v1/runs/{run_id}").json()["status"] == "awaiting_approval"
                ),
                what=f"{run_id} to wait for its approval",
            )
        refused = user.post("/v1/runs", json=body)
        assert refused.status_code == 429, refused.text
        assert refused.json()["type"] == "TooManyRunsError"
        assert "has 3 runs going" in refused.json()["error"]
        assert bob.post("/v1/runs", json=body).status_code == 201  # a share each
        assert user.post(f"/v1/runs/{parked[0]}/cancel", json={}).status_code == 202
        eventually(
            lambda: user.get(f"/v1/runs/{parked[0]}").json()["status"] == "cancelled",
            what="the cancelled run to end",
        )
        assert user.post("/v1/runs", json=body).status_code == 201


def test_serve_traces_runs_not_requests_and_no_health_probe(tmp_path: Path) -> None:
    """A health probe makes no trace, and a run asked for with no trace context is a
    root `run` of its own (the guide's promise), whatever else the server does."""
    with serve(
        tmp_path, "serve-traces", AGENT_JOBS_OTEL="1", OTEL_TRACES_EXPORTER="console"
    ) as server:
        for _ in range(5):
            assert server.healthy()
        with server.client("user-7") as client:
            started = client.post("/v1/runs", json={"agent": "chat", "input": "hi"})
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
        spans = lambda: server.proc.log()  # noqa: E731 (console exporter: JSON per span)
        eventually(lambda: f'"agent_jobs.run_id": "{run_id}"' in spans(), what="the run's spans")
        said = spans()
        names = re.findall(r'^    "name": "([^"]+)"', said, re.M)  # each span's, not its events'
        assert "run" in names and not [n for n in names if "/" in n or "healthz" in n], names
        roots = re.findall(r'"name": "run",.*?"parent_id": (\w+)', said, re.S)
        assert roots == ["null"], said[-3000:]
