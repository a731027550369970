"""`/v1/runs`: start a run, read it, follow its live stream, steer it, cancel it."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ..documents import run_document
from ..errors import (
    ConfigurationError,
    InvalidRequestError,
    ThreadBusyError,
    UnknownRunError,
    UnknownThreadError,
)
from ..observability import metrics, tracing
from ..runs import RunRequest
from ..session import ModelSelection
from ..store import RunView, places
from ..streams.base import Frame, frame_json
from ..streams.follow import live_frames
from . import sse
from .access import controlled_run, may_read, owned_run, readable_run
from .auth import Caller, CallerDep
from .bodies import CancelBody, Cancelling, MessageBody, ModelBody, Queued, Started
from .door import Door
from .errors import (
    DATABASE_ERRORS,
    ERROR_RESPONSES,
    REDIS_ERRORS,
    ConflictError,
    ErrorBody,
    PermissionDeniedError,
    ServiceUnavailableError,
)
from .state import Release, ServerState, server

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=ERROR_RESPONSES)
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run (or none this actor may read)"}
}


@router.post(
    "",
    status_code=201,
    response_model=Started,
    responses={
        200: {"model": Started, "description": "A run with this run_id exists: that run"},
        404: {
            "model": ErrorBody,
            "description": "thread_id names a thread with another actor's runs (and the "
            "caller is not a service)",
        },
        409: {
            "model": ErrorBody,
            "description": "The run_id is taken by a run of another; or the thread's turn "
            "has not ended and if_busy is 'reject'",
        },
    },
)
def start_run(body: RunRequest, request: Request, caller: CallerDep) -> JSONResponse:
    """Start a run: the `start_run` keyword arguments. The same `run_id` again answers
    200 with the run it started; `actor` defaults to the token's actor. On a thread whose
    turn has not ended, `if_busy` says what happens: `enqueue` (run after it), `reject`
    (409, nothing recorded) or `interrupt` (cancel it, as its actor may, and run next)."""
    door = server(request).door
    named = "actor" in body.model_fields_set
    if named and body.actor != caller.actor and not caller.is_service:
        raise PermissionDeniedError(
            f"actor {caller.actor!r} may start runs only as itself: naming another actor "
            "needs the role 'service'"
        )
    if not named:
        body = body.model_copy(update={"actor": caller.actor})
    try:  # the same checks as admission, here so that they read as a bad request
        door.app.get_agent(body.agent)
        door.app.get_persona(body.persona)
    except ConfigurationError as exc:
        raise InvalidRequestError(f"invalid run request: {exc}") from None
    if body.run_id is not None and (found := door.store.find_run(body.run_id)) is not None:
        return _existing(door, caller, found)
    if (
        body.thread_id is not None
        and not caller.is_service
        and door.store.has_other_actor(body.thread_id, caller.actor)
    ):  # another actor's conversation: not the caller's to continue, nor to know of
        raise UnknownThreadError(body.thread_id)
    if body.if_busy == "interrupt":
        _may_interrupt(door, caller, body.thread_id)
    try:
        with tracing.extracted(request.headers):  # the caller's trace goes on with the run
            run_id, created = door.commands.admit(body)
    except ThreadBusyError as exc:
        busy = door.store.find_run(exc.busy_run_id)
        if busy is not None and may_read(door, caller, busy):
            raise ConflictError(str(exc)) from None
        # A run the caller may not read is not named: as if it were not there.
        raise ConflictError(
            f"thread {exc.thread_id!r} is busy: its turn has not ended; send if_busy "
            "'enqueue' to run after it"
        ) from None
    run = door.store.get_run(run_id)
    if not created:  # another request with this run_id came first
        return _existing(door, caller, run)
    return JSONResponse({"run_id": run_id, "status": run.status}, status_code=201)


def _may_interrupt(door: Door, caller: Caller, thread_id: str | None) -> None:
    """An interrupt cancels the runs of the thread: the caller must be one who may cancel
    each (its actor, or a service)."""
    if thread_id is None:
        return
    with door.store.connect() as conn:
        busy = places.thread_runs(conn, thread_id, lock=False)
    for row in busy:
        try:
            owned_run(door, caller, row.id, "interrupt it")
        except UnknownRunError:  # not the caller's to read: not named
            raise UnknownRunError(
                row.id,
                f"thread {thread_id!r} has no run that actor {caller.actor!r} may interrupt",
            ) from None


def _existing(door: Door, caller: Caller, run: RunView) -> JSONResponse:
    if not may_read(door, caller, run):
        raise ConflictError(f"run id {run.run_id!r} is taken; choose another")
    return JSONResponse({"run_id": run.run_id, "status": run.status}, status_code=200)


@router.get("/{run_id}", responses=NOT_FOUND)
def get_run(run_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """The run as `agent-jobs status RUN_ID --json` prints it (what the caller may do
    with it: `GET /v1/runs/{run_id}/may`)."""
    door = server(request).door
    return run_document(door.store, readable_run(door, caller, run_id))


@router.post("/{run_id}/messages", status_code=202, response_model=Queued, responses=NOT_FOUND)
def post_message(run_id: str, body: MessageBody, request: Request, caller: CallerDep) -> Queued:
    """Steer the run at its next step (`next-step`), or queue its thread's next turn."""
    door = server(request).door
    run = owned_run(door, caller, run_id, "post to it")
    return Queued(thread_id=door.commands.post_message(run.run_id, body.text, target=body.when))


