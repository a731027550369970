"""Payloads kept apart (agent_jobs/store/blobs.py), on both databases: written in the
transaction of the row that refers to them, read back whole and checked, refused over the
maximum, and pruned once nothing refers to them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from agent_jobs import encryption, retention
from agent_jobs.encryption.keyring import Keyring, keyring, owner_scope
from agent_jobs.errors import PayloadBlobError, PayloadTooLargeError
from agent_jobs.messages import Message
from agent_jobs.settings import get_settings
from agent_jobs.store import Store, model_requests, threads
from agent_jobs.store import blobs as blob_codec
from agent_jobs.store import journal as journal_rows
from agent_jobs.store.db import utcnow
from tests.support import encryption as test_encryption

BIG = "lorem ipsum " * 30_000  # 360,000 bytes: over the 256 KiB inline limit


def sha(text_: str) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()


def stored(store: Store, sql: str, **params: Any) -> Any:
    """A value as the database holds it (no codec on the way)."""
    with store.engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def kept(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT sha256, size FROM payload_blobs")).all()
    return {str(d): int(s) for d, s in rows}


def journal_done(store: Store, run_id: str, step: str, intent: Any, result: Any) -> None:
    with store.begin() as conn:
        journal_rows.insert_done(
            conn, run_id=run_id, step=step, seq=1, intent=intent, result=result
        )


def as_stored(store: Store, run_id: str, column: str = "intent") -> str:
    cast = "::text" if store.engine.dialect.name == "postgresql" else ""
    return str(stored(store, f"SELECT {column}{cast} FROM journal WHERE run_id = :r", r=run_id))


@pytest.fixture(autouse=True)
def clear_writes() -> Iterator[None]:
    """What these tests check is the blob layer's own stored form (references, digests,
    one blob for one value), so this process writes clear even when the suite runs with
    encryption on; a sealed value kept apart is the last test's."""
    encryption.ensure_configured()  # as a store would, first: this keyring then stays
    ring = keyring()
    clear = Keyring(ring.masters, None)
    clear.engines_of(ring)
    encryption.set_keyring(clear)
    yield
    encryption.set_keyring(ring)


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The smallest limits the settings allow: 1 KiB inline, 8 KiB at most."""
    monkeypatch.setenv("AGENT_JOBS_PAYLOAD_INLINE_LIMIT", "1024")
    monkeypatch.setenv("AGENT_JOBS_PAYLOAD_MAX", "8192")
    get_settings.cache_clear()
    yield
    monkeypatch.undo()
    get_settings.cache_clear()


def test_a_large_value_is_kept_apart_once_and_read_whole(store: Store) -> None:
    intent = {"type": "persist_toolexec", "content": BIG, "result": BIG, "n": 1}
    journal_done(store, "r1", "persist:toolexec:c1", intent, BIG)

    raw = as_stored(store, "r1")
    assert len(raw) < 1000 and BIG[:50] not in raw  # the row holds references
    assert '"type"' in raw  # its small keys stay where a query finds them
    assert kept(store) == {sha(BIG): len(BIG.encode())}  # one blob for the three copies
    [row] = store.journal("r1")
    assert (row["intent"], row["result"]) == (intent, BIG)


def test_a_blob_is_read_in_the_transaction_that_wrote_it_and_goes_with_its_rollback(
    store: Store,
) -> None:
    with store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        threads.add_message(conn, "t1", "r1", Message(role="tool", content=BIG))
        journal_rows.insert_done(conn, run_id="r1", step="a", seq=1, intent={"x": BIG}, result=None)
        assert [m.content for m in threads.thread_messages(conn, "t1")] == [BIG]
        assert journal_rows.load(conn, "r1")[0].intent == {"x": BIG}
        conn.rollback()
    assert kept(store) == {}


def test_one_value_in_two_runs_is_kept_once(store: Store) -> None:
    journal_done(store, "r1", "tool:c1", {"type": "invoke_tool"}, {"ok": True, "result": BIG})
    first = kept(store)
    journal_done(store, "r2", "tool:c1", {"type": "invoke_tool"}, {"ok": True, "result": BIG})

    assert kept(store) == first == {sha(BIG): len(BIG.encode())}


def test_a_text_payload_is_kept_apart_by_a_prefixed_reference(store: Store) -> None:
    with store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        threads.add_message(conn, "t1", "r1", Message(role="tool", content=BIG))
    raw = stored(store, "SELECT content FROM messages WHERE thread_id = 't1'")
    assert raw == f"{blob_codec.TEXT_PREFIX}{sha(BIG)}:{len(BIG.encode())}"
    assert [m.content for m in store.thread_messages("t1")] == [BIG]


@pytest.mark.parametrize("how", ["altered", "missing"])
def test_a_blob_altered_or_missing_fails_the_read_naming_its_digest(store: Store, how: str) -> None:
    journal_done(store, "r1", "tool:c1", {"type": "invoke_tool"}, BIG)
    with store.begin() as conn:
        if how == "altered":
            conn.execute(text("UPDATE payload_blobs SET data = :d"), {"d": b"x" + BIG.encode()})
        else:
            conn.execute(text("DELETE FROM payload_blobs"))

    with pytest.raises(PayloadBlobError) as failed:
        store.journal("r1")
    assert failed.value.digest == sha(BIG)
    assert sha(BIG) in str(failed.value)
    assert ("does not match its digest" if how == "altered" else "is missing") in str(failed.value)


def test_values_that_look_like_references_read_back_as_they_were(store: Store) -> None:
    tricky = {"$payload_blobs": "inline", "x": 1}
    prefixed = blob_codec.TEXT_PREFIX + "0" * 64 + ":3"
    journal_done(store, "r1", "a", tricky, [tricky])
    with store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        threads.add_message(conn, "t1", "r1", Message(role="user", content=prefixed))

    [row] = store.journal("r1")
    assert (row["intent"], row["result"]) == (tricky, [tricky])
    assert [m.content for m in store.thread_messages("t1")] == [prefixed]


def test_rows_written_before_the_codec_read_as_they_are(store: Store) -> None:
    """An old row's value, written with no codec, is not taken for a reference."""
    value = json.dumps({"$payload_blob": "0" * 64, "size": 3, "as": "text"})
    with store.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO journal (run_id, step, seq, state, intent, attempts, created_at)"
                f" VALUES ('old', 'a', 1, 'done', {_json_param(store)}, 0, :now)"
            ),
            {"v": value, "now": utcnow()},
        )
    assert store.journal("old")[0]["intent"] == json.loads(value)


