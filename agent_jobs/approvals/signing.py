"""Signing approvals-channel messages: HMAC-SHA256 over the message's canonical JSON."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from ..messages import canonical_json


def sign(message: dict[str, Any], secret: str) -> str:
    """Hex HMAC-SHA256 of the message without `sig`, as canonical JSON: sorted keys,
    separators `(",", ":")`, UTF-8, non-ASCII characters unescaped."""
    body = {k: v for k, v in message.items() if k != "sig"}
    return hmac.new(
        secret.encode("utf-8"), canonical_json(body).encode("utf-8"), hashlib.sha256
    ).hexdigest()


def verify_signature(message: dict[str, Any], secret: str) -> bool:
    """Whether `sig` is the message's signature; False, never an exception, for
    anything a sender can put in the message."""
    sig = message.get("sig")
    # compare_digest raises TypeError on non-ASCII text, and a hex digest is ASCII.
    if not isinstance(sig, str) or not sig.isascii():
        return False
    try:
        expected = sign(message, secret)
    except (UnicodeEncodeError, RecursionError):
        # A lone surrogate (JSON "\ud800") has no UTF-8 form, and JSON nested about as
        # deep as the parser allows can be too deep to serialise again: neither can be
        # checked, so neither is signed.
        return False
    return hmac.compare_digest(sig, expected)
