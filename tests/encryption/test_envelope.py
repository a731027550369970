"""Encryption at rest, in this process on SQLite: the envelope, the keys' settings, the
owner of a write, and what `keys rotate`, `forget` and `keys encrypt-existing` do."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Text, select, text, type_coerce

from agent_jobs import encryption
from agent_jobs.encryption import envelope, maintenance
from agent_jobs.encryption.keyring import keyring
from agent_jobs.errors import (
    ConfigurationError,
    PayloadForgottenError,
    PayloadKeyError,
    PayloadOwnerError,
    UnknownRunError,
)
from agent_jobs.store import Store, threads
from agent_jobs.store import runs as run_rows
from agent_jobs.store.listing import RunFilter
from agent_jobs.store.payloads import Codecs
from agent_jobs.store.schema import Json, data_keys, runs

# Fixed (the parameters' ids must be the same in every process of a parallel run).
K1 = base64.b64encode(bytes(range(100, 132))).decode()
K2 = base64.b64encode(bytes(range(150, 182))).decode()


def keys(**found: str) -> str:
    return json.dumps(found)


@pytest.fixture
def restore() -> Iterator[None]:
    """The process's codec as it was before the test."""
    before, ring = Codecs.installed, keyring()
    yield
    Codecs.installed = before
    encryption.set_keyring(ring)


@pytest.fixture
def sealed_store(tmp_path: Path, restore: None) -> Iterator[Store]:
    encryption.configure(keys(k1=K1), "k1", settings=False)
    store = Store.from_url(f"sqlite:///{tmp_path / 'enc.db'}", auto_upgrade=True)
    yield store
    store.engine.dispose()


def add_run(store: Store, run_id: str, actor: str, input: str, **metadata: Any) -> None:
    with store.begin() as conn:
        threads.ensure_thread(conn, "t-" + run_id)
        run_rows.insert_run(
            conn,
            run_id=run_id,
            thread_id="t-" + run_id,
            agent="support",
            actor=actor,
            persona=None,
            input=input,
            status="completed",
            runner="inline",
            day="2026-12-06",
            metadata=metadata,
        )


def raw_run(store: Store, run_id: str) -> tuple[Any, Any]:
    """A run's input and metadata as stored (no codec)."""
    with store.connect() as conn:
        row = conn.execute(
            select(type_coerce(runs.c.input, Text()), type_coerce(runs.c.metadata, Json)).where(
                runs.c.id == run_id
            )
        ).one()
    return row[0], row[1]


# --- the envelope --------------------------------------------------------------------


def test_a_sealed_value_opens_under_its_key_only() -> None:
    key, other = envelope.new_key(), envelope.new_key()
    sealed = envelope.seal(key, b"secret words", b"aad")
    assert b"secret words" not in sealed
    assert envelope.unseal(key, sealed, b"aad") == b"secret words"
    with pytest.raises(envelope.Unsealable):
        envelope.unseal(other, sealed, b"aad")
    with pytest.raises(envelope.Unsealable):
        envelope.unseal(key, sealed, b"other aad")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(envelope.Unsealable):
        envelope.unseal(key, tampered, b"aad")


def test_the_stored_forms_are_told_from_clear_values() -> None:
    sealed = envelope.seal(envelope.new_key(), b"x", b"")
    assert envelope.read_json_form(envelope.json_form("dk1", sealed)) == ("dk1", sealed)
    assert envelope.read_text_form(envelope.text_form("dk1", sealed)) == ("dk1", sealed)
    for clear in ({"a": 1}, [1, 2], "text", {"$enc": 1, "k": "x"}, None):
        assert envelope.read_json_form(clear) is None
    assert envelope.read_text_form("hello $enc$1$") is None


# --- the settings --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("found", "key_id", "said"),
    [
        ("not json", "k1", "is not JSON"),
        (keys(k1="%%%"), "k1", "key 'k1' is not base64"),
        (keys(k1=base64.b64encode(b"short").decode()), "k1", "is not 32 bytes"),
        (keys(k1=K1, k2=K2), None, "must name the key"),
        (keys(k1=K1), "k9", "'k9' is not among"),
        (None, "k1", "AGENT_JOBS_ENCRYPTION_KEYS is not"),
    ],
)
def test_bad_key_settings_are_refused_clearly_and_show_no_key(
    found: str | None, key_id: str | None, said: str
) -> None:
    with pytest.raises(ConfigurationError, match=said) as caught:
        encryption.master_keys(found, key_id)
    assert K1 not in str(caught.value) and K2 not in str(caught.value)


def test_no_settings_encrypt_nothing_and_one_key_is_the_current_one() -> None:
    assert encryption.master_keys(None, None) == ({}, None)
    masters, current = encryption.master_keys(keys(k1=K1), None)
    assert current == "k1" and masters["k1"] == base64.b64decode(K1)
    assert K1 not in repr(encryption.Keyring(masters, current))


# --- the store -----------------------------------------------------------------------


