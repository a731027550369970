"""A run as the doors show it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from .runs import TERMINAL


class RunView(BaseModel):
    """A run as users see it (`agent-jobs status --json`)."""

    run_id: str
    status: str
    output: str | None
    error: str | None = None
    error_type: str | None = None
    agent: str
    actor: str
    persona: str | None = None
    thread_id: str
    input: str
    waiting_on: str | None = None
    # Its agent's `concurrency_key` of this run, computed when it was admitted.
    concurrency_key: str | None = None
    cancel_cause: str | None = None
    cancel_keep_inbox: bool = False
    # Who asked the run to pause (`agent-jobs pause`): it stops at its next step boundary.
    pause_requested_by: str | None = None
    deadline: datetime | None = None
    # When a sleeping run wakes (its `wait` call's time); None when it does not sleep.
    wake_at: datetime | None = None
    runner: str
    parent_run_id: str | None = None
    root_run_id: str
    depth: int = 0
    day: str
    metadata: dict[str, Any] = {}
    # Where the run's steps' spans hang (observability/tracing.py); not part of its status.
    trace_context: dict[str, str] | None = Field(default=None, exclude=True)
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> RunView:
        m = row._mapping
        return cls(
            run_id=m["id"],
            root_run_id=m["root_run_id"],
            **{k: m[k] for k in cls.model_fields if k not in ("run_id", "root_run_id")},
        )

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL
