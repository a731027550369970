"""Saying how a call whose outcome is unknown ended: `POST /v1/runs/{run_id}/reconcile/{call_id}`.

A non-idempotent action whose worker died while its handler ran is not run again; its run
waits, `awaiting_reconcile`, with an `outcome_unknown` frame. Who may decide: the tool's
approvers (as for its approval) and `service` actors, among those who may read the run.
The checks below come first only to answer with the right status; the recording
(`agent_jobs.reconciliation`) checks again, under the run's lock.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidRequestError, ReconcileRefusedError, UnknownCallError
from ..reconciliation import MAX_ERROR, Reconciliation, may_reconcile
from .access import readable_run
from .auth import CallerDep
from .bodies import Recorded
from .errors import ERROR_RESPONSES, ConflictError, ErrorBody, PermissionDeniedError
from .state import server

router = APIRouter(tags=["approvals"], responses=ERROR_RESPONSES)
REFUSALS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run or call (or none this actor sees)"},
    409: {"model": ErrorBody, "description": "The call is not awaiting reconciliation"},
}


class ReconcileBody(BaseModel):
    """`succeeded` with the call's `result` (any JSON), `failed` with the `error` the model
    is told, or `retry` alone."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["succeeded", "failed", "retry"]
    result: Any = None
    error: str | None = Field(default=None, min_length=1, max_length=MAX_ERROR)


@router.post("/v1/runs/{run_id}/reconcile/{call_id}", response_model=Recorded, responses=REFUSALS)
def reconcile(
    run_id: str, call_id: str, body: ReconcileBody, request: Request, caller: CallerDep
) -> Recorded:
    """Say how a call whose outcome is unknown ended, as the token's actor; the run goes on
    (`retry`: the handler runs again)."""
    door = server(request).door
    readable_run(door, caller, run_id)
    call = door.store.tool_call(run_id, call_id)
    if call is None:
        raise UnknownCallError(run_id, call_id)
    tool = str(call["name"])
    if not may_reconcile(door.app, tool, caller.actor):
        approvers = ", ".join(sorted(door.app.registry.get(tool).approvers or ()))
        raise PermissionDeniedError(
            f"actor {caller.actor!r} may not say how {tool} ended: it needs one of the roles "
            f"{approvers}, or service"
        )
    if body.outcome == "succeeded" and "result" not in body.model_fields_set:
        raise InvalidRequestError("invalid request: result: needed when the call succeeded")
    decision = Reconciliation(body.outcome, caller.actor, body.result, body.error)
    try:
        door.reconcile(run_id, call_id, decision)
    except ReconcileRefusedError as exc:  # the state moved on since the checks above
        raise ConflictError(str(exc)) from None
    return Recorded(recorded=True)
