"""AES-GCM, twice: a payload sealed under its actor's data key, a data key wrapped by a
master key. Pure functions of bytes; the stored forms say what sealed them, so a reader
needs no context to open one, and a clear value (written before encryption was on) is
told apart from a sealed one by its form alone."""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # AES-GCM's standard nonce, random per seal
JSON_MARK = "$enc"  # {"$enc": 1, "k": <data key id>, "d": <base64 nonce + ciphertext>}
TEXT_MARK = "$enc$1$"  # "$enc$1$<data key id>$<base64 nonce + ciphertext>"
VERSION = 1


class Unsealable(Exception):
    """The bytes do not open under the key: a wrong key, or tampered bytes."""


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=KEY_BYTES * 8)


def seal(key: bytes, plain: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plain, aad)


def unseal(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    if len(sealed) < NONCE_BYTES + 16:
        raise Unsealable("too short")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise Unsealable("the tag does not match") from None


def wrap_aad(data_key_id: str, actor: str) -> bytes:
    """What a wrapped data key is bound to: its id and its actor (a wrapped key copied to
    another row does not open there)."""
    return b"agent-jobs data key\x00" + data_key_id.encode() + b"\x00" + actor.encode()


def payload_aad(data_key_id: str) -> bytes:
    return b"agent-jobs payload\x00" + data_key_id.encode()


# --- the stored forms ----------------------------------------------------------------


def json_form(data_key_id: str, sealed: bytes) -> dict[str, Any]:
    return {JSON_MARK: VERSION, "k": data_key_id, "d": base64.b64encode(sealed).decode()}


def text_form(data_key_id: str, sealed: bytes) -> str:
    return f"{TEXT_MARK}{data_key_id}${base64.b64encode(sealed).decode()}"


# A clear value that would read as sealed (a caller's metadata shaped like a JSON form, a
# text that starts like a sealed one) is written escaped, and read back as it was.
ESCAPED = 0  # {"$enc": 0, "v": <the clear value>}
TEXT_ESCAPE = "$enc$0$"  # "$enc$0$<the clear text>"


def escaped_json(value: Any) -> Any:
    """`value` as written clear: escaped if it looks like a stored form of this module."""
    if isinstance(value, dict) and JSON_MARK in value:
        return {JSON_MARK: ESCAPED, "v": value}
    return value


def escaped_text(value: str) -> str:
    if value.startswith("$enc$"):
        return TEXT_ESCAPE + value
    return value


def unescaped_json(stored: Any) -> tuple[bool, Any]:
    """(True, the clear value) of an escaped JSON value; (False, None) otherwise."""
    if not (isinstance(stored, dict) and len(stored) == 2 and "v" in stored):
        return False, None
    if stored.get(JSON_MARK) != ESCAPED:
        return False, None
    return True, stored["v"]


def read_json_form(stored: Any) -> tuple[str, bytes] | None:
    """(data key id, sealed bytes) of a sealed JSON value; None for a clear one."""
    if not (isinstance(stored, dict) and JSON_MARK in stored and len(stored) == 3):
        return None
    key_id, data = stored.get("k"), stored.get("d")
    if stored[JSON_MARK] != VERSION or not isinstance(key_id, str) or not isinstance(data, str):
        return None
    return key_id, _b64(data, key_id)


def read_text_form(stored: str) -> tuple[str, bytes] | None:
    """(data key id, sealed bytes) of a sealed text; None for a clear one."""
    if not stored.startswith(TEXT_MARK):
        return None
    key_id, sep, data = stored[len(TEXT_MARK) :].partition("$")
    if not sep or not key_id:
        return None
    return key_id, _b64(data, key_id)


def _b64(data: str, key_id: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise Unsealable(f"the payload under data key {key_id} is not base64") from None


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def loads(plain: bytes) -> Any:
    return json.loads(plain)
