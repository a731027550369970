"""What a followed run waits for, as the store has it: a frame only says where to look.

Anyone who can write to Redis can add frames to a run's stream. So the tool, the
arguments and even the ids in an `approval_request` or `question` frame are never what
a person decides on: the call (or question) is loaded from the store, it must belong to
the followed run or a run it delegated to, and a decision is bound to the hash of the
stored arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..messages import args_sha256
from ..store import Store
from ..streams.base import Frame
from .common import err
from .text import visible


@dataclass(frozen=True)
class StoredCall:
    """An action call as recorded, and where its decision stands."""

    run_id: str
    call_id: str
    tool: str
    args: dict[str, Any]
    status: str
    decision: str | None
    decided_by: str | None
    # The roles an escalated call went to (None: the tool's approvers decide).
    escalated_to: tuple[str, ...] | None = None

    @property
    def waiting(self) -> bool:
        return self.status == "pending_approval" and self.decision is None

    @property
    def args_sha256(self) -> str:
        """What a decision is bound to: these arguments, and no others."""
        return args_sha256(self.args)


@dataclass(frozen=True)
class StoredQuestion:
    """A tool's questions to a person as recorded: (id, question) pairs."""

    run_id: str
    request_id: str
    tool: str
    questions: list[tuple[str, str]]
    answered: bool


class Waiting:
    """Looks up, for one followed run, what its frames say it waits for."""

    def __init__(self, db: Store, root_run_id: str) -> None:
        self.db = db
        self.root_run_id = root_run_id

    def call(self, frame: Frame) -> StoredCall | None:
        """The stored call an `approval_request` frame names; None (and a warning) when
        it is not a call of the followed run's tree."""
        run_id, call_id = _ids(frame, "call_id")
        refused = self._outside(run_id)
        if refused is None:
            row = self.db.tool_call(run_id, call_id)
            if row is not None:
                return stored_call(row)
            refused = f"run {run_id} has no call {call_id}"
        _ignored(frame, f"call {call_id} of run {run_id}", refused)
        return None

    def question(self, frame: Frame) -> StoredQuestion | None:
        """The stored question a `question` frame names; None (and a warning) when it is
        not a question of the followed run's tree."""
        run_id, request_id = _ids(frame, "request_id")
        refused = self._outside(run_id)
        if refused is None:
            row = self.db.question(run_id, request_id)
            if row is not None:
                return stored_question(row)
            refused = f"run {run_id} asked no question {request_id}"
        _ignored(frame, f"request {request_id} of run {run_id}", refused)
        return None

    def _outside(self, run_id: str) -> str | None:
        """Why `run_id` is not the followed run or one it delegated to; None if it is."""
        if run_id in self.db.run_tree(self.root_run_id):
            return None
        return f"run {run_id} is not run {self.root_run_id} or one it delegated to"


def stored_call(row: dict[str, Any]) -> StoredCall:
    """A tool-call row as a `StoredCall`."""
    return StoredCall(
        run_id=str(row["run_id"]),
        call_id=str(row["call_id"]),
        tool=str(row["name"]),
        args=dict(row["args"] or {}),
        status=str(row["status"]),
        decision=row["decision"],
        decided_by=row["decided_by"],
        escalated_to=tuple(row.get("approvers") or ()) if row.get("escalated") else None,
    )


def stored_question(row: dict[str, Any]) -> StoredQuestion:
    """A question row as a `StoredQuestion`."""
    return StoredQuestion(
        run_id=str(row["run_id"]),
        request_id=str(row["request_id"]),
        tool=str(row["tool"]),
        questions=[_question(q, n) for n, q in enumerate(row["questions"] or [], 1)],
        answered=row["answers"] is not None,
    )


def _ids(frame: Frame, key: str) -> tuple[str, str]:
    return str(frame.get("run_id", "")), str(frame.get(key, ""))


def _question(asked: Any, number: int) -> tuple[str, str]:
    if isinstance(asked, dict):
        return str(asked.get("id", f"q{number}")), str(asked.get("question", asked))
    return f"q{number}", str(asked)


def _ignored(frame: Frame, what: str, why: str) -> None:
    err.print(
        visible(f"warning: ignored a {frame.get('type')} frame for {what}: {why}"),
        style="yellow",
    )
