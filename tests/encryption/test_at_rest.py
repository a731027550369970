"""Encryption at rest with the real thing: runs on both databases and both runners whose
raw rows hold no plaintext while every door reads them back, and a worker without the
key that fails the step naming it and stays up for other runs."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from agent_jobs import InlineRunner, RunView, encryption
from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.encryption import envelope, maintenance
from agent_jobs.encryption.keyring import keyring
from agent_jobs.settings import Settings
from agent_jobs.store import Store, payload_rows
from agent_jobs.store.payloads import Codecs
from agent_jobs.store.schema import data_keys
from tests.support import apps
from tests.support import encryption as test_encryption
from tests.support.harness import DurableHarness, Harness, InlineHarness
from tests.support.services import finish_inline, truncate_all
from tests.support.waiting import eventually, wait_finished
from tests.support.workers import ROOT, Process, service_env, start_worker

# The suite's own master key (AGENT_JOBS_TEST_ENCRYPTION=1 uses it too): the data keys
# outlive a test in the shared database (tests/support/services.py, truncate_all).
KEY_ID, KEYS = test_encryption.KEY_ID, test_encryption.KEYS_JSON
ON = {"AGENT_JOBS_ENCRYPTION_KEYS": KEYS, "AGENT_JOBS_ENCRYPTION_KEY_ID": KEY_ID}
OFF = {"AGENT_JOBS_ENCRYPTION_KEYS": "", "AGENT_JOBS_ENCRYPTION_KEY_ID": ""}
# Words of the support scenario's input, model text, tool arguments and results: none may
# be in a payload column as stored (the thread's title, made of the input, included).
MARKERS = ("ZEBRA-INPUT", "Checking.", "refunded", "order_id")
PAYLOAD_TABLES = (
    "threads",
    "runs",
    "messages",
    "tool_calls",
    "journal",
    "events",
    "questions",
    "outbox",
)


@pytest.fixture(autouse=True)
def keys_kept() -> Iterator[None]:
    """Each test leaves this process's keys as it found them (the tests that turn them
    off or change them would otherwise leave the next module's stores unsealed)."""
    encryption.ensure_configured()
    before, ring = Codecs.installed, keyring()
    yield
    Codecs.installed = before
    encryption.set_keyring(ring)


@pytest.fixture
def sealed() -> Iterator[None]:
    """This process seals with the test's master key; as before afterwards."""
    before, ring = Codecs.installed, keyring()
    encryption.configure(KEYS, KEY_ID, settings=False)
    yield
    Codecs.installed = before
    encryption.set_keyring(ring)


def raw_rows(store: Store) -> str:
    """Every row of every payload table as stored, as one text."""
    found = []
    with store.connect() as conn:
        for table in PAYLOAD_TABLES:
            found += [repr(tuple(r)) for r in conn.execute(text(f"SELECT * FROM {table}")).all()]
    return "\n".join(found)


def check_sealed_and_read_back(h: Harness, run_id: str) -> None:
    run = h.store.get_run(run_id)
    assert run.status == "completed", run.error
    assert run.output == "Order 42 was refunded." and "ZEBRA-INPUT" in run.input
    stored = raw_rows(h.store)
    assert run_id in stored and "$enc" in stored
    for marker in MARKERS:
        assert marker not in stored, f"{marker!r} is stored clear"
    calls = h.store.tool_calls(run_id)
    assert {"order_id": "42", "refunded": 5.0} in [c["result"] for c in calls]
    said = [m.content for m in h.store.thread_messages(run.thread_id)]
    assert "Checking. " in said and "Order 42 was refunded." in said
    with h.store.connect() as conn:
        actors = {r.actor for r in conn.execute(select(data_keys)).all()}
    assert "user-7" in actors


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_an_inline_run_is_sealed_at_rest_and_read_back(
    sealed: None, database: str, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)  # tests.apps records here
    url = f"sqlite:///{tmp_path / 'sealed.db'}" if database == "sqlite" else pg_url
    store = Store.from_url(url, auto_upgrade=True)
    truncate_all(store)
    runner = InlineRunner(apps.app, store, settings=Settings(), poll_interval=0.05)
    try:
        h = InlineHarness(runner)
        run = h.run_approving("support", "Where is order 42? ZEBRA-INPUT")
        check_sealed_and_read_back(h, run.run_id)
    finally:
        finish_inline(runner)
        store.engine.dispose()


