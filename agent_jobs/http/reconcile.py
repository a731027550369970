"""Saying how a call whose outcome is unknown ended: `POST /v1/runs/{run_id}/reconcile/{call_id}`.

A non-idempotent action whose worker died while its handler ran is not run again; its run
waits, `awaiting_reconcile`, with an `outcome_unknown` frame. Who may decide: the tool's
approvers (as for its approval) and `service` actors, among those who may read the run.
The command (`agent_jobs.commands`, `agent_jobs.approvals.reconcile`) checks it under the
run's lock; what it refuses is answered by its type (http/errors.py).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ..approvals.reconcile import MAX_ERROR, Reconciliation
from ..errors import InvalidRequestError
from .access import readable_run
from .auth import CallerDep
from .bodies import Recorded
from .errors import ERROR_RESPONSES, ErrorBody
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
    if body.outcome == "succeeded" and "result" not in body.model_fields_set:
        raise InvalidRequestError("invalid request: result: needed when the call succeeded")
    decision = Reconciliation(body.outcome, caller.actor, body.result, body.error)
    door.commands.reconcile(run_id, call_id, decision)
    return Recorded(recorded=True)
