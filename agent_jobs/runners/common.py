"""What both runners share: the run request, run creation, and a turn's inputs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import Connection

from ..app import AgentApp
from ..errors import InvalidRequestError
from ..loop import LoopDeps, TurnInput
from ..settings import Settings
from ..store import RunView, threads
from ..store import runs as run_rows

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"


def new_id() -> str:
    return uuid.uuid4().hex


def today() -> str:
    """The UTC day a run is stamped with once, when it is created."""
    return datetime.now(UTC).date().isoformat()


class RunRequest(BaseModel):
    """The kwargs of `agent_jobs.start_run` (CONTRACT §3), validated."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    agent: str = Field(min_length=1, max_length=200)
    input: str = Field(min_length=1, max_length=1_000_000)
    actor: str = Field(default="anonymous", min_length=1, max_length=200)
    thread_id: str | None = Field(default=None, pattern=ID_PATTERN)
    run_id: str | None = Field(default=None, pattern=ID_PATTERN)
    persona: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, value: Any) -> Any:
        return {} if value is None else value

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
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
) -> bool:
    """Write the thread (if new) and the run row; False when the run already exists."""
    thread_id = request.thread_id or run_id
    threads.ensure_thread(conn, thread_id)
    return run_rows.insert_run(
        conn,
        run_id=run_id,
        thread_id=thread_id,
        agent=request.agent,
        actor=request.actor,
        persona=request.persona,
        input=request.input,
        status=status,
        runner=runner,
        day=today(),
        metadata=request.metadata,
        parent_run_id=parent_run_id,
        root_run_id=root_run_id,
        depth=depth,
    )


def turn_for(app: AgentApp, run: RunView, settings: Settings) -> tuple[TurnInput, LoopDeps]:
    """The loop's input and dependencies for a stored run."""
    agent = app.get_agent(run.agent)
    persona = app.get_persona(run.persona)
    turn = TurnInput(
        run_id=run.run_id,
        thread_id=run.thread_id,
        actor=run.actor,
        text=run.input,
        persona=run.persona,
        depth=run.depth,
    )
    deps = LoopDeps(
        app=app,
        agent=agent,
        persona=persona,
        system_prompt=app.system_prompt(agent, persona),
        day=run.day,
        quota_limit=app.quota_limit(run.actor, settings.daily_token_quota),
    )
    return turn, deps


def waiting_label(tool: str, call_id: str) -> str:
    """How a parked run says where it stands, e.g. `awaiting_approval refund call_2`."""
    return f"awaiting_approval {tool} {call_id}"
