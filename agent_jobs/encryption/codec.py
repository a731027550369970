"""The codec that seals payloads on their way into the database and opens them on
their way out (agent_jobs/store/payloads.py), under the data key of the actor who owns
them (keyring.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import PayloadForgottenError, PayloadKeyError
from . import envelope
from .keyring import DataKey, keyring, owner_key, showing_forgotten

# What a forgotten actor's payload reads as where the runs list shows it.
FORGOTTEN = "(forgotten)"


class EncryptionCodec:
    """Seals with the transaction's owner's data key when encryption is on; opens what
    it sealed whatever the setting (a process without the key fails naming it), and
    leaves a clear value as it is."""

    def encode_json(self, value: Any) -> Any:
        key = owner_key()
        if key is None:
            return envelope.escaped_json(value)
        return envelope.json_form(key.id, _seal(key, envelope.dumps(value)))

    def decode_json(self, stored: Any) -> Any:
        escaped, value = envelope.unescaped_json(stored)
        if escaped:
            return value
        found = _read(envelope.read_json_form, stored)
        if found is None:
            return stored
        try:
            return envelope.loads(_open(*found))
        except PayloadForgottenError:
            if showing_forgotten():
                return {"forgotten": True}
            raise

    def encode_text(self, value: str) -> str:
        key = owner_key()
        if key is None:
            return envelope.escaped_text(value)
        return envelope.text_form(key.id, _seal(key, value.encode()))

    def decode_text(self, stored: str) -> str:
        if stored.startswith(envelope.TEXT_ESCAPE):
            return stored[len(envelope.TEXT_ESCAPE) :]
        found = _read(envelope.read_text_form, stored)
        if found is None:
            return stored
        try:
            return _open(*found).decode()
        except PayloadForgottenError:
            if showing_forgotten():
                return FORGOTTEN
            raise


def _read(form: Callable[[Any], tuple[str, bytes] | None], stored: Any) -> tuple[str, bytes] | None:
    try:
        return form(stored)
    except envelope.Unsealable as exc:
        raise PayloadKeyError(f"a sealed payload is damaged: {exc}", key_id="") from None


def _seal(key: DataKey, plain: bytes) -> bytes:
    return envelope.seal(key.key, plain, envelope.payload_aad(key.id))


def _open(key_id: str, sealed: bytes) -> bytes:
    key = keyring().by_id(key_id)
    try:
        return envelope.unseal(key.key, sealed, envelope.payload_aad(key_id))
    except envelope.Unsealable:
        raise PayloadKeyError(
            f"a payload sealed under data key {key_id} does not open: its bytes were "
            "changed, or the key is not the one it was sealed with",
            key_id=key_id,
        ) from None
