"""What waits for the caller: the pending calls their roles may decide, the questions
they may answer (`GET /v1/approvals` and its event stream)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..app import AgentApp
from ..documents import iso
from ..messages import args_sha256
from .access import may_decide
from .auth import Caller
from .door import Door

# Of a run's input, what a card shows: enough to judge the call by.
MAX_SHOWN_INPUT = 2000


def _at_deadline(app: AgentApp, call: Mapping[str, Any]) -> str | None:
    """What becomes of the call if no one decides by its deadline: `approved`,
    `rejected` or `escalated to <roles>` (an escalated call's second deadline rejects)."""
    if call["approval_deadline"] is None:
        return None
    if call["escalated"] or call["name"] not in app.registry:
        return "rejected"
    tool = app.registry.get(call["name"])
    if tool.on_timeout == "approve":
        return "approved"
    if tool.on_timeout == "escalate":
        return f"escalated to {', '.join(sorted(tool.escalate_to or ()))}"
    return "rejected"


def inbox(door: Door, caller: Caller) -> dict[str, list[dict[str, Any]]]:
    """`{"approvals": [...], "questions": [...]}`, oldest first, from the store. An
    approval says what an approver needs to judge it: the call, the agent, what the run
    was asked and what the model said when it made the call, and what its deadline does."""
    calls = [c for c in door.store.pending_calls() if may_decide(door.app, caller, c)]
    said = door.store.said_with({(c["run_id"], c["call_id"]) for c in calls})
    approvals = [
        {
            "run_id": call["run_id"],
            "call_id": call["call_id"],
            "tool": call["name"],
            "args": call["args"],
            "args_sha256": args_sha256(call["args"]),
            "actor": call["actor"],
            "agent": call["agent"],
            "input": call["input"][:MAX_SHOWN_INPUT],
            "input_cut": len(call["input"]) > MAX_SHOWN_INPUT,
            "said": said.get((call["run_id"], call["call_id"]), ""),
            "requested_at": iso(call["requested_at"] or call["created_at"]),
            "deadline": iso(call["approval_deadline"]),
            "escalated": bool(call["escalated"]),
            "then": _at_deadline(door.app, call),
        }
        for call in calls
    ]
    questions = [
        {
            "run_id": asked["run_id"],
            "request_id": asked["request_id"],
            "tool": asked["tool"],
            "questions": asked["questions"],
            "actor": asked["actor"],
            "requested_at": iso(asked["created_at"]),
        }
        for asked in door.store.open_questions()
        if caller.is_service or asked["actor"] == caller.actor
    ]
    return {"approvals": approvals, "questions": questions}
