"""Stored text on a terminal: shown as text, never as markup, with nothing hidden.

A run's input, its actor, a tool's arguments and results, a model's words: all of it
comes from outside, and a terminal obeys some characters instead of showing them.
Escape sequences restyle or move the cursor, bidi overrides reorder what follows,
zero-width characters vanish. Each such character is shown as its escape instead.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime
from typing import Any

# Control and format characters (escape sequences, bidi overrides, zero-width marks),
# line and paragraph separators, surrogates, private-use and unassigned code points.
_HIDING = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: object, *, keep: str = "") -> str:
    """`text` with each character that could hide, move or reorder what is shown
    escaped (`\\x1b`, `\\u202e`), but those in `keep` (say, newlines in a model's text)."""
    shown = text if isinstance(text, str) else str(text)
    if shown.isprintable():  # the common case: nothing to escape
        return shown
    return "".join(
        _escaped(c) if c not in keep and unicodedata.category(c) in _HIDING else c for c in shown
    )


def json_text(value: Any, *, indent: int | None = None) -> str:
    """`value` as JSON for a person to read: whole, and with nothing hidden.

    With `indent`, one member a line, so padding in one value cannot push the next
    off the screen.
    """
    if indent is None:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
        return visible(text)
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    return visible(text, keep="\n")  # JSON escapes newlines in strings: these are its own


def stamp(moment: datetime) -> str:
    """A moment as every command prints one: ISO 8601 in UTC, to the millisecond
    (`2026-12-05T11:17:33.123Z`). A naive one (SQLite's) is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