def _json_param(store: Store) -> str:
    return "CAST(:v AS jsonb)" if store.engine.dialect.name == "postgresql" else ":v"


def test_the_journal_of_a_pass_keeps_its_large_intents_apart(store: Store) -> None:
    """The durable runner's rows of a pass go as one JSON document (on Postgres): they
    pass through the codecs too."""
    rows = [
        journal_rows.row(run_id="r1", step="tool:c1", seq=1, state="scheduled", intent={"a": BIG})
    ]
    with store.begin() as conn:
        journal_rows.insert_many(conn, rows)

    assert len(as_stored(store, "r1")) < 1000
    assert store.journal("r1")[0]["intent"] == {"a": BIG}


def test_a_model_intent_kept_apart_is_found_and_made_whole(store: Store) -> None:
    """A model step's intent journaled as what it adds (store/model_requests.py) is found
    by its `type` and made whole from the one before, large parts and all."""
    request = {"messages": [{"content": BIG}], "system": "s", "tools": []}
    first = {"type": "model_turn", "request": request}
    whole = {
        "type": "model_turn",
        "request": {
            "messages": [{"content": BIG}, {"content": BIG + "!"}],
            "system": "s",
            "tools": [],
        },
    }
    second = model_requests.slim(whole, ("model:1", first))
    with store.begin() as conn:
        journal_rows.insert_done(
            conn, run_id="r1", step="model:1", seq=1, intent=first, result=None
        )
        journal_rows.insert_done(
            conn, run_id="r1", step="model:2", seq=2, intent=second, result=None
        )
    assert len(kept(store)) == 2

    with store.connect() as conn:
        assert journal_rows.whole_model_intent(conn, "r1", "model:2") == whole