def test_a_runs_payloads_are_sealed_at_rest_and_read_back(sealed_store: Store) -> None:
    add_run(sealed_store, "r1", "alice", "MARKER-input", note="MARKER-meta")
    stored_input, stored_meta = raw_run(sealed_store, "r1")
    assert stored_input.startswith(envelope.TEXT_MARK) and "MARKER" not in stored_input
    assert set(stored_meta) == {"$enc", "k", "d"} and "MARKER" not in json.dumps(stored_meta)
    run = sealed_store.get_run("r1")
    assert run.input == "MARKER-input" and run.metadata == {"note": "MARKER-meta"}
    with sealed_store.connect() as conn:
        [key] = conn.execute(select(data_keys)).all()
    assert key.actor == "alice" and key.master_key_id == "k1" and key.id == stored_meta["k"]
    assert base64.b64decode(K1) not in bytes(key.wrapped)


def test_a_payload_with_no_owner_is_refused_never_written_clear(sealed_store: Store) -> None:
    # Raised as it is, not wrapped in SQLAlchemy's StatementError (DontWrapMixin).
    with pytest.raises(PayloadOwnerError), sealed_store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        conn.execute(runs.insert().values(id="r0", thread_id="t1", input="clear?"))
    with pytest.raises(UnknownRunError):
        sealed_store.get_run("r0")  # nothing was written


def test_a_missing_master_key_fails_closed_naming_the_key(sealed_store: Store) -> None:
    add_run(sealed_store, "r1", "alice", "MARKER")
    _, meta = raw_run(sealed_store, "r1")
    encryption.configure(keys(k2=K2), "k2", settings=False)  # k1 gone
    with pytest.raises(PayloadKeyError, match="master key 'k1'") as caught:
        sealed_store.get_run("r1")
    assert caught.value.key_id == meta["k"]
    encryption.configure(None, None, settings=False)  # no keys at all
    with pytest.raises(PayloadKeyError, match=meta["k"]):
        sealed_store.get_run("r1")


def test_a_changed_ciphertext_fails_closed(sealed_store: Store) -> None:
    add_run(sealed_store, "r1", "alice", "MARKER")
    stored_input, _ = raw_run(sealed_store, "r1")
    head, _, data = stored_input.rpartition("$")
    sealed = bytearray(base64.b64decode(data))
    sealed[-1] ^= 1
    changed = head + "$" + base64.b64encode(bytes(sealed)).decode()
    with sealed_store.begin() as conn:
        conn.execute(text("UPDATE runs SET input = :v WHERE id = 'r1'"), {"v": changed})
    with pytest.raises(PayloadKeyError, match="does not open"):
        sealed_store.get_run("r1")


def test_rotate_rewraps_every_key_once_and_reads_go_on(sealed_store: Store) -> None:
    add_run(sealed_store, "r1", "alice", "one")
    add_run(sealed_store, "r2", "bob", "two")
    encryption.configure(keys(k1=K1, k2=K2), "k2", settings=False)
    assert maintenance.rotate(sealed_store, batch=1) == 2
    assert maintenance.rotate(sealed_store) == 0  # nothing left to do
    with sealed_store.connect() as conn:
        assert {r.master_key_id for r in conn.execute(select(data_keys)).all()} == {"k2"}
    encryption.configure(keys(k2=K2), "k2", settings=False)  # the old key may go now
    assert sealed_store.get_run("r1").input == "one"
    assert sealed_store.get_run("r2").input == "two"


def test_forget_leaves_the_bytes_unreadable_and_other_actors_alone(sealed_store: Store) -> None:
    add_run(sealed_store, "r1", "alice", "alice's words")
    add_run(sealed_store, "r2", "bob", "bob's words")
    before = raw_run(sealed_store, "r1")
    found = maintenance.forget(sealed_store, "alice")
    assert len(found.keys) == 1 and found.payloads == 2  # input and metadata
    assert raw_run(sealed_store, "r1") == before  # the same ciphertext, now unreadable
    with pytest.raises(PayloadKeyError, match="actor 'alice' was forgotten"):
        sealed_store.get_run("r1")
    assert sealed_store.get_run("r2").input == "bob's words"
    with sealed_store.connect() as conn:  # still there, with id and status
        assert conn.execute(select(runs.c.id, runs.c.status).where(runs.c.id == "r1")).one()
    # …and listed: the list shows a forgotten run's payloads as forgotten.
    listed = {r.run_id: r for r in sealed_store.runs_page(RunFilter()).runs}
    assert (listed["r1"].status, listed["r1"].input) == ("completed", "(forgotten)")
    assert listed["r1"].metadata == {"forgotten": True}
    assert listed["r2"].input == "bob's words"
    assert [r.input for r in sealed_store.list_runs() if r.run_id == "r1"] == ["(forgotten)"]
    with pytest.raises(PayloadForgottenError):  # anywhere else, refused as ever
        sealed_store.get_run("r1")
    assert maintenance.forget(sealed_store, "alice").keys == []
    add_run(sealed_store, "r3", "alice", "a new key")  # a new run, a new key
    assert sealed_store.get_run("r3").input == "a new key"


