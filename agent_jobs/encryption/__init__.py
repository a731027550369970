"""Encryption at rest: every payload the store keeps, sealed (AES-GCM) under a data key
of the actor whose run it belongs to, each data key wrapped by a master key of
`AGENT_JOBS_ENCRYPTION_KEYS` (docs/security.md, "Encryption at rest").

`envelope.py` seals and opens bytes and gives the stored forms, `keyring.py` keeps the
master keys, the opened data keys and the owner of what a transaction writes,
`codec.py` is the payload codec (agent_jobs/store/payloads.py), `maintenance.py` rotates,
forgets and encrypts what is clear.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ..errors import ConfigurationError
from ..store.payloads import Codecs
from .codec import EncryptionCodec
from .envelope import KEY_BYTES
from .keyring import Keyring, keyring, own, own_run, set_keyring

__all__ = ["EncryptionCodec", "Keyring", "configure", "keyring", "master_keys", "own", "own_run"]

_CONFIGURED = False


def master_keys(keys: str | None, key_id: str | None) -> tuple[dict[str, bytes], str | None]:
    """The master keys of the settings' text and the current id, checked: a clear error
    that names no key's bytes."""
    if keys is None or not keys.strip():
        if key_id:
            raise ConfigurationError(
                "AGENT_JOBS_ENCRYPTION_KEY_ID is set but AGENT_JOBS_ENCRYPTION_KEYS is not"
            )
        return {}, None
    try:
        found: Any = json.loads(keys)
    except ValueError:
        raise ConfigurationError(
            "AGENT_JOBS_ENCRYPTION_KEYS is not JSON: it must be an object of key id to "
            "the base64 of 32 bytes"
        ) from None
    if not isinstance(found, dict) or not found:
        raise ConfigurationError(
            "AGENT_JOBS_ENCRYPTION_KEYS must be a non-empty JSON object of key id to the "
            "base64 of 32 bytes"
        )
    masters: dict[str, bytes] = {}
    for name, text in found.items():
        try:
            raw = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                f"AGENT_JOBS_ENCRYPTION_KEYS: key {name!r} is not base64"
            ) from None
        if len(raw) != KEY_BYTES:
            raise ConfigurationError(
                f"AGENT_JOBS_ENCRYPTION_KEYS: key {name!r} is not {KEY_BYTES} bytes "
                f'(make one with: python -c "import base64, os; '
                f'print(base64.b64encode(os.urandom(32)).decode())")'
            )
        masters[name] = raw
    if key_id is None and len(masters) == 1:
        key_id = next(iter(masters))
    if key_id is None:
        raise ConfigurationError(
            "AGENT_JOBS_ENCRYPTION_KEY_ID must name the key of AGENT_JOBS_ENCRYPTION_KEYS "
            "that wraps new data keys"
        )
    if key_id not in masters:
        raise ConfigurationError(
            f"AGENT_JOBS_ENCRYPTION_KEY_ID {key_id!r} is not among AGENT_JOBS_ENCRYPTION_KEYS "
            f"({', '.join(sorted(masters))})"
        )
    return masters, key_id


def configure(keys: str | None = None, key_id: str | None = None, *, settings: bool = True) -> None:
    """Install the codec with the master keys of the settings (or those given, with
    `settings=False`). Installed even with no keys: a sealed payload is then refused,
    naming its key, instead of shown sealed."""
    global _CONFIGURED
    if settings:
        from ..settings import get_settings

        config = get_settings()
        secret = config.encryption_keys
        keys = secret.get_secret_value() if secret is not None else None
        key_id = config.encryption_key_id
    masters, current = master_keys(keys, key_id)
    ring = Keyring(masters, current)
    ring.engines_of(keyring())  # the stores opened so far
    set_keyring(ring)
    others = tuple(c for c in Codecs.installed if not isinstance(c, EncryptionCodec))
    Codecs.installed = (EncryptionCodec(), *others)
    _CONFIGURED = True


def ensure_configured() -> None:
    """`configure` from the settings, once per process."""
    if not _CONFIGURED:
        configure()
