"""Recording human decisions on `action` calls: verified, first decision wins."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Connection

from .. import checkpoints as names
from .. import observe
from ..app import AgentApp
from ..checkpoints import Decision
from ..errors import DecisionRefusedError, UnknownCallError, UnknownRunError
from ..messages import args_sha256
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

    Raises `UnknownRunError`, `UnknownCallError` or `DecisionRefusedError` (an actor
    without an approver role, arguments that changed, a run that has ended; nothing is
    written then). Returns "already_decided" when another decision came first.
    """
    # The run's lock: a run that ends while the decision is checked ends before it or
    # after it is recorded, never in between.
    run = runs.get_run(conn, run_id, for_update=True)
    if run is None:
        raise UnknownRunError(run_id)
    call = toolcalls.get_call(conn, run_id, call_id)
    if call is None:
        raise UnknownCallError(run_id, call_id)
    if call.status != "pending_approval":
        if call.decision is not None:
            return "already_decided"
        raise DecisionRefusedError(
            f"call {call_id} of run {run_id} is {call.status}, not waiting for a decision"
        )
    if run.status in runs.TERMINAL:
        raise DecisionRefusedError(
            f"run {run_id} has ended ({run.status}): call {call_id} can no longer be decided"
        )
    if contains_nul([decision.actor, decision.reason]):
        raise DecisionRefusedError("the actor and the reason must not contain NUL characters")
    if expected_args_sha256 is not None and expected_args_sha256 != args_sha256(call.args):
        raise DecisionRefusedError(
            f"args_sha256 does not match the arguments of call {call_id}: "
            "the decision was made on different arguments"
        )
    if call.name in app.registry:
        tool = app.registry.get(call.name)
        # An escalated call is for the roles it was escalated to (approvals/deadlines.py).
        escalated = call.approvers if call.escalated else None
        if not app.roles.may_approve(tool, decision.actor, escalated):
            approvers = ", ".join(sorted(escalated or tool.approvers or ()))
            raise DecisionRefusedError(
                f"actor {decision.actor!r} may not decide on {call.name}: "
                f"it needs one of the roles {approvers}"
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


def record_answers(
    conn: Connection, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str
) -> Recorded:
    """Record a person's answers to a tool's questions; the first answers win.

    Raises `UnknownRunError`, or `DecisionRefusedError` when no such question is open
    (none was asked, or the run has ended).
    """
    run = runs.get_run(conn, run_id, for_update=True)  # as in `record_decision`
    if run is None:
        raise UnknownRunError(run_id)
    asked = questions.get(conn, run_id, request_id)
    if asked is None:
        raise DecisionRefusedError(f"run {run_id} asked no question {request_id!r}")
    if not isinstance(answers, dict):
        raise DecisionRefusedError("answers must be an object of question id to answer")
    if contains_nul([answers, actor]):
        raise DecisionRefusedError("answers must not contain NUL characters")
    if any(len(str(k)) > MAX_QUESTION_ID or len(str(v)) > MAX_ANSWER for k, v in answers.items()):
        raise DecisionRefusedError(
            f"an answer may be at most {MAX_ANSWER} characters long, a question id "
            f"{MAX_QUESTION_ID}"
        )
    if asked.answers is not None:
        return "already_decided"
    if run.status in runs.TERMINAL:
        raise DecisionRefusedError(
            f"run {run_id} has ended ({run.status}): question {request_id} can no longer "
            "be answered"
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


def decision_from_call(call: Any) -> Decision | None:
    """The decision stored on a tool-call row, if one was made."""
    if call is None or call.decision is None:
        return None
    return Decision(decision=call.decision, actor=call.decided_by, reason=call.decision_reason)