class Workers:
    """Workers of the test's own on their own queues: one with the key, one without."""

    def __init__(self, broker: str, pg_url: str) -> None:
        self.broker, self.pg_url = broker, pg_url
        self.store = Store.from_url(pg_url)
        truncate_all(self.store)
        apps.side_engine()
        self.procs: list[Process] = []
        self.celeries: list[Any] = []

    def start(self, queue: str, keys: dict[str, str]) -> Process:
        env = service_env(self.broker, self.pg_url, AGENT_JOBS_QUEUE=queue, **keys)
        proc = start_worker(env, concurrency=2, name=queue, pool="threads")
        self.procs.append(proc)
        return proc

    def harness(self, queue: str) -> DurableHarness:
        from agent_jobs.streams.redis_streams import RedisStreams

        celery = celery_client(self.broker, queue)
        self.celeries.append(celery)
        settings = Settings(broker_url=self.broker, database_url=self.pg_url, queue=queue)
        client = Client(self.store, apps.app, settings, CeleryDispatcher(celery))
        return DurableHarness(client, RedisStreams.from_url(self.broker))

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()
        for celery in self.celeries:
            celery.close()
        self.store.engine.dispose()


@pytest.fixture
def workers(
    pg_url: str, durable_broker: str, monkeypatch: pytest.MonkeyPatch, sealed: None
) -> Iterator[Workers]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)  # tests.apps records here
    made = Workers(durable_broker, pg_url)
    yield made
    made.close()


