"""People's part: what waits for the caller, deciding calls, answering questions.

A decision through the API is the command every door calls (`agent_jobs.commands`:
`record_decision`'s checks — the approver's roles, `args_sha256`, the first decision wins
— under the run's lock), recorded as the token's actor; then the run is released. What it
refuses is answered by its type (http/errors.py).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from . import sse
from .access import owned_run, readable_run
from .auth import CallerDep
from .bodies import AnswersBody, DecisionBody, Recorded
from .errors import (
    ERROR_RESPONSES,
    ConflictError,
    ErrorBody,
)
from .inbox import inbox
from .polled import polled_events
from .state import server

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
    events = polled_events(
        state, lambda: inbox(state.door, caller), first, release, f"inbox of {caller.actor}"
    )
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers=sse.HEADERS,
        background=BackgroundTask(release.at_the_end),
    )


@router.post("/v1/runs/{run_id}/approvals/{call_id}", response_model=Recorded, responses=REFUSALS)
def decide(
    run_id: str, call_id: str, body: DecisionBody, request: Request, caller: CallerDep
) -> Recorded:
    """Approve or reject a pending action call, as the token's actor."""
    door = server(request).door
    readable_run(door, caller, run_id)
    recorded = door.commands.decide(
        run_id,
        call_id,
        body.decision,
        actor=caller.actor,
        reason=body.reason,
        args_sha256=body.args_sha256,
    )
    if not recorded:  # say by whom, as the inbox shows it
        call = door.store.tool_call(run_id, call_id) or {}
        raise ConflictError(
            f"call {call_id} of run {run_id} was already decided: {call.get('decision')} by "
            f"{call.get('decided_by')}"
        )
    return Recorded(recorded=True)


@router.post("/v1/runs/{run_id}/answers/{request_id}", response_model=Recorded, responses=REFUSALS)
def answer(
    run_id: str, request_id: str, body: AnswersBody, request: Request, caller: CallerDep
) -> Recorded:
    """Answer a tool's questions, as the token's actor (the run's actor or a service)."""
    door = server(request).door
    owned_run(door, caller, run_id, "answer its questions")
    if not door.commands.answer(run_id, request_id, dict(body.answers), actor=caller.actor):
        raise ConflictError(f"question {request_id} of run {run_id} was already answered")
    return Recorded(recorded=True)
