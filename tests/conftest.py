"""Shared fixtures: real Postgres and Redis (a missing service fails, never skips)."""

from __future__ import annotations

import os

# A transaction that takes row locks out of their order fails loudly here, in this
# process and in the processes the tests start (agent_jobs/store/locks.py).
os.environ["AGENT_JOBS_LOCK_ORDER"] = "strict"

from tests.support import encryption as test_encryption

# AGENT_JOBS_TEST_ENCRYPTION=1: every store of the suite seals its payloads.
os.environ.update(test_encryption.env())

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from agent_jobs.store import Store
from tests.support import distribution, layers, leaks, reproduce
from tests.support.redis_server import RedisServer
from tests.support.services import (
    SESSION_QUEUE,
    dispose,
    finish_inline,
    own_database,
    truncate_all,
)
from tests.support.workers import TEST_POOLS, use_pool


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database for this test session, migrated to the newest schema."""
    from tests.support.apps.base import create_side_table

    with own_database("agent_jobs_test") as url:
        engine = create_engine(url)  # where the test apps' side engine looks: `public`
        create_side_table(engine)  # before any worker races to
        engine.dispose()
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agent_jobs.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs on both databases."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent_jobs.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.from_url(db_url, auto_upgrade=True)
    truncate_all(s)
    yield s
    s.engine.dispose()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A `redis-server` of this test session's own: the tests flush and restart only
    what they started, never the machine's Redis."""
    try:
        server = RedisServer().start()
    except Exception as exc:  # a missing service is a failure, never a skip
        pytest.fail(f"the tests need redis-server: {exc}")
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url(0)


# --- both runners -------------------------------------------------------------------------

DURABLE_BROKER_DB = 1


@pytest.fixture(scope="session")
def durable_broker(redis_url: str) -> str:
    import redis

    url = redis_url.rsplit("/", 1)[0] + f"/{DURABLE_BROKER_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


def _queue_of(pool: str) -> str:
    """The shared workers' queue: each pool's workers read their own."""
    return SESSION_QUEUE if pool == TEST_POOLS[0] else f"{SESSION_QUEUE}_{pool}"


@pytest.fixture(scope="session")
def shared_workers(pg_url: str, durable_broker: str) -> Iterator[Callable[[str], object]]:
    """Eight worker processes on a pool, shared by the durable scenario tests: started
    when a test first needs them, and kept for the session."""
    from tests.support.workers import Process, service_env, start_worker

    started: dict[str, Process] = {}

    def on(pool: str) -> Process:
        if pool not in started:
            env = service_env(durable_broker, pg_url, AGENT_JOBS_QUEUE=_queue_of(pool))
            started[pool] = start_worker(env, concurrency=8, name=f"shared-{pool}", pool=pool)
        return started[pool]

    yield on
    for proc in started.values():
        proc.stop()


def _truncate(url: str) -> None:
    store = Store.from_url(url)
    truncate_all(store)
    store.engine.dispose()


@contextmanager
def _harness(kind: str, request: pytest.FixtureRequest, pg_url: str) -> Iterator[object]:
    from agent_jobs import InlineRunner
    from agent_jobs.client import Client
    from agent_jobs.dispatch import CeleryDispatcher, celery_client
    from agent_jobs.settings import Settings
    from agent_jobs.streams.redis_streams import RedisStreams
    from tests.support import apps
    from tests.support.harness import DurableHarness, InlineHarness
    from tests.support.local_worker import local_runner

    store = Store.from_url(pg_url)
    try:
        if kind == "inline":
            runner = InlineRunner(apps.app, store, settings=Settings(), poll_interval=0.05)
            try:
                yield InlineHarness(runner)
            finally:
                finish_inline(runner)
            return
        if kind == "durable-local":
            local_url = str(request.getfixturevalue("redis_url")).rsplit("/", 1)[0] + "/2"
            settings = Settings(database_url=pg_url)
            _, dispatcher, local_streams = local_runner(apps.app, store, local_url, settings)
            try:
                made = DurableHarness(Client(store, apps.app, settings, dispatcher), local_streams)
                made.local = dispatcher
                yield made
            finally:
                dispatcher.close()
                local_streams.client.close()
            assert not dispatcher.errors, f"a durable-local task raised: {dispatcher.errors!r}"
            return
        broker = request.getfixturevalue("durable_broker")
        pool = kind.partition("-")[2] or TEST_POOLS[0]
        request.getfixturevalue("shared_workers")(pool)
        queue = _queue_of(pool)
        celery = celery_client(broker, queue)
        settings = Settings(broker_url=broker, database_url=pg_url, queue=queue)
        client = Client(store, apps.app, settings, CeleryDispatcher(celery))
        streams = RedisStreams.from_url(broker)
        try:
            yield DurableHarness(client, streams)
        finally:
            streams.client.close()
            celery.close()
    finally:
        dispose(store)


# The inline runner; the durable runner driven in this process ("durable-local", the
# services layer: tests/support/local_worker.py); and the durable runner on real workers
# of each pool the tests run on ("durable" is the first's).
HARNESSES = [
    "inline",
    "durable-local",
    "durable",
    *(f"durable-{pool}" for pool in TEST_POOLS[1:]),
]


@pytest.fixture(params=HARNESSES)
def harness(
    request: pytest.FixtureRequest, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[object]:
    """The same scenarios on the inline runner and on the durable one (in this process,
    and on real workers)."""
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    _truncate(pg_url)
    with _harness(request.param, request, pg_url) as made:
        yield made


@pytest.fixture
def both_harnesses(
    request: pytest.FixtureRequest, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[object, object]]:
    """The inline runner and the durable one side by side, on one database."""
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    _truncate(pg_url)
    with (
        _harness("inline", request, pg_url) as inline,
        _harness("durable", request, pg_url) as durable,
    ):
        yield inline, durable


@pytest.fixture(params=TEST_POOLS)
def worker_pool(request: pytest.FixtureRequest) -> Iterator[str]:
    """The pool of the workers a test starts without naming one: each such test runs on
    every pool of `TEST_POOLS`."""
    use_pool(request.param)
    yield request.param
    use_pool(TEST_POOLS[0])


def pytest_configure(config: pytest.Config) -> None:
    layers.install()
    leaks.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that names its workers' pools runs once, on the first pool's parameter; every
    test gets its layer (tests/support/layers.py); with xdist, the tests sharing a module's
    fixtures run in one process."""
    for item in list(items):
        spec = getattr(item, "callspec", None)
        pool = spec.params.get("worker_pool") if spec is not None else None
        if pool not in (None, TEST_POOLS[0]) and item.get_closest_marker("pools_named"):
            items.remove(item)
    layers.assign(items)
    distribution.group(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield from layers.watch(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    if report.when == "call" and report.passed and (reached := layers.verdict(item)):
        report.outcome = "failed"
        report.longrepr = reached
    return report


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    reproduce.summary(terminalreporter, config)


@pytest.fixture
def cluster(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker_pool: str
) -> Iterator[object]:
    """Workers and beat of the test's own, on a `redis-server` of its own: crash tests
    kill the workers, flush the broker and restart it. It runs on each pool."""
    from tests.support.cluster import Cluster

    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    server = RedisServer().start()
    try:  # a cluster that fails to come up leaves no redis-server behind
        c = Cluster(server, pg_url, tmp_path)
        try:
            yield c
        finally:
            c.close()
    finally:
        server.close()
