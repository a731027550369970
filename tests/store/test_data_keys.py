"""Where a process looks for a data key it has not opened (agent_jobs/encryption/
keyring.py): in the database the store reads first, so a key read takes no connection
of any other store's pool."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_jobs import encryption
from agent_jobs.encryption.keyring import keyring
from agent_jobs.store import Store, runs
from agent_jobs.store.payloads import Codecs
from tests.support import encryption as test_encryption
from tests.support.builders import add_run
from tests.support.services import own_database


@pytest.fixture
def sealing() -> Iterator[None]:
    before, ring = Codecs.installed, keyring()
    encryption.configure(test_encryption.KEYS_JSON, test_encryption.KEY_ID, settings=False)
    yield
    Codecs.installed = before
    encryption.set_keyring(ring)


def test_a_key_not_opened_is_read_from_the_store_being_read_alone(sealing: None) -> None:
    with own_database("keys_read") as url, own_database("keys_other") as other_url:
        read, other = Store.from_url(url), Store.from_url(other_url)
        try:
            add_run(read, "r1")
            add_run(other, "r2")  # the newest store this process wrote to
            other.engine.dispose()
            keyring().drop_all()  # the key, made here, is no longer open
            assert read.get_run("r1").input == "x"
            assert other.engine.pool.checkedin() == 0  # no connection was taken there
        finally:
            read.engine.dispose()
            other.engine.dispose()


def test_a_writing_block_reads_a_key_it_has_not_opened_on_sqlite(
    sealing: None, sqlite_url: str
) -> None:
    """The key is read beside a transaction that holds SQLite's write lock."""
    store = Store.from_url(sqlite_url)
    try:
        add_run(store, "r1")
        keyring().drop_all()
        with store.begin() as conn:
            row = runs.get_run(conn, "r1")
        assert row is not None and row.input == "x"
    finally:
        store.engine.dispose()
