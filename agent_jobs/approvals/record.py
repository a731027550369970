"""Recording human decisions on `action` calls: verified, first decision wins."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from sqlalchemy import Connection

from .. import checkpoints as names
from ..app import AgentApp
from ..checkpoints import Decision
from ..errors import (
    ArgumentsChangedError,
    DecisionRefusedError,
    InvalidRequestError,
    NotAnApproverError,
    NotWaitingError,
    RunEndedError,
    UnknownCallError,
    UnknownQuestionError,
    UnknownRunError,
)
from ..messages import args_sha256
from ..observability import observe
from ..store import journal, questions, runs, toolcalls
from ..store.db import contains_nul

Recorded = Literal["recorded", "already_decided"]
MAX_ANSWER = 10_000  # characters of one answer
MAX_QUESTION_ID = 200


def record_decision(
    conn: Connection,
    app: AgentApp,
    run_id: str,
    call_id: str,
    decision: Decision,
    *,
    expected_args_sha256: str | None = None,
) -> Recorded:
    """Check and record `decision` in the caller's transaction.

    Raises `UnknownRunError`, `UnknownCallError`, or a `DecisionRefusedError` saying why:
    `NotAnApproverError` (an actor without an approver role: judged first, so it learns
    nothing of the call's state), `NotWaitingError`, `RunEndedError`,
    `ArgumentsChangedError`; nothing is written then. Returns "already_decided" when
    another decision came first.
    """
    # The run's lock: a run that ends while the decision is checked ends before it or
    # after it is recorded, never in between.
    run, call = locked_call(conn, run_id, call_id)
    if contains_nul([decision.actor, decision.reason]):
        raise DecisionRefusedError("the actor and the reason must not contain NUL characters")
    check_approver(app, call, decision.actor)
    if call.status != "pending_approval":
        if call.decision is not None:
            return "already_decided"
        raise NotWaitingError(
            f"call {call_id} of run {run_id} is {call.status}, not waiting for a decision"
        )
    if run.status in runs.TERMINAL:
        raise RunEndedError(
            f"run {run_id} has ended ({run.status}): call {call_id} can no longer be decided"
        )
    if expected_args_sha256 is not None and expected_args_sha256 != args_sha256(call.args):
        raise ArgumentsChangedError(
            f"args_sha256 does not match the arguments of call {call_id}: "
            "the decision was made on different arguments"
        )
    if not toolcalls.decide(
        conn,
        run_id,
        call_id,
        decision=decision.decision,
        actor=decision.actor,
        reason=decision.reason,
    ):
        return "already_decided"
    step = names.approval(call_id)
    journal.complete(conn, run_id, step, state="done", result=decision.model_dump(mode="json"))
    observe.decided(run, call, decision.decision, step)  # the caller commits it next
    return "recorded"


def locked_call(conn: Connection, run_id: str, call_id: str) -> tuple[Any, Any]:
    """The run's row, locked until the transaction ends, and its call's; `UnknownRunError`
    or `UnknownCallError` when there is none."""
    run = runs.lock_run(conn, run_id)
    if run is None:
        raise UnknownRunError(run_id)
    call = toolcalls.get_call(conn, run_id, call_id)
    if call is None:
        raise UnknownCallError(run_id, call_id)
    return run, call


def decider_roles(
    app: AgentApp, tool: str, escalated_to: Iterable[str] | None
) -> tuple[str, ...] | None:
    """The roles that may decide a call of `tool` now, sorted: the roles it was escalated
    to (approvals/deadlines.py), else the tool's approvers; None when anyone may (a tool
    that names none, or one the app no longer defines). Every door judges by this."""
    if escalated_to is not None:
        return tuple(sorted(escalated_to))
    approvers = app.registry.get(tool).approvers if tool in app.registry else None
    return tuple(sorted(approvers)) if approvers is not None else None


def may_decide(app: AgentApp, actor: str, tool: str, escalated_to: Iterable[str] | None) -> bool:
    """Whether `actor`'s decision on a call of `tool` counts (`decider_roles`)."""
    roles = decider_roles(app, tool, escalated_to)
    return roles is None or bool(set(roles) & app.roles.roles_of(actor))


def escalated_to(call: Any) -> list[str] | None:
    """The roles a call's row was escalated to; None if it was not."""
    return list(call.approvers or ()) if call.escalated else None


def check_approver(app: AgentApp, call: Any, actor: str, doing: str = "decide on") -> None:
    """`NotAnApproverError` unless `actor` may decide `call` (its row)."""
    escalated = escalated_to(call)
    if not may_decide(app, actor, call.name, escalated):
        roles = ", ".join(decider_roles(app, call.name, escalated) or ())
        raise NotAnApproverError(
            f"actor {actor!r} may not {doing} {call.name}: it needs one of the roles {roles}"
        )


def record_answers(
    conn: Connection, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str
) -> Recorded:
    """Record a person's answers to a tool's questions; the first answers win.

    Raises `UnknownRunError`, `UnknownQuestionError`, `RunEndedError`, a
    `DecisionRefusedError` for answers that are not text of a sane size, or
    `InvalidRequestError` for answers that do not answer exactly the questions asked;
    nothing is written then. Returns "already_decided" when they were answered already.
    """
    run = runs.lock_run(conn, run_id)  # as in `record_decision`
    if run is None:
        raise UnknownRunError(run_id)
    asked = questions.get(conn, run_id, request_id)
    if asked is None:
        raise UnknownQuestionError(f"run {run_id} asked no question {request_id!r}")
    _check_answers(answers, actor)
    if asked.answers is not None:
        return "already_decided"
    if run.status in runs.TERMINAL:
        raise RunEndedError(
            f"run {run_id} has ended ({run.status}): question {request_id} can no longer "
            "be answered"
        )
    wanted = {str(q.get("id")) for q in asked.questions if isinstance(q, dict)}
    if set(answers) != wanted:
        raise InvalidRequestError(
            f"invalid request: answers must answer the questions {', '.join(sorted(wanted))} "
            f"and no others, not {', '.join(sorted(str(k) for k in answers))}"
        )
    if not questions.answer(conn, run_id, request_id, answers=answers, actor=actor):
        return "already_decided"
    journal.complete(
        conn,
        run_id,
        names.answers(request_id),
        state="done",
        result={"answers": answers, "actor": actor},
    )
    return "recorded"


def _check_answers(answers: Any, actor: str) -> None:
    if not isinstance(answers, dict):
        raise DecisionRefusedError("answers must be an object of question id to answer")
    if contains_nul([answers, actor]):
        raise DecisionRefusedError("answers must not contain NUL characters")
    if any(len(str(k)) > MAX_QUESTION_ID or len(str(v)) > MAX_ANSWER for k, v in answers.items()):
        raise DecisionRefusedError(
            f"an answer may be at most {MAX_ANSWER} characters long, a question id "
            f"{MAX_QUESTION_ID}"
        )


def decision_from_call(call: Any) -> Decision | None:
    """The decision stored on a tool-call row, if one was made."""
    if call is None or call.decision is None:
        return None
    return Decision(decision=call.decision, actor=call.decided_by, reason=call.decision_reason)
