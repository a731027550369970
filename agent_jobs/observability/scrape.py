"""The metrics port and what a scrape reads (agent_jobs/observability/metrics.py turns them on).

The port answers `GET /metrics`, behind `Authorization: Bearer <AGENT_JOBS_METRICS_TOKEN>`
when the token is set. `agent_jobs_approvals_pending` is counted in Postgres at each
scrape. A prefork worker's pool processes count in files of a directory of their own
(prometheus_client's multiprocess mode); the files of a process that died are folded into
one archive file per kind at the next scrape, so what it counted stays counted and the
directory holds a file per live process.
"""

from __future__ import annotations

import contextlib
import glob
import hmac
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from ipaddress import ip_address
from typing import TYPE_CHECKING, Any

from ..processes import alive
from ..settings import Settings

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from ..store import Store

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> tuple[str, bool]:
    """Where a prefork worker's processes count: `PROMETHEUS_MULTIPROC_DIR` if set, else a
    new temporary directory; and whether it is ours to remove when the worker stops."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        return given, False
    return tempfile.mkdtemp(prefix="agent-jobs-metrics-"), True


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ip_address(addr).is_loopback
    except ValueError:
        return False


Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def wsgi_app(collector: Any, token: str | None) -> Wsgi:
    """prometheus_client's WSGI app for `collector` at `/metrics`, behind the bearer token
    if one is set."""
    from prometheus_client import make_wsgi_app

    metrics_app: Wsgi = make_wsgi_app(collector)
    expected = f"Bearer {token}".encode() if token else None

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if expected is not None:
            given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
            if not hmac.compare_digest(given, expected):
                start_response(
                    "401 Unauthorized",
                    [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")],
                )
                return [b"a bearer token is needed (AGENT_JOBS_METRICS_TOKEN)\n"]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"metrics are at /metrics\n"]
        return metrics_app(environ, start_response)

    return app


def make_server(addr: str, port: int, app: Wsgi) -> WSGIServer:
    from socketserver import ThreadingMixIn
    from wsgiref import simple_server

    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingMixIn, simple_server.WSGIServer):
        address_family = family
        daemon_threads = True

    class Quiet(simple_server.WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes are not logged."""

    return simple_server.make_server(addr, port, app, Server, handler_class=Quiet)


class PendingApprovals:
    """`agent_jobs_approvals_pending`: counted in Postgres at each scrape."""

    def __init__(self, settings: Settings, store: Store | None) -> None:
        self.url = settings.database_url
        self.store = store
        self.own: Store | None = None
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # A child must not close the parent's connections (it would end them for both).
        if self.own is not None:
            self.own.engine.dispose(close=False)
            self.own = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from ..store import Store
        from ..store import runs as run_rows
        from ..store.db import make_engine

        try:
            store = self.store
            if store is None:
                if self.own is None:
                    self.own = Store(make_engine(self.url, pool_size=1))
                store = self.own
            with store.connect() as conn:
                pending = run_rows.pending_approvals(conn)
        except Exception as exc:  # a scrape must not fail for it; the gauge is left out
            log.warning("could not count the pending approvals: %s", exc)
            return
        yield GaugeMetricFamily(
            "agent_jobs_approvals_pending", "Calls waiting for a decision now", value=pending
        )


class ProcessFiles:
    """Every process's counts in the multiprocess directory; a dead process's files are
    first folded into the archive files, under the lock, so nothing is counted twice."""

    def __init__(self, path: str) -> None:
        from prometheus_client import multiprocess

        collector: Any = multiprocess.MultiProcessCollector  # untyped

        self.path = path
        self.collector = collector(None, path)
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self.lock:
            fold_dead(self.path)
            yield from self.collector.collect()


def prepare_dir(path: str) -> None:
    """Empty the directory of earlier processes' files (their worker has stopped)."""
    os.makedirs(path, exist_ok=True)
    for name in glob.glob(os.path.join(path, "*.db")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def fold_dead(path: str) -> None:
    """Fold the counter and histogram files of processes that no longer run into
    `<kind>_archive.db`, then remove them."""
    from prometheus_client import mmap_dict

    files: Any = mmap_dict.MmapedDict  # untyped

    for kind in ("counter", "histogram"):
        dead = [
            name
            for name in glob.glob(os.path.join(path, f"{kind}_*.db"))
            if (pid := os.path.basename(name)[len(kind) + 1 : -3]).isdigit() and not alive(int(pid))
        ]
        if not dead:
            continue
        archive = files(os.path.join(path, f"{kind}_archive.db"))
        try:
            for name in dead:
                for key, value, _timestamp, _pos in files.read_all_values_from_file(name):
                    if value:
                        was, _ = archive.read_value(key)
                        archive.write_value(key, was + value, 0.0)
                os.remove(name)
        finally:
            archive.close()
