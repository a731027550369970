"""The master keys of this process, the data keys it has opened, and whose payloads a
transaction writes.

A data key is read from `data_keys` and unwrapped once, then kept in memory for `TTL`
seconds: a key forgotten (`agent-jobs forget`) or re-wrapped elsewhere is read again
within that time by every process. A key this transaction created is used by it at
once and kept for others only once the transaction commits (a rollback takes the row
with it).

The owner of the payloads a transaction writes is set by the store where it learns
whose run it writes (`own`: a run's insert, its row locked); it holds until the
transaction ends. With encryption on, a payload written with no owner fails
(`PayloadOwnerError`), never in the clear.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, event, select

from ..errors import PayloadForgottenError, PayloadKeyError, PayloadOwnerError
from ..store import data_keys as rows
from ..store.db import READ_ONLY, schema_of
from ..store.schema import runs
from . import envelope

TTL = 60.0  # seconds an opened data key is used before it is read again


@dataclass(frozen=True, slots=True)
class DataKey:
    id: str
    actor: str
    key: bytes


class Keyring:
    """The master keys (id to 32 bytes) and the current one's id (None: nothing is
    encrypted, and a sealed payload read fails, naming its key)."""

    def __init__(self, masters: dict[str, bytes], current: str | None) -> None:
        self.masters = masters
        self.current = current
        self._by_id: dict[str, tuple[DataKey, float]] = {}
        self._by_actor: dict[str, tuple[DataKey, float]] = {}
        self._lock = threading.Lock()
        self._engines: list[weakref.ref[Engine]] = []

    def __repr__(self) -> str:  # never the keys
        return f"Keyring(masters={sorted(self.masters)}, current={self.current!r})"

    @property
    def encrypting(self) -> bool:
        return self.current is not None

    # --- the cache -------------------------------------------------------------------

    def _cached(self, table: dict[str, tuple[DataKey, float]], name: str) -> DataKey | None:
        found = table.get(name)
        if found is None or found[1] < time.monotonic():
            return None
        return found[0]

    def keep(self, key: DataKey, engine: Engine | None = None) -> None:
        until = time.monotonic() + TTL
        with self._lock:
            self._by_id[key.id] = (key, until)
            if engine is not None:
                self._by_actor[_database(engine) + key.actor] = (key, until)

    def drop_all(self) -> None:
        with self._lock:
            self._by_id.clear()
            self._by_actor.clear()

    def remember(self, engine: Engine) -> None:
        """An engine whose `data_keys` a read looks in for a key it has not opened."""
        with self._lock:
            self._engines = [r for r in self._engines if r() is not None and r() is not engine]
            self._engines.append(weakref.ref(engine))

    def engines_of(self, other: Keyring) -> None:
        """Look in the databases `other` looks in."""
        with other._lock:
            self._engines = list(other._engines)

    # --- wrapping --------------------------------------------------------------------

    def wrap(self, key_id: str, actor: str, key: bytes) -> tuple[bytes, str]:
        """The data key wrapped by the current master key, and that key's id."""
        if self.current is None:
            raise PayloadOwnerError("encryption is off: no master key wraps data keys")
        master = self.masters[self.current]
        return envelope.seal(master, key, envelope.wrap_aad(key_id, actor)), self.current

    def unwrap(self, row: Any) -> DataKey:
        """The data key of a `data_keys` row, or PayloadKeyError saying why not."""
        if row.wrapped is None:
            raise PayloadForgottenError(
                f"the data of actor {row.actor!r} was forgotten: data key {row.id} "
                "was destroyed, and what it sealed cannot be read",
                key_id=row.id,
            )
        master = self.masters.get(row.master_key_id)
        if master is None:
            raise PayloadKeyError(
                f"data key {row.id} is wrapped by master key {row.master_key_id!r}, which "
                "this process does not have: add it to AGENT_JOBS_ENCRYPTION_KEYS",
                key_id=row.id,
            )
        try:
            key = envelope.unseal(master, bytes(row.wrapped), envelope.wrap_aad(row.id, row.actor))
        except envelope.Unsealable:
            raise PayloadKeyError(
                f"master key {row.master_key_id!r} does not open data key {row.id}: "
                "a wrong key under that id, or a changed row",
                key_id=row.id,
            ) from None
        return DataKey(row.id, row.actor, key)

    # --- writing: the actor's data key -----------------------------------------------

    def for_actor(self, conn: Connection, actor: str) -> DataKey:
        """The actor's live data key, made (in this transaction) if it has none."""
        cached = self._cached(self._by_actor, _database(conn.engine) + actor)
        if cached is not None:
            return cached
        row = rows.live_key(conn, actor)
        if row is not None:
            key = self.unwrap(row)
            self.keep(key, conn.engine)
            return key
        key_id, secret = uuid.uuid4().hex, envelope.new_key()
        wrapped, master_key_id = self.wrap(key_id, actor, secret)
        if rows.add_key(
            conn, key_id=key_id, actor=actor, wrapped=wrapped, master_key_id=master_key_id
        ):
            made = DataKey(key_id, actor, secret)
            _listen(conn.engine)
            _opened(conn).made.append(made)
            return made
        row = rows.live_key(conn, actor)  # another transaction made it first
        if row is None:
            raise PayloadOwnerError(f"no data key could be made for actor {actor!r}")
        key = self.unwrap(row)
        self.keep(key, conn.engine)
        return key

    # --- reading: a key by its id ----------------------------------------------------

    def by_id(self, key_id: str) -> DataKey:
        owner = _OWNER.get()
        if owner is not None and owner.id == key_id:
            return owner
        cached = self._cached(self._by_id, key_id)
        if cached is not None:
            return cached
        if not self.masters:
            raise PayloadKeyError(
                f"this payload is sealed under data key {key_id}, and this process has no "
                "master keys: set AGENT_JOBS_ENCRYPTION_KEYS",
                key_id=key_id,
            )
        row = self._read(key_id)
        if row is None:
            raise PayloadKeyError(f"no data key {key_id} in this database", key_id=key_id)
        key = self.unwrap(row)
        self.keep(key)
        return key

    def _read(self, key_id: str) -> Any | None:
        """The key's row, on a connection of its own (the reader's may be in the middle
        of a result): from the engine being read (`reading`), else the newest that has it.
        The reader's engine first: each engine asked takes a connection of its pool."""
        with self._lock:
            engines = [e for e in (r() for r in reversed(self._engines)) if e is not None]
        first = _READING.get()
        if first is not None:
            engines = [first, *(e for e in engines if e is not first)]
        failure: Exception | None = None
        for engine in engines:
            try:
                # Read-only: on SQLite a writing block takes the write lock at BEGIN,
                # and the reader's own may hold it (it would wait on itself).
                with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
                    row = rows.by_id(conn, key_id)
            except Exception as exc:  # a store since closed: the next one may have it
                failure = exc
                continue
            if row is not None:
                return row
        if failure is not None and len(engines) == 1:
            raise PayloadKeyError(
                f"data key {key_id} could not be read: {type(failure).__name__}", key_id=key_id
            ) from failure
        return None


