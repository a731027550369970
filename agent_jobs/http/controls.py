"""Operator controls over HTTP: `POST /v1/runs/{run_id}/pause`, `/resume`, `/retry` and
`/fork` (docs/operating.md, "Operator controls: pause, resume, retry, fork").

Who may: the run's actor, `service` and `operator` actors, as for a cancel (http/access.py): another
actor who may read the run is refused (403), anyone else is told there is no such run
(404). Each control is recorded as the token's actor. One that does not apply to the run
as it stands (it has ended, is not paused, did not fail on a step) is 409; a step the run
cannot be forked at, 422. A refusal changes nothing.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ..commands import Commands
from .access import controlled_run
from .auth import CallerDep
from .errors import ERROR_RESPONSES, ErrorBody
from .state import server

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=ERROR_RESPONSES)
REFUSALS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run (or none this actor may read)"},
    409: {"model": ErrorBody, "description": "The control does not apply to the run now"},
}


class Pausing(BaseModel):
    pausing: list[str]  # the run and its delegated runs asked to pause


class Resuming(BaseModel):
    resuming: list[str]  # the run and its delegated runs resumed


class Retrying(BaseModel):
    run_id: str
    retrying: list[str]  # the failed steps that run again


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: str = Field(min_length=1, max_length=300, description="The step to fork at")
    keep_decisions: bool = Field(
        default=False,
        description="Keep the decisions made before the fork point on calls that run again, "
        "as the caller's own (who must be able to make each); else they are asked again",
    )


class RunsAgain(BaseModel):
    step: str
    tool: str
    call_id: str


class Forked(BaseModel):
    run_id: str
    thread_id: str
    forked_from: str
    at: str
    runs_again: list[RunsAgain]  # steps with side effects that ran in the source
    asked_again: list[RunsAgain]  # `action` calls a person is asked about again
    kept_decisions: list[RunsAgain]  # decisions kept as the caller's own


def _controlled(request: Request, caller: Any, run_id: str, doing: str) -> Commands:
    door = server(request).door
    controlled_run(door, caller, run_id, doing)
    return door.commands


@router.post("/{run_id}/pause", status_code=202, response_model=Pausing, responses=REFUSALS)
def pause(run_id: str, request: Request, caller: CallerDep) -> Pausing:
    """Pause the run (and its delegated runs) at its next step boundary: `paused`, it
    holds no worker until it is resumed."""
    commands = _controlled(request, caller, run_id, "pause it")
    return Pausing(pausing=commands.pause(run_id, actor=caller.actor))


@router.post("/{run_id}/resume", status_code=202, response_model=Resuming, responses=REFUSALS)
def resume(run_id: str, request: Request, caller: CallerDep) -> Resuming:
    """Let a paused run go on from where it stopped."""
    commands = _controlled(request, caller, run_id, "resume it")
    return Resuming(resuming=commands.resume(run_id, actor=caller.actor))


@router.post("/{run_id}/retry", status_code=202, response_model=Retrying, responses=REFUSALS)
def retry(run_id: str, request: Request, caller: CallerDep) -> Retrying:
    """Run the failed step of a run that failed on it (a dead letter, a step's error)
    again, with a fresh attempt count; the run's error is cleared and it goes on."""
    commands = _controlled(request, caller, run_id, "retry it")
    retried = commands.retry(run_id, actor=caller.actor)
    return Retrying(run_id=retried.run_id, retrying=retried.steps)


@router.post("/{run_id}/fork", status_code=201, response_model=Forked, responses=REFUSALS)
def fork(run_id: str, body: ForkBody, request: Request, caller: CallerDep) -> Forked:
    """A new run on a new thread that reuses the run's journal before step `at` and goes
    on from there; `runs_again` lists the steps with side effects it will run again,
    `asked_again` the `action` calls a person is asked about again (a fork inherits no
    decision), `kept_decisions` those kept as the caller's own (`keep_decisions`: 403
    when the caller may not make one of them)."""
    commands = _controlled(request, caller, run_id, "fork it")
    made = commands.fork(run_id, body.at, actor=caller.actor, keep_decisions=body.keep_decisions)
    return Forked.model_validate(made.as_json())
