"""People's part: what waits for the caller, deciding calls, answering questions.

A decision through the API goes through the checks a signed message on the approvals
channel goes through (`record_decision`: the approver's roles, `args_sha256`, the first
decision wins), recorded as the token's actor; then the run is released. The checks
below come first only to answer with the right status; the recording checks again,
under the run's lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ..errors import DecisionRefusedError, InvalidRequestError, UnknownCallError
from ..messages import args_sha256
from . import sse
from .access import approvers_of, may_decide, owned_run, readable_run
from .auth import Caller, CallerDep
from .bodies import AnswersBody, DecisionBody, Recorded
from .errors import (
    DATABASE_ERRORS,
    ERROR_RESPONSES,
    ConflictError,
    ErrorBody,
    NotFoundError,
    PermissionDeniedError,
)
from .inbox import inbox
from .state import Release, ServerState, server

log = logging.getLogger(__name__)
router = APIRouter(tags=["approvals"], responses=ERROR_RESPONSES)
REFUSALS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run or call (or none this actor sees)"},
    409: {"model": ErrorBody, "description": "Already decided, or the run has ended"},
}


@router.get("/v1/approvals")
def approvals(request: Request, caller: CallerDep) -> dict[str, list[dict[str, Any]]]:
    """The pending calls the caller's roles may decide and the questions they may
    answer, oldest first."""
    return inbox(server(request).door, caller)


@router.get(
    "/v1/approvals/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The inbox"}},
)
async def approvals_stream(request: Request, caller: CallerDep) -> StreamingResponse:
    """`GET /v1/approvals` as server-sent events: the whole list at once, then again
    each time it changes; comments keep the connection alive meanwhile."""
    state = server(request)
    first = await run_in_threadpool(inbox, state.door, caller)
    release = state.slots.claim(caller.actor)
    return StreamingResponse(
        _inbox_events(state, caller, first, release),
        media_type="text/event-stream",
        headers=sse.HEADERS,
        background=BackgroundTask(release.at_the_end),
    )


async def _inbox_events(
    state: ServerState, caller: Caller, doc: dict[str, Any], release: Release
) -> AsyncIterator[bytes]:
    """Polls the store (the truth for what waits), every `api_inbox_poll` seconds."""
    settings = state.settings
    sent, number, quiet = "", 0, 0.0
    try:
        yield sse.RETRY
        while True:
            body = json.dumps(doc, ensure_ascii=False, sort_keys=True)
            if body != sent:
                number += 1
                sent, quiet = body, 0.0
                yield sse.event(body, id=str(number))
            elif quiet >= settings.api_keepalive:
                quiet = 0.0
                yield sse.KEEPALIVE
            await asyncio.sleep(settings.api_inbox_poll)
            quiet += settings.api_inbox_poll
            try:
                doc = await run_in_threadpool(inbox, state.door, caller)
            except DATABASE_ERRORS as exc:  # the list stands until the store answers again
                log.warning("the inbox of %s could not be read: %s", caller.actor, exc)
    finally:
        release()


@router.post("/v1/runs/{run_id}/approvals/{call_id}", response_model=Recorded, responses=REFUSALS)
def decide(
    run_id: str, call_id: str, body: DecisionBody, request: Request, caller: CallerDep
) -> Recorded:
    """Approve or reject a pending action call, as the token's actor."""
    door = server(request).door
    run = readable_run(door, caller, run_id)
    call = door.store.tool_call(run_id, call_id)
    if call is None:
        raise UnknownCallError(run_id, call_id)
    tool = str(call["name"])
    if not may_decide(door.app, caller, call):
        approvers = ", ".join(approvers_of(door.app, call))
        raise PermissionDeniedError(
            f"actor {caller.actor!r} may not decide on {tool}: it needs one of the roles "
            f"{approvers}"
        )
    if call["decision"] is not None:
        raise ConflictError(
            f"call {call_id} of run {run_id} was already decided: {call['decision']} by "
            f"{call['decided_by']}"
        )
    if run.finished:
        raise ConflictError(
            f"run {run_id} has ended ({run.status}): call {call_id} can no longer be decided"
        )
    if call["status"] != "pending_approval":
        raise ConflictError(f"call {call_id} of run {run_id} is not waiting for a decision")
    if body.args_sha256 is not None and body.args_sha256 != args_sha256(call["args"]):
        raise ConflictError(
            f"args_sha256 does not match the arguments of call {call_id}: the decision "
            "was made on other arguments"
        )
    try:
        recorded = door.decide(
            run_id,
            call_id,
            body.decision,
            actor=caller.actor,
            reason=body.reason,
            args_sha256=body.args_sha256,
        )
    except DecisionRefusedError as exc:  # the state moved on since the checks above
        raise ConflictError(str(exc)) from None
    if not recorded:
        raise ConflictError(f"call {call_id} of run {run_id} was already decided")
    return Recorded(recorded=True)


@router.post("/v1/runs/{run_id}/answers/{request_id}", response_model=Recorded, responses=REFUSALS)
def answer(
    run_id: str, request_id: str, body: AnswersBody, request: Request, caller: CallerDep
) -> Recorded:
    """Answer a tool's questions, as the token's actor (the run's actor or a service)."""
    door = server(request).door
    run = owned_run(door, caller, run_id, "answer its questions")
    asked = door.store.question(run_id, request_id)
    if asked is None:
        raise NotFoundError(f"run {run_id} asked no question {request_id!r}")
    if asked["answers"] is not None:
        raise ConflictError(f"question {request_id} of run {run_id} was already answered")
    if run.finished:
        raise ConflictError(
            f"run {run_id} has ended ({run.status}): question {request_id} can no longer "
            "be answered"
        )
    wanted = {str(q.get("id")) for q in asked["questions"] if isinstance(q, dict)}
    if set(body.answers) != wanted:
        raise InvalidRequestError(
            f"invalid request: answers must answer the questions {', '.join(sorted(wanted))} "
            f"and no others, not {', '.join(sorted(body.answers))}"
        )
    try:
        recorded = door.answer(run_id, request_id, dict(body.answers), actor=caller.actor)
    except DecisionRefusedError as exc:
        raise ConflictError(str(exc)) from None
    if not recorded:
        raise ConflictError(f"question {request_id} of run {run_id} was already answered")
    return Recorded(recorded=True)
