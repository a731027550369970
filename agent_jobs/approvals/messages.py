"""Messages on the approvals channel: parsed, verified, or refused with a reason.

Their fields, signing and refusals are documented in docs/humans.md, "Approvals on the
Redis channel".

Nothing here touches a database: a message is refused for what it is (too large, not
JSON, badly signed, malformed) before anything looks it up.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..runs import ID_PATTERN
from ..store.db import contains_nul
from .signing import verify_signature

HEX64 = r"^[0-9a-fA-F]{64}$"
# Printable, no spaces or control characters: ids end up in log lines.
CALL_ID = r"^[!-~]{1,200}$"
NAME = r"^[^\x00-\x1f\x7f]{1,200}$"
DEFAULT_MAX_BYTES = 64 * 1024

Reason = Literal[
    "too_large",
    "invalid_json",
    "not_an_object",
    "unknown_type",
    "bad_signature",
    "invalid_message",
]


class Refused(Exception):
    """A message that can never be recorded; `reason` is the counter it goes to."""

    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason: Reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    run_id: str = Field(pattern=ID_PATTERN)
    actor: str = Field(pattern=NAME)
    sig: str | None = Field(default=None, pattern=HEX64)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # Postgres text cannot hold NUL: refuse it here rather than fail at the INSERT.
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class ApprovalMessage(_Message):
    """`{"type": "approval", "run_id", "call_id", "decision", "actor", "reason"?,
    "args_sha256"?, "sig"?}`"""

    type: Literal["approval"]
    call_id: str = Field(pattern=CALL_ID)
    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=2000)
    args_sha256: str | None = Field(default=None, pattern=HEX64)


class AnswersMessage(_Message):
    """`{"type": "answers", "run_id", "request_id", "answers": {...}, "actor", "sig"?}`"""

    type: Literal["answers"]
    request_id: str = Field(pattern=CALL_ID)
    answers: dict[str, Any]

    @field_validator("answers")
    @classmethod
    def _no_nul_inside(cls, value: dict[str, Any]) -> dict[str, Any]:
        if contains_nul(value):
            raise ValueError("must not contain NUL characters, at any depth")
        return value


ChannelMessage = ApprovalMessage | AnswersMessage
_TYPES: dict[str, type[ApprovalMessage] | type[AnswersMessage]] = {
    "approval": ApprovalMessage,
    "answers": AnswersMessage,
}


def parse_message(
    raw: bytes | str, *, secret: str | None, max_bytes: int = DEFAULT_MAX_BYTES
) -> ChannelMessage:
    """Parse and verify one message; raises `Refused` saying why it cannot count.

    With a `secret`, a message must carry `sig`, the hex HMAC-SHA256 of the message
    without `sig` as canonical JSON. `args_sha256` is checked later, against the call.
    """
    size = len(raw.encode("utf-8")) if isinstance(raw, str) else len(raw)
    if size > max_bytes:
        raise Refused("too_large", f"{size} bytes, more than the limit of {max_bytes}")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Refused("invalid_json", f"not valid UTF-8 JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise Refused("not_an_object", f"a JSON {type(data).__name__}, not an object")
    kind = data.get("type")
    model = _TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise Refused("unknown_type", "`type` must be 'approval' or 'answers'")
    if secret is not None:
        if "sig" not in data:
            raise Refused("bad_signature", "unsigned, and AGENT_JOBS_APPROVAL_SECRET is set")
        if not verify_signature(data, secret):
            raise Refused("bad_signature", "the signature does not match the message")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        faults = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(message)'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise Refused("invalid_message", faults) from None
