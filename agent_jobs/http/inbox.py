"""What waits for the caller: the pending calls their roles may decide, the questions
they may answer (`GET /v1/approvals` and its event stream)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..messages import args_sha256
from .access import may_decide
from .auth import Caller
from .door import Door


def _iso(value: Any) -> str | None:
    if not isinstance(value, datetime):
        return None
    moment: datetime = value
    if moment.tzinfo is None:  # SQLite hands back naive times; they are UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


def inbox(door: Door, caller: Caller) -> dict[str, list[dict[str, Any]]]:
    """`{"approvals": [...], "questions": [...]}`, oldest first, from the store."""
    approvals = [
        {
            "run_id": call["run_id"],
            "call_id": call["call_id"],
            "tool": call["name"],
            "args": call["args"],
            "args_sha256": args_sha256(call["args"]),
            "actor": call["actor"],
            "agent": call["agent"],
            "requested_at": _iso(call["requested_at"] or call["created_at"]),
            "deadline": _iso(call["approval_deadline"]),
            "escalated": bool(call["escalated"]),
        }
        for call in door.store.pending_calls()
        if may_decide(door.app, caller, call)
    ]
    questions = [
        {
            "run_id": asked["run_id"],
            "request_id": asked["request_id"],
            "tool": asked["tool"],
            "questions": asked["questions"],
            "actor": asked["actor"],
            "requested_at": _iso(asked["created_at"]),
        }
        for asked in door.store.open_questions()
        if caller.is_service or asked["actor"] == caller.actor
    ]
    return {"approvals": approvals, "questions": questions}