_OWNER: ContextVar[DataKey | None] = ContextVar("agent_jobs_payload_owner", default=None)
# The engine a store block reads from: where a key it has not opened is looked for first.
_READING: ContextVar[Engine | None] = ContextVar("agent_jobs_reading_engine", default=None)
# Reads that show a forgotten actor's payloads as FORGOTTEN instead of failing: the runs
# list, so that a forgotten actor's runs stay listed with their ids and statuses.
_SHOW_FORGOTTEN: ContextVar[bool] = ContextVar("agent_jobs_show_forgotten", default=False)


@contextmanager
def forgotten_shown() -> Iterator[None]:
    """Within it, a payload of a forgotten actor reads as FORGOTTEN (codec.py)."""
    token = _SHOW_FORGOTTEN.set(True)
    try:
        yield
    finally:
        _SHOW_FORGOTTEN.reset(token)


def showing_forgotten() -> bool:
    return _SHOW_FORGOTTEN.get()


_KEYRING = Keyring({}, None)
_LISTENING: weakref.WeakSet[Engine] = weakref.WeakSet()


def keyring() -> Keyring:
    return _KEYRING


def set_keyring(found: Keyring) -> None:
    global _KEYRING
    _KEYRING = found


def owner_key() -> DataKey | None:
    """The data key new payloads are sealed under; None when encryption is off."""
    if not _KEYRING.encrypting:
        return None
    key = _OWNER.get()
    if key is None:
        raise PayloadOwnerError(
            "a payload was to be written with encryption on, but no run's actor owns it; "
            "nothing was written (the store must set the owner where it writes a run's rows)"
        )
    return key


def own(conn: Connection, actor: str, run_id: str | None = None) -> None:
    """The payloads this transaction writes from here on are `actor`'s (the actor of run
    `run_id`, if given), until it ends."""
    found = _KEYRING
    if not found.encrypting:
        return
    if run_id is not None:
        note_actor(run_id, actor)
    current = _OWNER.get()
    if current is not None and current.actor == actor:
        return
    key = found.for_actor(conn, actor)
    _listen(conn.engine)
    found.remember(conn.engine)
    _opened(conn).tokens.append(_OWNER.set(key))


