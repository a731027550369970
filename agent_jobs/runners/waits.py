"""A human wait, described once for both runners.

A turn that needs a person (a decision on an `action` call, answers to a tool's
questions) journals a `waiting` row, parks the run with a label saying what it waits
on, and streams two frames: the parking `status`, then the request itself. When the
person has spoken the row is `done`, the run is `running` again and says so. How a
runner waits (a future in-process, a suspended pass durably) is its own business;
what is recorded and what a stream reader sees is written here alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from .. import checkpoints as names
from .. import timers
from ..approvals.deadlines import deadline_fields
from ..approvals.record import decision_from_call
from ..checkpoints import Answers, Decision
from ..hooks import AnswersWait, ApprovalWait
from ..messages import ToolCall
from ..store import questions as question_rows
from ..store import runs as run_rows
from ..store import toolcalls

FrameSpec = tuple[str, dict[str, Any]]

RESUMED: FrameSpec = ("status", {"status": "running"})
PARKED: frozenset[str] = frozenset(
    {"awaiting_approval", "awaiting_answers", "awaiting_reconcile", "sleeping"}
)


@dataclass(frozen=True)
class HumanWait:
    """What a turn records and streams while it waits for a person."""

    step: str  # the journal row the person's decision or answers complete
    status: run_rows.RunStatus  # the run's status while it waits
    label: str  # `waiting_on`: what the run waits for, e.g. `awaiting_approval refund call_2`
    intent: dict[str, Any]  # the row's journaled intent
    frames: tuple[FrameSpec, ...]  # streamed once the row is committed: status, request


def approval(wait: ApprovalWait, deadline: datetime | None = None) -> HumanWait:
    """A decision on one `action` call (`deadline`: when it times out, if it does)."""
    call = wait.call
    return HumanWait(
        step=names.approval(call.id),
        status="awaiting_approval",
        label=waiting_label(call.name, call.id),
        intent={"call_id": call.id, "tool": call.name, "args": call.args},
        frames=(
            ("status", {"status": "awaiting_approval", "call_id": call.id, "tool": call.name}),
            (
                "approval_request",
                {
                    "call_id": call.id,
                    "tool": call.name,
                    "args": call.args,
                    "args_sha256": wait.args_sha256,
                    **deadline_fields(deadline),
                },
            ),
        ),
    )


def answers(wait: AnswersWait) -> HumanWait:
    """A person's answers to the questions a tool asked."""
    call = wait.call
    return HumanWait(
        step=names.answers(wait.request_id),
        status="awaiting_answers",
        label=f"awaiting_answers {call.name} {wait.request_id}",
        intent={"request_id": wait.request_id, "call_id": call.id, "tool": call.name},
        frames=(
            ("status", {"status": "awaiting_answers", "request_id": wait.request_id}),
            (
                "question",
                {
                    "request_id": wait.request_id,
                    "call_id": call.id,
                    "tool": call.name,
                    "questions": wait.questions,
                },
            ),
        ),
    )


def outcome_unknown(run_id: str, step: str, call: ToolCall) -> HumanWait:
    """A call whose handler began on a worker that died before its result was recorded:
    the tool's `reconcile` found nothing, so a person says how it ended (the tool step's
    row, `waiting`, is what they complete)."""
    return HumanWait(
        step=step,
        status="awaiting_reconcile",
        label=f"awaiting_reconcile {call.name} {call.id}",
        intent={"call_id": call.id, "tool": call.name, "args": call.args},
        frames=(
            ("status", {"status": "awaiting_reconcile", "call_id": call.id, "tool": call.name}),
            (
                "outcome_unknown",
                {
                    "call_id": call.id,
                    "tool": call.name,
                    "args": call.args,
                    "idempotency_key": f"{run_id}:{step}",
                },
            ),
        ),
    )


def sleeping(call: ToolCall, wake_at: datetime) -> HumanWait:
    """What a run that sleeps on `call` records and streams."""
    when = timers.iso(wake_at)
    reason = call.args.get("reason")
    intent: dict[str, Any] = {"call_id": call.id, "tool": call.name, "wake_at": when}
    timer: dict[str, Any] = {"call_id": call.id, "wake_at": when}
    if isinstance(reason, str):
        intent["reason"] = timer["reason"] = reason
    return HumanWait(
        step=names.timer(call.id),
        status="sleeping",
        label=timers.label(call.id, when),
        intent=intent,
        frames=(
            ("status", {"status": "sleeping", "call_id": call.id, "wake_at": when}),
            ("timer", timer),
        ),
    )


def recorded_sleep(row_intent: Any, call: ToolCall) -> tuple[HumanWait, datetime]:
    """The wait as its journal row recorded it, and its wake time."""
    wake_at = timers.wake_at_of(row_intent)
    return sleeping(call, wake_at), wake_at


def waiting_label(tool: str, call_id: str) -> str:
    """How a run parked on a decision says where it stands."""
    return f"awaiting_approval {tool} {call_id}"


def decision_result(decision: Decision) -> dict[str, Any]:
    """The approval row's result."""
    return decision.model_dump(mode="json")


def answers_result(given: dict[str, Any]) -> dict[str, Any]:
    """The answers row's result, as a runner that saw the answers itself records it."""
    return {"answers": given}


def recorded_decision(result: Any) -> Decision:
    return Decision.model_validate(result)


def recorded_answers(result: Any) -> dict[str, Any]:
    return dict(Answers.model_validate(result).answers)


def decided(conn: Connection, run_id: str, wait: ApprovalWait) -> Decision | None:
    """The decision already on the call's record, if a person made one."""
    return decision_from_call(toolcalls.get_call(conn, run_id, wait.call.id))


def ask(conn: Connection, run_id: str, wait: AnswersWait) -> dict[str, Any] | None:
    """Put the questions on the record (once); the answers, if already given."""
    asked = question_rows.get(conn, run_id, wait.request_id)
    if asked is None:
        question_rows.ask(
            conn,
            run_id=run_id,
            request_id=wait.request_id,
            call_id=wait.call.id,
            tool=wait.call.name,
            asked=wait.questions,
        )
        return None
    return dict(asked.answers) if asked.answers is not None else None


def answered(conn: Connection, run_id: str, request_id: str) -> dict[str, Any] | None:
    """The answers on the record, once a person gave them."""
    asked = question_rows.get(conn, run_id, request_id)
    return dict(asked.answers) if asked is not None and asked.answers is not None else None
