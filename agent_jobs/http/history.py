"""Run history: `GET /v1/runs` (the list, filtered and cursor-paged, live as
`/v1/runs/stream`), `GET /v1/runs/{run_id}/steps` (the journal with its timings) and
`GET /v1/runs/{run_id}/fork?at=` (what a fork there would run again).

A caller sees only the runs it may read (http/access.py): the store's query keeps those it
might (`store.listing.Reader`: its own runs, its runs' delegated runs, runs with a call it
may decide) and each is checked here as `GET /v1/runs/{run_id}` checks it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ..app import AgentApp
from ..approvals.reconcile import may_reconcile
from ..controls.fork import preview
from ..documents import steps_document, unknown_call
from ..store import RunView, outcomes
from ..store.listing import Reader, RunFilter
from ..store.runs import TERMINAL, RunStatus
from . import sse
from .access import controls, may_decide, owns, readable_among, readable_run
from .auth import Caller, CallerDep
from .door import Door
from .errors import ERROR_RESPONSES, ErrorBody
from .polled import polled_events
from .state import server

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=ERROR_RESPONSES)
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run (or none this actor may read)"}
}
MAX_LIMIT = 200
# Of a run's input, what a row of the list shows.
MAX_LISTED_INPUT = 2000
# A reader who may not read every run: at most this many queries fill one page.
MAX_ROUNDS = 10
MAX_TEXT = 200


def runs_filter(
    status: Annotated[
        list[RunStatus] | None, Query(description="Only runs with this status (may repeat)")
    ] = None,
    agent: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
    actor: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
    thread_id: Annotated[str | None, Query(max_length=64)] = None,
    parent_run_id: Annotated[
        str | None, Query(max_length=64, description="Only runs this run delegated to")
    ] = None,
    root_run_id: Annotated[
        str | None, Query(max_length=64, description="Only the runs of this run's tree")
    ] = None,
    schedule: Annotated[
        str | None, Query(max_length=64, description="Only the runs this schedule started")
    ] = None,
    q: Annotated[
        str | None,
        Query(min_length=1, max_length=MAX_TEXT, description="In the run id, input or metadata"),
    ] = None,
    since: Annotated[datetime | None, Query(description="Created at or after")] = None,
    until: Annotated[datetime | None, Query(description="Created before")] = None,
) -> RunFilter:
    return RunFilter(
        statuses=tuple(status or ()),
        agent=agent,
        actor=actor,
        thread_id=thread_id,
        parent_run_id=parent_run_id,
        root_run_id=root_run_id,
        schedule=schedule,
        q=q,
        since=since,
        until=until,
    )


FilterDep = Annotated[RunFilter, Depends(runs_filter)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Runs a page holds at most")]
Cursor = Annotated[
    str | None, Query(max_length=500, description="The `next_cursor` of the page before")
]


def decidable_tools(app: AgentApp, caller: Caller) -> frozenset[str]:
    """The action tools whose calls the caller may decide, as asked or once escalated: a
    run with such a call is one it may read (access.may_read checks which exactly)."""
    found = set()
    for name in app.registry.names():
        tool = app.registry.get(name)
        if tool.kind != "action":
            continue
        escalated = frozenset(tool.escalate_to or ())
        if app.roles.may_approve(tool, caller.actor) or escalated & caller.roles:
            found.add(name)
    for prefix in app.mcp_servers:  # every tool of a server: `<server>.*`
        if app.roles.may_approve(app.registry.get(f"{prefix}.tool"), caller.actor):
            found.add(f"{prefix}.*")
    return frozenset(found)


def listed(run: RunView) -> dict[str, Any]:
    """A run as a row of the list shows it."""
    return {
        "run_id": run.run_id,
        "agent": run.agent,
        "actor": run.actor,
        "status": run.status,
        "thread_id": run.thread_id,
        "parent_run_id": run.parent_run_id,
        "root_run_id": run.root_run_id,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "input": run.input[:MAX_LISTED_INPUT],
        "input_cut": len(run.input) > MAX_LISTED_INPUT,
        "waiting_on": run.waiting_on,
        "error": run.error,
        "error_type": run.error_type,
    }


def runs_list(
    door: Door, caller: Caller, where: RunFilter, limit: int, cursor: str | None
) -> dict[str, Any]:
    """`{"runs": [...], "next_cursor"}`: a page of the runs the caller may read, newest
    first. A page is short only when the caller may read few of the runs it went past
    (`next_cursor` then goes on from there)."""
    reader = (
        None if caller.reads_every_run else Reader(caller.actor, decidable_tools(door.app, caller))
    )
    shown: list[dict[str, Any]] = []
    for _ in range(MAX_ROUNDS):
        page = door.store.runs_page(where, reader=reader, limit=limit - len(shown), cursor=cursor)
        cursor = page.next_cursor
        shown += [listed(run) for run in readable_among(door, caller, page.runs)]
        if cursor is None or len(shown) >= limit:
            break
    return {"runs": shown, "next_cursor": cursor}


@router.get("")
def list_runs(
    request: Request,
    caller: CallerDep,
    where: FilterDep,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """The runs the caller may read, newest first: `{"runs": [...], "next_cursor"}`;
    `next_cursor` (null on the last page) asks for the page after, and stays right while
    runs are added. `status` may repeat; `q` looks in the run id, input and metadata."""
    return runs_list(server(request).door, caller, where, limit, cursor)


@router.get(
    "/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The list"}},
)
async def runs_stream(
    request: Request, caller: CallerDep, where: FilterDep, limit: Limit = 50
) -> StreamingResponse:
    """`GET /v1/runs` (its first page) as server-sent events: at once, then again each
    time it changes (a run starts, moves on, ends); comments keep the connection alive."""
    state = server(request)

    def read() -> dict[str, Any]:
        return runs_list(state.door, caller, where, limit, None)

    first = await run_in_threadpool(read)
    release = state.slots.claim(caller.actor)
    events: AsyncIterator[bytes] = polled_events(state, read, first, release, "runs list")
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers=sse.HEADERS,
        background=BackgroundTask(release.at_the_end),
    )


@router.get("/{run_id}/steps", responses=NOT_FOUND)
def steps(run_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """The run's journal in order: each step's kind, state, attempts, timings (`started_at`,
    `finished_at`, `duration_ms`), who decided it, the worker that ran it, and its intent
    and result as JSON."""
    door = server(request).door
    run = readable_run(door, caller, run_id)
    return steps_document(door.store, run.run_id)


@router.get(
    "/{run_id}/fork",
    responses={
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "The run cannot be forked"},
        422: {"model": ErrorBody, "description": "The run cannot be forked at that step"},
    },
)
def fork_preview(
    run_id: str,
    request: Request,
    caller: CallerDep,
    at: Annotated[str, Query(min_length=1, max_length=300, description="The step to fork at")],
) -> dict[str, Any]:
    """What `POST /v1/runs/{run_id}/fork` at step `at` would do, nothing written:
    `runs_again` (steps with side effects that ran here and would run again) and
    `asked_again` (`action` calls a person would be asked about again)."""
    door = server(request).door
    readable_run(door, caller, run_id)
    with door.store.connect() as conn:
        return preview(conn, run_id, at).as_json()


# --- what the caller may do with a run: `GET /v1/runs/{run_id}/may` ------------------------


@router.get("/{run_id}/may", responses=NOT_FOUND)
def may(run_id: str, request: Request, caller: CallerDep) -> dict[str, list[str]]:
    """What the caller may do with the run as it stands: `controls` (of cancel, pause,
    resume, retry, fork, message), the pending calls it may `decide` and the calls whose
    outcome is unknown it may `reconcile` (by call id). A control that no longer applies
    when it arrives is still refused (409)."""
    door = server(request).door
    run = readable_run(door, caller, run_id)
    calls = door.store.tool_calls(run.run_id)
    with door.store.connect() as conn:
        unknown = outcomes.unknown(conn, run.run_id)
    waiting = {unknown_call(run.run_id, row)["call_id"] for row in unknown}
    return {
        "controls": allowed(caller, run),
        "decide": [
            c["call_id"]
            for c in calls
            if c["status"] == "pending_approval" and may_decide(door.app, caller, c)
        ],
        "reconcile": [
            c["call_id"]
            for c in calls
            if c["call_id"] in waiting and may_reconcile(door.app, c["name"], caller.actor)
        ],
    }


def allowed(caller: Caller, run: RunView) -> list[str]:
    """The controls the caller may use on the run as it stands."""
    may: list[str] = []
    ended = run.status in TERMINAL
    if controls(caller, run):
        if not ended:
            may.append("cancel")
            if run.status == "paused":
                may.append("resume")
            elif run.pause_requested_by is None:
                may.append("pause")
        if run.status == "failed":
            may.append("retry")
        may.append("fork")
    if owns(caller, run) and not ended:
        may.append("message")
    return may
