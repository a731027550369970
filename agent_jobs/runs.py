"""How a run comes into being: the run request, its id, admission, and the next turn.

Below both runners: the client, the Celery task and the approvals parser use it too.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import Connection

from . import admission, session
from .admission import IfBusy
from .app import AgentApp
from .encryption.keyring import own
from .errors import InvalidRequestError
from .observability import tracing
from .processes import this_process
from .store import RunView, Store, threads
from .store import events as event_rows
from .store import runs as run_rows
from .store.db import contains_nul, utcnow

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"
MAX_METADATA = 64 * 1024  # bytes of a run's metadata, as JSON


def new_id() -> str:
    return uuid.uuid4().hex


def today() -> str:
    """The UTC day a run is stamped with once, when it is created."""
    return datetime.now(UTC).date().isoformat()


class RunRequest(BaseModel):
    """The keyword arguments of `agent_jobs.start_run`, validated (docs/doors.md, "Enqueueing runs
    from other services")."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    agent: str = Field(min_length=1, max_length=200)
    input: str = Field(min_length=1, max_length=1_000_000)
    actor: str = Field(default="anonymous", min_length=1, max_length=200)
    thread_id: str | None = Field(default=None, pattern=ID_PATTERN)
    run_id: str | None = Field(default=None, pattern=ID_PATTERN)
    persona: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # On a thread whose turn has not ended: run after it, refuse, or cancel it and run next.
    if_busy: IfBusy = "enqueue"

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("agent", "input", "actor", "persona", "metadata")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if contains_nul(value):
            raise ValueError("must not contain NUL characters (U+0000), which no text column holds")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(value, default=str).encode())
        if size > MAX_METADATA:
            raise ValueError(
                f"must be at most {MAX_METADATA} bytes as JSON ({size}): keep references in "
                "it, not documents"
            )
        return value

    @field_validator("if_busy", mode="before")
    @classmethod
    def _if_busy(cls, value: Any) -> Any:  # null is the default, as in Python's keyword
        return "enqueue" if value is None else value

    @classmethod
    def of(cls, agent: str, input: str, **fields: Any) -> RunRequest:
        """A request from keyword arguments (None values mean the defaults)."""
        given = {k: v for k, v in fields.items() if v is not None}
        return cls.parse({"agent": agent, "input": input, **given})

    @classmethod
    def parse(cls, data: dict[str, Any]) -> RunRequest:
        """Validate `data`; a bad request is an `InvalidRequestError` naming each fault."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            faults = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(request)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise InvalidRequestError(f"invalid run request: {faults}") from None


@dataclass(frozen=True)
class Admitted:
    """A request admitted: its run, whether this wrote it, the runs it interrupted."""

    run_id: str
    created: bool
    interrupted: tuple[str, ...] = ()  # asked to stop (`if_busy="interrupt"`): wake them


def admit(
    store: Store,
    app: AgentApp,
    request: RunRequest,
    *,
    runner: str,
    status: run_rows.RunStatus,
    run_id: str | None = None,
) -> Admitted:
    """Check a request against the app and write its run row (named `run_id`, else the
    request's, else a new id), after cancelling its thread's turn if it says
    `if_busy="interrupt"`.

    Nothing is written for a request naming an agent or persona the app lacks, nor for one
    refused on a busy thread (`ThreadBusyError`).
    """
    check_request(app, request)
    run_id = run_id or request.run_id or new_id()
    interrupted: list[str] = []
    with store.begin() as conn:
        if request.if_busy == "interrupt":
            interrupted = admission.interrupt(conn, request, run_id)
        created = admit_in(conn, app, request, run_id=run_id, runner=runner, status=status)
    return Admitted(run_id, created, tuple(interrupted))


def admit_in(
    conn: Connection,
    app: AgentApp,
    request: RunRequest,
    *,
    run_id: str,
    runner: str,
    status: run_rows.RunStatus,
) -> bool:
    """Write the run row of a checked request in the caller's transaction; False when
    the run exists already (a schedule's tick writes its runs with its own row)."""
    check_request(app, request)
    created = create_run(conn, request, run_id=run_id, runner=runner, status=status, app=app)
    if created and runner == "inline":  # this process drives it, from its first moment
        run_rows.set_driver(conn, [run_id], this_process())
    return created


def admit_run(
    store: Store, app: AgentApp, request: RunRequest, *, runner: str, status: run_rows.RunStatus
) -> tuple[str, bool]:
    """`admit`: (run id, whether it was written)."""
    admitted = admit(store, app, request, runner=runner, status=status)
    return admitted.run_id, admitted.created


def post_message(
    conn: Connection, app: AgentApp, run_or_thread: str, text: str, *, target: str, runner: str
) -> tuple[str, str | None]:
    """Queue a message on a thread's inbox: (thread id, the run it started, if any).

    A `next-turn` message to an idle thread whose last run belongs to `runner` starts
    that thread's next turn at once. A text with a NUL character is refused
    (`InvalidRequestError`).
    """
    if contains_nul(text):
        raise InvalidRequestError(
            "a message must not contain NUL characters (U+0000), which no text column holds"
        )
    thread_id, run = session.resolve_thread(conn, run_or_thread)
    if run is not None:
        # The thread's row first, as a turn's end takes it (for its events) before it
        # looks for a next-turn message: the two are ordered, so either the end sees
        # this message or this sees the run ended. Resolving by thread took it already.
        event_rows.lock_thread(conn, thread_id)
    active = session.active_run(conn, thread_id)
    last = active or session.last_run(conn, thread_id)
    if last is not None:  # the thread's actor owns what is posted to it
        own(conn, last.actor, last.id)
    session.push(conn, thread_id, active.id if active else None, target, text)
    if target != "next-turn" or active is not None:
        return thread_id, None
    if last is None or last.runner != runner:
        return thread_id, None
    return thread_id, start_next_turn(conn, app, RunView.from_row(last), runner=runner)


def check_request(app: AgentApp, request: RunRequest) -> None:
    """Refuse a request naming an agent or persona this app does not define."""
    app.get_agent(request.agent)
    app.get_persona(request.persona)


def create_run(
    conn: Connection,
    request: RunRequest,
    *,
    run_id: str,
    runner: str,
    status: run_rows.RunStatus,
    app: AgentApp | None = None,
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
    trace_context: dict[str, str] | None = None,
) -> bool:
    """Write the thread (if new) and the run row; False when the run already exists.

    With the app at hand, an agent's `default_timeout` becomes the run's deadline, and
    its concurrency key the run's. A top-level run on a thread whose turn has not ended,
    or with a key, is written `queued` whatever `status` says: it begins once admitted
    (agent_jobs/admission.py). With tracing on, the run keeps `trace_context` (a run it
    follows from), else the current one, else a root of its own
    (agent_jobs/observability/tracing.py).
    """
    thread_id = request.thread_id or run_id
    fresh = threads.ensure_thread(conn, thread_id)
    spot = admission.Place()  # delegated runs are held back by nothing
    if parent_run_id is None:
        found = admission.place(conn, app, request, run_id=run_id, thread_id=thread_id, fresh=fresh)
        if found is None:  # the run exists already
            return False
        spot = found
    created = run_rows.insert_run(
        conn,
        run_id=run_id,
        thread_id=thread_id,
        agent=request.agent,
        actor=request.actor,
        persona=request.persona,
        input=request.input,
        status="queued" if spot.held else status,
        runner=runner,
        day=today(),
        metadata=request.metadata,
        parent_run_id=parent_run_id,
        root_run_id=root_run_id,
        depth=depth,
        trace_context=tracing.context_for_run(run_id, request.agent, trace_context),
        concurrency_key=spot.key,
        waiting_on=spot.waiting_on,
    )
    timeout = app.get_agent(request.agent).options.default_timeout if app is not None else None
    if created and timeout:
        run_rows.set_deadline(conn, run_id, utcnow() + timedelta(seconds=timeout))
    return created


def start_next_turn(
    conn: Connection, app: AgentApp, previous: RunView, *, runner: str
) -> str | None:
    """Turn the first `next-turn` message of the thread into a new run (queued)."""
    run_id = new_id()
    text = session.claim_next_turn(conn, previous.thread_id, run_id)
    if text is None:
        return None
    request = RunRequest(
        agent=previous.agent,
        input=text,
        actor=previous.actor,
        thread_id=previous.thread_id,
        persona=previous.persona,
        metadata={"after_run": previous.run_id},
    )
    status: run_rows.RunStatus = "queued" if runner == "durable" else "running"
    context = previous.trace_context  # the thread's turns in one trace
    create_run(
        conn, request, run_id=run_id, runner=runner, status=status, app=app, trace_context=context
    )
    return run_id
