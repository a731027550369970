"""Helpers for the HTTP API's tests: the server as a subprocess, tokens, an event-stream
reader, a TCP proxy that can cut the server off its database."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.doors import Doors, open_doors, wait_for
from tests.support.redis_server import free_port
from tests.support.workers import Process

ACTORS = ("user-7", "bob", "alice", "carol", "eve", "backend", "olga")
# A token per actor, fresh for each test session: they must never show in a log.
TOKENS = {actor: f"tok-{actor}-{uuid.uuid4().hex}" for actor in ACTORS}
TOKENS_JSON = json.dumps({token: actor for actor, token in TOKENS.items()})


def api_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """`env` with the test app, the tokens and quick keep-alives."""
    return {
        **env,
        "AGENT_JOBS_APP": "tests.support.apps.http:app",
        "AGENT_JOBS_API_TOKENS": TOKENS_JSON,
        "AGENT_JOBS_API_KEEPALIVE": "0.5",
        "AGENT_JOBS_API_INBOX_POLL": "0.2",
        **extra,
    }


class ApiServer:
    """`agent-jobs serve` (or another command) on a free port, as a user starts it."""

    def __init__(self, env: dict[str, str], name: str = "serve", args: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = args or [sys.executable, "-m", "agent_jobs.cli", "serve", "--port", str(self.port)]
        self.proc = Process([a.replace("{port}", str(self.port)) for a in argv], env, name)

    def start(self) -> ApiServer:
        self.proc.start()
        wait_for(self.healthy, "the server to answer", every=0.1)
        return self

    def healthy(self) -> bool:
        assert self.proc.running, f"the server exited:\n{self.proc.log()}"
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self, actor: str | None = None, **kwargs: Any) -> httpx.Client:
        """An HTTP client with `actor`'s token (none without an actor)."""
        headers = {"Authorization": f"Bearer {TOKENS[actor]}"} if actor else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def raw(self, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        """Send a request as bytes (its head, then `body` if any) on a connection of its
        own and read the answer to the end: (status, its body). The answer is read after
        the head is sent, so a server that answers without waiting for the body is
        seen to (one that waits for a body never sent times the read out)."""
        from tests.support.waiting import TIMEOUT

        with socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT) as conn:
            conn.sendall(head)
            if body:
                conn.sendall(body)
            answer = b""
            while b"\r\n\r\n" not in answer:
                got = conn.recv(65536)
                if not got:
                    break
                answer += got
            header, _, rest = answer.partition(b"\r\n\r\n")
            fields = dict(line.split(b":", 1) for line in header.split(b"\r\n")[1:] if b":" in line)
            length = int(fields.get(b"content-length", b"0").strip() or 0)
            while len(rest) < length:
                got = conn.recv(65536)
                if not got:
                    break
                rest += got
        return int(header.split(b" ", 2)[1]), rest

    def peak_memory(self, reset: bool = False) -> int:
        """The server's peak resident memory in bytes (`VmHWM`), since it started or since
        it was last `reset` (writing 5 to its clear_refs: root, as CI runs)."""
        if reset:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmHWM in /proc/{self.pid}/status")

    def threads(self) -> int:
        """The server process's threads, as the kernel counts them."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no thread count")

    def log(self) -> str:
        return self.proc.log()

    def stop(self) -> None:
        self.proc.stop()


def assert_error(response: httpx.Response, status: int, kind: str | None = None) -> str:
    """The refusal has `status` and the error shape; returns its message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error", "type"}, body
    assert isinstance(body["error"], str) and body["error"], body
    if kind is not None:
        assert body["type"] == kind, body
    message: str = body["error"]
    return message


@dataclass
class Event:
    """One server-sent event: an entry (`id`, `data`) or a comment (a keep-alive)."""

    id: str | None = None
    data: str | None = None
    comment: str | None = None
    name: str | None = None  # `event:`, when it has one (a frame has none)

    @property
    def frame(self) -> dict[str, Any]:
        assert self.data is not None
        value: dict[str, Any] = json.loads(self.data)
        return value


def events(response: httpx.Response) -> Iterator[Event]:
    """The events of a `text/event-stream` response, as they arrive."""
    assert response.status_code == 200, response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    current = Event()
    for line in response.iter_lines():
        if line == "":
            if current.data is not None or current.comment is not None:
                yield current
            current = Event()
        elif line.startswith(":"):
            current.comment = line[1:].strip()
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "id":
                current.id = value
            elif field == "event":
                current.name = value
            elif field == "data":
                current.data = value if current.data is None else current.data + "\n" + value


class Proxy:
    """Forwards a local port to `target`; `cut()` drops every connection and refuses new
    ones (the database is gone), `mend()` forwards again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._server: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def mend(self) -> Proxy:
        server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._server is not None:
            # A blocked accept() outlives close() alone; shutdown() wakes it (Linux).
            with suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            for s in self._open:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()
        time.sleep(0.05)


@dataclass
class Api:
    """The server, called as its users call it."""

    api: ApiServer

    def call(self, actor: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.api.client(actor) as client:
            return client.request(method, path, **kwargs)

    @contextmanager
    def stream(self, actor: str | None, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """`GET path` as an event stream, read as it comes; closed at the block's end."""
        with self.api.client(actor) as client, client.stream("GET", path, **kwargs) as reply:
            yield reply

    def start(
        self, actor: str, agent: str = "support", text: str = "refund it", **more: Any
    ) -> str:
        reply = self.call(actor, "POST", "/v1/runs", json={"agent": agent, "input": text, **more})
        assert reply.status_code == 201, reply.text
        run_id: str = reply.json()["run_id"]
        return run_id

    def pending(self, actor: str, run_id: str) -> list[dict[str, Any]]:
        """The calls of `run_id` in `actor`'s inbox."""
        reply = self.call(actor, "GET", "/v1/approvals")
        assert reply.status_code == 200, reply.text
        return [a for a in reply.json()["approvals"] if a["run_id"] == run_id]


@dataclass
class Stack(Api):
    """A durable deployment: a worker on a Redis database of its own, and the server."""

    doors: Doors

    def written(self) -> tuple[set[str], set[str]]:
        """The ids of every run and thread: what a refused start must leave as it was
        (other runs may be making progress meanwhile)."""
        snapshot = self.doors.snapshot("-")
        return {r["id"] for r in snapshot["runs"]}, set(snapshot["threads"])

    def frames(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(entry id, frame) of the run's Redis Stream, as Redis has it."""
        return [
            (entry.decode(), json.loads(fields[b"frame"]))
            for entry, fields in self.doors.redis.xrange(f"agent_jobs:stream:{run_id}")
        ]


@contextmanager
def open_stack(
    pg_url: str,
    redis_url: str,
    db: int,
    tmp: Path,
    name: str,
    *,
    app: str = "tests.support.apps.http:app",
    workers: int = 1,
    **extra_env: str,
) -> Iterator[Stack]:
    """`workers` workers and the server, all loading `app` (the HTTP API's test app, or
    one built on it)."""
    with open_doors(pg_url, redis_url, db, tmp, AGENT_JOBS_APP=app) as doors:
        for _ in range(workers):
            doors.worker()
        api = ApiServer(api_env(doors.env, AGENT_JOBS_APP=app, **extra_env), name)
        doors.procs.append(api.proc)
        api.start()
        yield Stack(api=api, doors=doors)
