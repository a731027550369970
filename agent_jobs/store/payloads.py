"""The columns that keep what a run saw, and the one place their values pass through.

Every payload the store keeps (run input and output, messages, tool arguments and
results, journal intents and results, session events, questions and answers, metadata,
notifications' bodies) is in a column of type `Payload` (JSON) or `PayloadText` (text).
A value goes through `Codecs.encode_*` on its way into the database and `Codecs.decode_*`
on its way out, on every path: SQLAlchemy's own statements and the durable runner's
statements on the driver (agent_jobs/store/driver.py applies the same processors). With
no codec installed both are the identity, and the columns are what they were: JSONB on
Postgres, JSON text on SQLite, plain text.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import JSON, Dialect, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator, TypeEngine


class Codec(Protocol):
    """One transformation of stored payloads. `encode_json` takes the JSON value about to
    be written and gives the JSON value to write; `decode_json` the reverse; the text
    pair does the same for text columns. A codec leaves alone what it did not write (a
    row from before it was installed reads as it is)."""

    def encode_json(self, value: Any) -> Any: ...
    def decode_json(self, stored: Any) -> Any: ...
    def encode_text(self, value: str) -> str: ...
    def decode_text(self, stored: str) -> str: ...


class Codecs:
    """The codecs of this process, applied in order on the way in and in reverse on the
    way out."""

    installed: tuple[Codec, ...] = ()

    @classmethod
    def encode_json(cls, value: Any) -> Any:
        for codec in cls.installed:
            value = codec.encode_json(value)
        return value

    @classmethod
    def decode_json(cls, stored: Any) -> Any:
        for codec in reversed(cls.installed):
            stored = codec.decode_json(stored)
        return stored

    @classmethod
    def encode_text(cls, value: str) -> str:
        for codec in cls.installed:
            value = codec.encode_text(value)
        return value

    @classmethod
    def decode_text(cls, stored: str) -> str:
        for codec in reversed(cls.installed):
            stored = codec.decode_text(stored)
        return stored


def stored(value: Any) -> Any:
    """A JSON payload as its column keeps it: for a statement that writes payloads it
    carries inside a document of its own (Postgres' `jsonb_to_recordset`), where no
    column type sees them."""
    if value is None or not Codecs.installed:
        return value
    return Codecs.encode_json(value)


class Payload(TypeDecorator[Any]):
    """A JSON payload: JSONB on Postgres, JSON text on SQLite."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return stored(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None or not Codecs.installed:
            return value
        return Codecs.decode_json(value)


class PayloadText(TypeDecorator[str]):
    """A text payload."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or not Codecs.installed:
            return value
        return Codecs.encode_text(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or not Codecs.installed:
            return value
        return Codecs.decode_text(value)
