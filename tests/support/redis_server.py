"""A `redis-server` of the tests' own: started, stopped and restarted at will.

The tests never touch a Redis they did not start: a developer's own data on the
machine's Redis is safe from every FLUSHDB, FLUSHALL and restart here.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import redis

from tests.support.waiting import eventually


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One `redis-server` on a port of its own, keeping nothing on disk."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("the tests need `redis-server` on PATH (Debian: redis-server)")
        self.port = port or free_port()
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix=f"redis-{self.port}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float | None = None) -> RedisServer:
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        proc = self.proc
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                if proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited: {self.log()}") from None
                return False

        try:
            eventually(up, timeout, what=f"redis-server on port {self.port} to answer")
            return self
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server at once; it keeps nothing, so a restart comes back empty."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)