def cli(*args: str, keys: dict[str, str], pg_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_")}
    env |= {"AGENT_JOBS_DATABASE_URL": pg_url, "PYTHONPATH": str(ROOT), **keys}
    return subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_durable_run_is_sealed_at_rest_and_every_door_reads_it(workers: Workers) -> None:
    workers.start("sealed", ON)
    h = workers.harness("sealed")
    run = h.run_approving("support", "Where is order 42? ZEBRA-INPUT")
    check_sealed_and_read_back(h, run.run_id)

    shown = cli("status", run.run_id, "--json", keys=ON, pg_url=workers.pg_url)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["output"] == "Order 42 was refunded."
    refused = cli("status", run.run_id, "--json", keys=OFF, pg_url=workers.pg_url)
    assert refused.returncode != 0
    assert "AGENT_JOBS_ENCRYPTION_KEYS" in refused.stderr and "Order 42" not in refused.stdout


def test_a_worker_without_the_key_fails_the_step_naming_it_and_stays_up(
    workers: Workers,
) -> None:
    keyless = workers.start("keyless", OFF)
    h = workers.harness("keyless")
    run_id = h.start("support", "Where is order 42? ZEBRA-INPUT")  # sealed here
    with workers.store.connect() as conn:
        [key_id] = conn.execute(select(data_keys.c.id).where(data_keys.c.actor == "user-7")).all()
    ended = wait_finished(workers.store, run_id)
    assert ended.status == "failed"
    assert key_id[0] in (ended.error or "") and ended.error_type == "PayloadKeyError"
    assert keyless.proc.poll() is None  # the worker is up

    # It serves a run stored clear (written by a process without keys).
    encryption.configure(None, None, settings=False)
    clear = h.run_approving("support", "Where is order 7?")
    assert clear.status == "completed", clear.error

    assert keyless.proc.poll() is None


K2 = base64.b64encode(bytes(range(32, 64))).decode()
BOTH = json.dumps({KEY_ID: json.loads(KEYS)[KEY_ID], "at-rest-k2": K2})
ROTATED = {"AGENT_JOBS_ENCRYPTION_KEYS": BOTH, "AGENT_JOBS_ENCRYPTION_KEY_ID": "at-rest-k2"}


def approved(h: Harness, run_id: str) -> RunView:
    """The run, ended, every approval it asked for given."""

    def ended() -> RunView | None:
        run = h.store.get_run(run_id)
        if run.finished:
            return run
        for call in h.store.pending_calls(run_id):
            h.decide(run_id, call["call_id"], "approve", "alice")
        return None

    return eventually(ended, what=f"run {run_id} to end, approving every call")


def masters_of_keys(store: Store) -> set[str]:
    with store.connect() as conn:
        return {r.master_key_id for r in conn.execute(select(data_keys)).all()}


def test_rotate_while_a_worker_runs(workers: Workers) -> None:
    workers.start("rotating", ROTATED)
    h = workers.harness("rotating")
    before = h.run_approving("support", "Where is order 42? ZEBRA-INPUT")
    assert before.status == "completed", before.error
    assert masters_of_keys(workers.store) == {KEY_ID}  # under the old key

    encryption.configure(BOTH, "at-rest-k2", settings=False)
    try:
        going = h.start("support", "Where is order 42? again")
        assert maintenance.rotate(workers.store, batch=1) >= 1
        assert maintenance.rotate(workers.store) == 0
        assert masters_of_keys(workers.store) == {"at-rest-k2"}
        assert approved(h, going).status == "completed"

        encryption.configure(json.dumps({"at-rest-k2": K2}), "at-rest-k2", settings=False)
        check_sealed_and_read_back(h, before.run_id)  # the old master key gone: still read
    finally:  # back under the suite's key, for the tests after this one
        encryption.configure(BOTH, KEY_ID, settings=False)
        maintenance.rotate(workers.store)


def payload_values(store: Store) -> list[tuple[str, Any]]:
    """Every payload value as stored (no codec), with where it is."""
    found = []
    with store.connect() as conn:
        for table, columns in maintenance._tables():
            raw = [payload_rows.raw(c) for c in columns]
            for row in conn.execute(select(*raw)).all():
                found += [(f"{table.name}.{c.name}", row._mapping[c.name]) for c in columns]
    return [(where, value) for where, value in found if value is not None]


def readable(h: Harness, run_id: str) -> tuple[Any, ...]:
    run = h.store.get_run(run_id)
    return (
        run.input,
        run.output,
        [(m.role, m.content) for m in h.store.thread_messages(run.thread_id)],
        [(c["call_id"], c["args"], c["result"]) for c in h.store.tool_calls(run_id)],
    )


def test_encrypt_existing_while_a_worker_runs(workers: Workers) -> None:
    encryption.configure(None, None, settings=False)
    workers.start("clear", OFF)
    old = workers.harness("clear")
    olds = [old.run_approving("support", f"Where is order 42? old {n}").run_id for n in range(3)]
    seen = {run_id: readable(old, run_id) for run_id in olds}
    assert any(isinstance(v, str) and "old 0" in v for _, v in payload_values(workers.store))

    encryption.configure(KEYS, KEY_ID, settings=False)
    workers.start("sealing", ON)
    h = workers.harness("sealing")
    going = h.start("support", "Where is order 42? ZEBRA-INPUT")
    sealed = maintenance.encrypt_existing(workers.store, batch=3)
    assert sealed["runs"] == 3 and sealed["messages"] > 0 and sealed["journal"] > 0
    assert approved(h, going).status == "completed"
    assert sum(maintenance.encrypt_existing(workers.store).values()) == 0

    for where, value in payload_values(workers.store):
        form = envelope.read_json_form(value) if not isinstance(value, str) else None
        text_form = envelope.read_text_form(value) if isinstance(value, str) else None
        assert form is not None or text_form is not None, f"{where} is clear: {value!r}"
    for run_id, before in seen.items():
        assert readable(h, run_id) == before  # nothing lost, nothing clobbered
    check_sealed_and_read_back(h, going)