def own_run(conn: Connection, run_id: str) -> None:
    """`own` for the actor of run `run_id` (known to this process, or read: a run's
    actor never changes); nothing for an unknown run."""
    if not _KEYRING.encrypting:
        return
    actor = _ACTORS.get(run_id)
    if actor is None:
        actor = conn.execute(select(runs.c.actor).where(runs.c.id == run_id)).scalar()
        if actor is None:
            return
    own(conn, actor, run_id)


def note_actor(run_id: str, actor: str) -> None:
    """Run `run_id` is `actor`'s (read with it): `own_run` then needs no query."""
    if _KEYRING.encrypting and _ACTORS.get(run_id) != actor:
        _ACTORS[run_id] = actor
        if len(_ACTORS) > _ACTORS_KEPT:
            del _ACTORS[next(iter(_ACTORS))]


def own_thread(conn: Connection, thread_id: str) -> None:
    """For a write of a thread's and no run's (a message queued on it, a model chosen
    for it), unless an owner is set: the actor of the thread's newest run."""
    if not _KEYRING.encrypting or _OWNER.get() is not None:
        return
    found = conn.execute(
        select(runs.c.id, runs.c.actor)
        .where(runs.c.thread_id == thread_id)
        .order_by(runs.c.created_at.desc())
        .limit(1)
    ).first()
    if found is not None:
        own(conn, found.actor, found.id)


def owns(conn: Connection, run_id: str | None, thread_id: str | None = None) -> None:
    """A store write of run `run_id`'s rows (or, with no run, of thread `thread_id`'s):
    its actor owns the payloads, unless this transaction's owner is that actor already."""
    if not _KEYRING.encrypting:
        return
    if run_id is not None:
        own_run(conn, run_id)
    elif thread_id is not None:
        own_thread(conn, thread_id)


# The actors of runs this process wrote for (a run's actor never changes).
_ACTORS: dict[str, str] = {}
_ACTORS_KEPT = 10_000


@contextmanager
def reading(engine: Engine) -> Iterator[None]:
    """The payloads read in this block are `engine`'s: their keys are looked for there."""
    token = _READING.set(engine)
    try:
        yield
    finally:
        _READING.reset(token)


@contextmanager
def owner_scope(engine: Engine, actor: str) -> Iterator[None]:
    """The payloads written in this block (in any transaction) are `actor`'s: for a
    runner that drives one run's writes over many transactions. Entered outside any
    transaction (the actor's key may be made in one of its own)."""
    found = _KEYRING
    if not found.encrypting:
        yield
        return
    key = found._cached(found._by_actor, _database(engine) + actor)
    if key is None:
        with engine.begin() as conn:
            key = found.for_actor(conn, actor)
        found.keep(key, engine)
    found.remember(engine)
    token = _OWNER.set(key)
    try:
        yield
    finally:
        _OWNER.reset(token)


def _database(engine: Engine) -> str:
    """Which database (and schema) an engine writes to: an actor's key is its own there."""
    return f"{engine.url}|{schema_of(engine) or ''}|"


def _listen(engine: Engine) -> None:
    if engine in _LISTENING:
        return
    _LISTENING.add(engine)
    event.listen(engine, "commit", _committed)
    event.listen(engine, "rollback", _rolled_back)


@dataclass(slots=True)
class _Open:
    """What a transaction set (the owner) and made (data keys), let go or kept at its end."""

    tokens: list[Token[DataKey | None]] = field(default_factory=list)
    made: list[DataKey] = field(default_factory=list)


# By connection, not in its `info`: a connection whose database connection was lost has
# no `info` left when its rollback is reported, and the owner it set must still be let go
# (the error the caller sees is then the lost connection's, as without encryption).
_OPEN: weakref.WeakKeyDictionary[Connection, _Open] = weakref.WeakKeyDictionary()
_OPEN_LOCK = threading.Lock()


def _opened(conn: Connection) -> _Open:
    with _OPEN_LOCK:
        found = _OPEN.get(conn)
        if found is None:
            found = _OPEN[conn] = _Open()
        return found


def _end(conn: Connection, *, committed: bool) -> None:
    with _OPEN_LOCK:
        found = _OPEN.pop(conn, None)
    if found is None:
        return
    for token in reversed(found.tokens):
        try:
            _OWNER.reset(token)
        except ValueError:  # set in another context: that context's value is its own
            _OWNER.set(None)
    if committed:
        for key in found.made:
            _KEYRING.keep(key, conn.engine)


def _committed(conn: Connection) -> None:
    _end(conn, committed=True)


def _rolled_back(conn: Connection) -> None:
    _end(conn, committed=False)