def test_a_value_over_the_maximum_is_refused_before_it_is_stored(
    store: Store, limits: None
) -> None:
    with pytest.raises(PayloadTooLargeError) as refused:
        journal_done(store, "r1", "a", {"type": "x"}, "y" * 9000)
    assert refused.value.limit == 8192 and "AGENT_JOBS_PAYLOAD_MAX" in str(refused.value)
    assert store.journal("r1") == [] and kept(store) == {}
    # Split into parts each under it, a value twice the maximum is kept.
    journal_done(store, "r1", "a", {"type": "x"}, {"one": "a" * 6000, "two": "b" * 6000})
    assert store.journal("r1")[0]["result"] == {"one": "a" * 6000, "two": "b" * 6000}


def test_oversize_refuses_a_long_string_by_its_length() -> None:
    long = "é" * 101
    assert blob_codec.oversize(long, "it", most=100) is not None  # 101 characters > 100
    assert blob_codec.oversize("é" * 60, "it", most=100) is not None  # 120 bytes
    assert blob_codec.oversize("e" * 100, "it", most=100) is None
    refused = blob_codec.oversize({"rows": ["a" * 60, "b" * 60]}, "the result", most=100)
    assert refused is not None and refused.size > 100
    assert blob_codec.oversize({"at": utcnow()}, "it", most=100) is None  # no JSON type: sized


def test_the_prune_removes_the_blobs_nothing_refers_to(store: Store) -> None:
    other = "dolor sit amet " * 30_000
    journal_done(store, "r1", "a", {"type": "x"}, BIG)  # referred to
    with store.begin() as conn:  # a blob whose row is gone
        journal_rows.insert_done(conn, run_id="r2", step="a", seq=1, intent=None, result=other)
        conn.execute(text("DELETE FROM journal WHERE run_id = 'r2'"))
    assert set(kept(store)) == {sha(BIG), sha(other)}

    fresh = retention.prune(store, older_than=1000)  # written just now: in the grace
    assert fresh.blobs == 0 and len(kept(store)) == 2
    later = utcnow() + timedelta(hours=2)
    dry = retention.prune(store, older_than=1000, dry_run=True, now=later)
    assert (dry.blobs, dry.blob_bytes) == (1, len(other)) and len(kept(store)) == 2
    done = retention.prune(store, older_than=1000, now=later)

    assert (done.blobs, done.blob_bytes) == (1, len(other))
    assert f"1 blob ({len(other):,} bytes)" in done.summary()
    assert set(kept(store)) == {sha(BIG)}
    assert store.journal("r1")[0]["result"] == BIG


def test_the_prune_follows_references_inside_a_blob(store: Store, limits: None) -> None:
    """A value whose small parts still pass the limit goes apart whole, its large strings
    in blobs of their own that only that blob refers to."""
    value = [f"item {i}" for i in range(200)] + ["z" * 500]  # ~2.4 KB, one 500-byte part
    journal_done(store, "r1", "a", {"type": "x"}, value)
    assert len(kept(store)) == 2  # the list and its large string

    later = utcnow() + timedelta(hours=2)
    assert retention.prune(store, older_than=1000, now=later).blobs == 0
    assert store.journal("r1")[0]["result"] == value


def test_the_doors_answer_a_payload_refused_or_unreadable() -> None:
    from agent_jobs.cli.common import exit_code_of
    from agent_jobs.http.errors import answer_of

    too_large = PayloadTooLargeError("the run's input", 40_000_000, 33_554_432)
    unreadable = PayloadBlobError("0" * 64, "is missing")
    assert answer_of(too_large) == (413, "PayloadTooLargeError")
    assert answer_of(unreadable) == (500, "PayloadBlobError")
    assert exit_code_of(too_large) == exit_code_of(unreadable) == 2


def test_a_sealed_value_is_kept_apart_as_ciphertext_and_read_whole(store: Store) -> None:
    ring = keyring()
    encryption.configure(test_encryption.KEYS_JSON, test_encryption.KEY_ID, settings=False)
    try:
        with owner_scope(store.engine, "u"):
            journal_done(store, "r1", "tool:c1", {"type": "invoke_tool"}, {"result": BIG})
        [(digest, size)] = kept(store).items()
        blob = stored(store, "SELECT data FROM payload_blobs WHERE sha256 = :d", d=digest)
        assert size > len(BIG) and b"lorem" not in bytes(blob) and digest != sha(BIG)
        assert "lorem" not in as_stored(store, "r1", "result")
        with store.connect() as conn:
            row = journal_rows.get(conn, "r1", "tool:c1")
        assert row is not None and row.result == {"result": BIG}
    finally:
        encryption.set_keyring(ring)