def test_encrypt_existing_seals_clear_rows_and_leaves_sealed_ones(
    tmp_path: Path, restore: None
) -> None:
    encryption.configure(None, None, settings=False)
    store = Store.from_url(f"sqlite:///{tmp_path / 'old.db'}", auto_upgrade=True)
    try:
        for n in range(5):
            add_run(store, f"r{n}", "alice" if n % 2 else "bob", f"old-{n}", n=n)
        assert raw_run(store, "r1")[0] == "old-1"  # clear, as before encryption
        encryption.configure(keys(k1=K1), "k1", settings=False)
        add_run(store, "r9", "carol", "new")
        sealed_before = raw_run(store, "r9")
        found = maintenance.encrypt_existing(store, batch=2)
        assert found["runs"] == 5
        assert maintenance.encrypt_existing(store)["runs"] == 0
        assert raw_run(store, "r9") == sealed_before  # not sealed twice
        for n in range(5):
            stored_input, _ = raw_run(store, f"r{n}")
            assert stored_input.startswith(envelope.TEXT_MARK)
            run = store.get_run(f"r{n}")
            assert run.input == f"old-{n}" and run.metadata == {"n": n}
    finally:
        store.engine.dispose()


def test_a_notification_is_sealed_in_the_outbox_and_delivered_clear(
    sealed_store: Store,
) -> None:
    """The outbox keeps a notification's body sealed; the webhook, whose receiver the
    deployment trusts with its runs, gets it clear and signed."""
    from agent_jobs.notify.sender import Sender
    from agent_jobs.notify.webhook import Webhook
    from agent_jobs.runs import RunRequest, create_run
    from agent_jobs.store.schema import outbox
    from tests.operations.test_notifications import SECRET, Receiver, running, settings_for
    from tests.support.waiting import eventually

    with sealed_store.begin() as conn:
        request = RunRequest(agent="support", input="go", actor="alice", metadata={"t": 7})
        create_run(conn, request, run_id="n1", runner="inline", status="running")
    with sealed_store.begin() as conn:
        assert run_rows.finish_run(conn, "n1", "completed", output="MARKER-output")
    with sealed_store.connect() as conn:
        [stored] = conn.execute(select(type_coerce(outbox.c.body, Json))).scalars().all()
    assert set(stored) == {"$enc", "k", "d"} and "MARKER" not in json.dumps(stored)

    receiver = Receiver().start()
    settings = settings_for(sealed_store, None, webhook_url=receiver.url, webhook_secret=SECRET)
    sender = Sender(sealed_store, settings, webhook=Webhook.from_settings(settings))
    try:
        with running(sender):
            eventually(receiver.delivered, what="the notification to be delivered")
    finally:
        receiver.stop()
    [got] = receiver.delivered()
    assert got.signed and got.event["output"] == "MARKER-output"
    assert got.event["metadata"] == {"t": 7} and got.event["actor"] == "alice"


def test_a_clear_value_shaped_like_a_sealed_one_reads_back_as_it_was(
    tmp_path: Path, restore: None
) -> None:
    """A caller's metadata shaped like a sealed JSON form, an input that starts like a
    sealed text: written clear (encryption off) they read back as they were, never taken
    for sealed; sealed later by encrypt-existing, they still do."""
    encryption.configure(None, None, settings=False)
    store = Store.from_url(f"sqlite:///{tmp_path / 'alike.db'}", auto_upgrade=True)
    alike_text = "$enc$1$k$AAAA"
    alike_json = {"$enc": 1, "k": "k", "d": "AAAA"}
    try:
        add_run(store, "r1", "alice", alike_text, **alike_json)
        run = store.get_run("r1")
        assert (run.input, run.metadata) == (alike_text, alike_json)
        encryption.configure(keys(k1=K1), "k1", settings=False)
        assert maintenance.encrypt_existing(store)["runs"] == 1
        stored_input, stored_meta = raw_run(store, "r1")
        assert stored_input.startswith(envelope.TEXT_MARK) and set(stored_meta) == {
            "$enc",
            "k",
            "d",
        }
        run = store.get_run("r1")
        assert (run.input, run.metadata) == (alike_text, alike_json)
    finally:
        store.engine.dispose()


def test_encrypt_existing_seals_a_payload_kept_apart(tmp_path: Path, restore: None) -> None:
    """A clear run whose input was kept apart (over the inline limit) is sealed whole by
    encrypt-existing, and reads back as it was."""
    encryption.configure(None, None, settings=False)
    store = Store.from_url(f"sqlite:///{tmp_path / 'apart.db'}", auto_upgrade=True)
    big = "words " * 60_000  # 360 kB: over the 256 KiB inline limit
    try:
        add_run(store, "r1", "alice", big)
        assert raw_run(store, "r1")[0].startswith("agent-jobs-blob:sha256:")
        encryption.configure(keys(k1=K1), "k1", settings=False)
        assert maintenance.encrypt_existing(store)["runs"] == 1
        assert store.get_run("r1").input == big
        stored_input, _ = raw_run(store, "r1")
        assert "words" not in stored_input
    finally:
        store.engine.dispose()
