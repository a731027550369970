"""Payloads too large to keep inline: stored apart, addressed by their SHA-256.

A codec of the payload columns (agent_jobs/store/payloads.py), installed last: it sees
what the others made of a value (an encrypted one, with encryption on). A value whose
compact JSON (a text column's text) is at most `AGENT_JOBS_PAYLOAD_INLINE_LIMIT` bytes
passes as it is. In a larger one, each string larger than a quarter of the limit goes to
`payload_blobs` as its UTF-8 bytes; if what is left is still over the limit, or is not a
JSON object, it goes there too, as JSON. The column keeps a small reference instead:

- a JSON object keeps its keys, its large strings replaced by references, and is marked:
  `{"$payload_blobs": "inline", "type": …, "text": {"$payload_blob": "<sha256 hex>",
  "size": <bytes>, "as": "text"}}`;
- stored apart whole, a JSON value is `{"$payload_blobs": <a reference, "as": "json">}`,
  with, for an object, its top-level keys of short strings, numbers and booleans beside
  the mark: a query on them (a journal intent's `type`) still finds the row;
- a text column keeps `agent-jobs-blob:sha256:<hex>:<bytes>`.

A row of `payload_blobs` is its bytes' SHA-256: the same bytes are kept once, however many
columns, steps or runs hold them (a tool's result is in its journal row, its tool call,
its message and the next model request: one blob). A blob is written with an `INSERT …
ON CONFLICT` (a second write only moves `written_at` on, for the prune's grace) on the
connection whose statement binds the value, before that statement and in its transaction
(the connection is `driver.CONNECTION`, set by every statement): a blob commits or rolls
back with the row that refers to it, and a read later in the transaction finds it. On
SQLite, one writer at a time, no other connection could write it while the transaction
is open.

On read, a reference is fetched on the reading connection and its bytes hashed: a blob
missing or not matching its digest fails the read (`PayloadBlobError`, naming the digest);
nothing is made of it. A part over `AGENT_JOBS_PAYLOAD_MAX` is refused here too
(`PayloadTooLargeError`), a backstop: a step's own payload is measured before it is
stored (`oversize`, called by the executor), and fails the step.

A value written before this codec, or small, never looks like a reference: the keys
`$payload_blobs` and `$payload_blob` and the text prefix are this module's. A value that
would (a JSON object with the key `$payload_blobs`, a text with the prefix) is itself
stored apart whole, so it reads back as it was.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, event, select
from sqlalchemy.dialects import postgresql, sqlite

from ..errors import PayloadBlobError, PayloadTooLargeError
from ..settings import get_settings
from . import driver
from .payloads import Codecs
from .schema import payload_blobs

WRAPPED = "$payload_blobs"  # marks a JSON column's value with parts stored apart
INLINE = "inline"  # the mark of an object kept inline but for its references
REFERENCE = "$payload_blob"  # one part stored apart
TEXT_PREFIX = "agent-jobs-blob:sha256:"
# A string this short is under any inline limit (at least 1024 bytes) however encoded.
_SHORT = 170
_REFERENCE_KEYS = frozenset((REFERENCE, "size", "as"))
_HEX = frozenset("0123456789abcdef")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_MEASURE: dict[str, Any] = {"ensure_ascii": False, "separators": (",", ":"), "default": str}


def _utf8_size(text: str) -> int:
    """The UTF-8 size of `text`; without encoding it when it is ASCII (`isascii` is O(1))."""
    return len(text) if text.isascii() else len(text.encode())


# --- measuring -----------------------------------------------------------------------


def _chars(value: Any, most: int) -> int:
    """A lower bound of the UTF-8 size of `value`'s JSON: the length of its strings and
    keys, summed until it passes `most` (then it stops: that is enough to refuse)."""
    total, stack = 0, [value]
    while stack and total <= most:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def oversize(value: Any, what: str, most: int | None = None) -> PayloadTooLargeError | None:
    """The error to fail a step with when `value` (a tool's result, a model's reply) is
    over `AGENT_JOBS_PAYLOAD_MAX`, else None. Cheap where it can be: a string longer (in
    characters) than the maximum is refused without being encoded, a structure whose
    strings alone pass it without being serialized; otherwise it is serialized once."""
    if most is None:
        most = get_settings().payload_max
    if value is None or isinstance(value, bool | int | float):
        return None
    lower = _chars(value, most)
    if lower > most:
        return PayloadTooLargeError(what, lower, most)
    if isinstance(value, str) and len(value) * 4 <= most:
        return None  # at most 4 bytes a character
    # `default=str`: a value JSON cannot hold as it is (a date) is converted later, by
    # the step's result model; its text is about its size.
    text = value if isinstance(value, str) else json.dumps(value, **_MEASURE)
    size = _utf8_size(text)
    return PayloadTooLargeError(what, size, most) if size > most else None


# --- writing -------------------------------------------------------------------------


@dataclass
class _Writer:
    """Writes the blobs of one value on the connection binding it."""

    conn: Connection
    inline: int
    most: int
    written: set[str]

    def put(self, data: bytes) -> tuple[str, int]:
        size = len(data)
        if size > self.most:
            raise PayloadTooLargeError("a stored payload", size, self.most)
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self.written:
            values = {"sha256": digest, "size": size, "data": data, "written_at": _now()}
            self.conn.execute(_insert(self.conn.dialect.name), values)
            self.written.add(digest)
        return digest, size

    def text(self, value: str) -> dict[str, Any]:
        digest, size = self.put(value.encode())
        return {REFERENCE: digest, "size": size, "as": "text"}

    def split(self, value: Any) -> Any:
        """`value` with each string over a quarter of the inline limit replaced by a
        reference to its blob."""
        leaf = self.inline // 4
        if isinstance(value, str):
            return self.text(value) if len(value) * 4 > leaf and _utf8_size(value) > leaf else value
        if isinstance(value, dict):
            return {k: self.split(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.split(v) for v in value]
        return value


def _now() -> datetime:
    return datetime.now(UTC)


_INSERTS: dict[str, Any] = {}


def _insert(dialect: str) -> Any:
    statement = _INSERTS.get(dialect)
    if statement is None:
        made = postgresql.insert if dialect == "postgresql" else sqlite.insert
        insert = made(payload_blobs)
        # Kept once; a later write only moves its time on, so a prune's grace covers it.
        statement = _INSERTS[dialect] = insert.on_conflict_do_update(
            index_elements=[payload_blobs.c.sha256],
            set_={"written_at": insert.excluded.written_at},
        )
    return statement


def _connection() -> Connection:
    conn = driver.CONNECTION.get()
    if conn is None or conn.closed:
        raise RuntimeError("a large payload is bound or read outside a store connection")
    return conn


def _limits() -> tuple[int, int]:
    settings = get_settings()
    return settings.payload_inline_limit, settings.payload_max


# --- reading -------------------------------------------------------------------------


def fetch(conn: Connection, digest: str, size: int | None = None) -> bytes:
    """The bytes of blob `digest`, checked against it; `PayloadBlobError` otherwise."""
    if len(digest) != 64 or not _HEX.issuperset(digest):
        raise PayloadBlobError(digest, "is not a SHA-256 digest")
    row = conn.execute(select(payload_blobs.c.data).where(payload_blobs.c.sha256 == digest)).first()
    if row is None:
        raise PayloadBlobError(digest, "is missing")
    data = bytes(row[0])
    if hashlib.sha256(data).hexdigest() != digest or (size is not None and len(data) != size):
        raise PayloadBlobError(digest, "does not match its digest")
    return data


def _is_reference(value: Any) -> bool:
    return type(value) is dict and value.keys() == _REFERENCE_KEYS


def _resolve(conn: Connection, value: Any) -> Any:
    if _is_reference(value):
        data = fetch(conn, str(value[REFERENCE]), int(value["size"]))
        if value["as"] == "text":
            return data.decode()
        return _resolve(conn, json.loads(data))
    if isinstance(value, dict):
        return {k: _resolve(conn, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(conn, v) for v in value]
    return value


def references(stored: Any) -> list[tuple[str, str]]:
    """The blobs a stored value refers to as it is in its column (not decoded): (digest,
    "text" or "json") pairs. A "json" blob may refer to more (read it, and ask again)."""
    if isinstance(stored, str):
        if stored.startswith(TEXT_PREFIX):
            return [(stored[len(TEXT_PREFIX) :].partition(":")[0], "text")]
        if f'"{WRAPPED}"' not in stored:
            return []
        stored = json.loads(stored)  # a JSON column as SQLite (or a cast to text) gives it
    if not (type(stored) is dict and WRAPPED in stored):
        return []
    found, stack = [], [stored[WRAPPED] if _is_reference(stored[WRAPPED]) else stored]
    while stack:
        item = stack.pop()
        if _is_reference(item):
            found.append((str(item[REFERENCE]), str(item["as"])))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


# --- the codec -----------------------------------------------------------------------


class BlobCodec:
    """Stores payloads over the inline limit apart (see the module's docstring)."""

    def encode_json(self, value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str) and len(value) <= _SHORT:
            return value
        inline, most = _limits()
        if isinstance(value, str):
            if len(value) > most:  # over the maximum however it is encoded
                raise PayloadTooLargeError("a stored payload", len(value), most)
            if len(value) * 6 + 2 <= inline:  # a character's JSON is at most 6 bytes
                return value
        marked = type(value) is dict and WRAPPED in value
        if not marked:
            text = _compact(value)
            if len(text) * 4 <= inline or _utf8_size(text) <= inline:
                return value
            del text
        writer = _Writer(_connection(), inline, most, set())
        if isinstance(value, str):
            return {WRAPPED: writer.text(value)}
        inner = writer.split(value)
        kept = type(value) is dict and not marked
        if kept and _utf8_size(_compact(inner)) <= inline:
            return {WRAPPED: INLINE, **inner}
        digest, size = writer.put(_compact(inner).encode())
        whole: dict[str, Any] = {WRAPPED: {REFERENCE: digest, "size": size, "as": "json"}}
        if kept:
            whole.update((k, v) for k, v in value.items() if _short(v))
        return whole

    def decode_json(self, stored: Any) -> Any:
        if type(stored) is not dict or WRAPPED not in stored:
            return stored
        mark = stored[WRAPPED]
        if _is_reference(mark):
            return _resolve(_connection(), mark)
        return _resolve(_connection(), {k: v for k, v in stored.items() if k != WRAPPED})

    def encode_text(self, value: str) -> str:
        if len(value) <= _SHORT and not value.startswith(TEXT_PREFIX):
            return value
        inline, most = _limits()
        prefixed = value.startswith(TEXT_PREFIX)
        if len(value) * 4 <= inline and not prefixed:
            return value
        if len(value) > most:
            raise PayloadTooLargeError("a stored payload", len(value), most)
        if _utf8_size(value) <= inline and not prefixed:
            return value
        writer = _Writer(_connection(), inline, most, set())
        digest, size = writer.put(value.encode())
        return f"{TEXT_PREFIX}{digest}:{size}"

    def decode_text(self, stored: str) -> str:
        if not stored.startswith(TEXT_PREFIX):
            return stored
        digest, _, size = stored[len(TEXT_PREFIX) :].partition(":")
        return fetch(_connection(), digest, int(size) if size.isdigit() else None).decode()


def _short(value: Any) -> bool:
    """A top-level value kept beside the mark of an object stored apart whole."""
    if isinstance(value, str):
        return len(value) <= 200
    return value is None or isinstance(value, bool | int | float)


def install() -> None:
    """Make the blob codec the last of this process's codecs (once)."""
    if not any(isinstance(codec, BlobCodec) for codec in Codecs.installed):
        Codecs.installed = (*Codecs.installed, BlobCodec())


def watch(engine: Engine) -> None:
    """Tell the codec which connection SQLAlchemy's statements on `engine` run on."""
    event.listen(engine, "before_execute", _before_execute)


def _before_execute(conn: Connection, *_: Any) -> None:
    driver.CONNECTION.set(conn)


__all__ = ["BlobCodec", "fetch", "install", "oversize", "references", "watch"]