@router.post("/{run_id}/model", status_code=202, response_model=Queued, responses=NOT_FOUND)
def select_model(run_id: str, body: ModelBody, request: Request, caller: CallerDep) -> Queued:
    """Switch the model of the run's thread from its next step that assembles a prompt."""
    door = server(request).door
    run = owned_run(door, caller, run_id, "switch its model")
    selection = ModelSelection(**body.model_dump())
    return Queued(thread_id=door.commands.select_model(run.run_id, selection))


@router.post("/{run_id}/cancel", status_code=202, response_model=Cancelling, responses=NOT_FOUND)
def cancel(
    run_id: str, request: Request, caller: CallerDep, body: CancelBody | None = None
) -> Cancelling:
    """Cancel the run and its children: each stops at its next boundary."""
    door = server(request).door
    run = controlled_run(door, caller, run_id, "cancel it")
    keep = body.keep_inbox if body is not None else False
    return Cancelling(cancelling=door.commands.cancel(run.run_id, keep_inbox=keep))


@router.get(
    "/{run_id}/stream",
    response_class=StreamingResponse,
    responses={
        **NOT_FOUND,
        200: {"content": {"text/event-stream": {}}, "description": "The run's frames"},
        409: {"model": ErrorBody, "description": "The run's stream is in another process"},
    },
)
async def stream(
    run_id: str,
    request: Request,
    caller: CallerDep,
    after: Annotated[str | None, Query(description="Resume after this entry id")] = None,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> StreamingResponse:
    """The run's live frames as server-sent events, to the run's end: `id` the entry id,
    `data` the frame. `Last-Event-ID` (or `?after=`) resumes after that entry."""
    state = server(request)
    door = state.door
    run = await run_in_threadpool(readable_run, door, caller, run_id)
    if run.runner != door.runner:
        raise ConflictError(
            f"run {run_id} ran on the {run.runner} runner, whose live stream this server "
            f"({door.runner}) cannot read; GET /v1/runs/{run_id} shows where it stands"
        )
    resume = last_event_id or after  # a reconnecting client's header wins over the URL
    if resume is not None and not door.entry_id.fullmatch(resume):
        raise InvalidRequestError(f"invalid request: {resume!r} is not an entry id")
    # Before the answer begins, while it can still be an error: a stream that cannot be
    # read would otherwise be an empty 200, the same as one that is over.
    await run_in_threadpool(_reachable, door)
    release = state.slots.claim(caller.actor)
    events = _frames(state, run.root_run_id, resume, release)
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers=sse.HEADERS,
        background=BackgroundTask(release.at_the_end),
    )


def _reachable(door: Door) -> None:
    try:
        door.streams.ping()
    except REDIS_ERRORS as exc:
        raise ServiceUnavailableError(
            f"the run's live frames cannot be read: Redis does not answer ({exc}); try "
            "again shortly (GET /v1/runs/<run_id> says where the run stands)"
        ) from None


async def _frames(
    state: ServerState, stream_id: str, after: str | None, release: Release
) -> AsyncIterator[bytes]:
    door = state.door
    # A Redis Stream's entry ids say when a frame was written (inline ones are positions).
    timed = door.runner == "durable"

    def ignored(entry_id: str, why: str) -> None:
        log.warning("run %s: ignored the frame %s: %s", stream_id, entry_id, why)

    def produce(stop: threading.Event) -> Iterator[tuple[str, Frame]]:
        return live_frames(
            door.streams, door.store, stream_id, after, on_ignored=ignored, stop=stop
        )

    try:
        yield sse.RETRY
        async for item in sse.from_thread(produce, keepalive=state.settings.api_keepalive):
            if item is None:
                yield sse.KEEPALIVE
            else:
                entry_id, frame = item
                yield sse.event(frame_json(frame), id=entry_id)
                if timed:
                    metrics.observe_stream_lag(entry_id)
    except (*DATABASE_ERRORS, *REDIS_ERRORS) as exc:
        # The answer has begun: no error body can follow. It ends with an `error` event
        # that says why (never silently, as if the run's stream were over), and the
        # client comes back with the last id it saw once the service answers again.
        log.warning("run %s: its stream stopped: %s", stream_id, exc)
        yield sse.failure(
            f"the run's live frames could not be read on ({type(exc).__name__}): "
            "reconnect with the last event id you saw once the service answers",
            ServiceUnavailableError.__name__,
        )
    finally:
        release()
