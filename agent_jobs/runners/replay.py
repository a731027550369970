"""One coordinator pass of the durable runner: the loop replayed against the journal.

Finished steps return their recorded result with no I/O. A new local step runs in the
pass's transaction and its row is inserted with the pass; a new remote step is
recorded `scheduled` and the pass suspends (the runner sends it once the pass has
committed). A human wait is recorded `waiting` and the pass suspends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection

from .. import checkpoints as names
from ..checkpoints import Decision, DelegationOutcome
from ..dispatch import INVOKE_TOOL, MODEL_TURN
from ..errors import NonDeterminismError, StepFailedError, Suspend
from ..executor import StepEnv, execute_local
from ..hooks import (
    AnswersWait,
    ApprovalWait,
    Delegation,
    LoopHooks,
    ParallelBlock,
    Patch,
    Settled,
    StepCall,
    settle,
)
from ..steps import Intent, InvokeTool, ModelTurn, Summarize, dump, parse_intent
from ..store import RunView, model_requests
from ..store import journal as journal_rows
from ..store import runs as run_rows
from . import waits
from .turn import child_run_id, create_child, delegation_intent, delegation_label

T = TypeVar("T")


def task_for(intent: Intent) -> str:
    """The Celery task that carries out a remote intent."""
    if isinstance(intent, ModelTurn | Summarize):
        return MODEL_TURN
    if isinstance(intent, InvokeTool):
        return INVOKE_TOOL
    raise TypeError(f"{type(intent).__name__} is not a remote step")


def sent_as_journaled(intent: Any) -> str:
    """`sent_as`, of an intent as the journal holds it (a model step's may be partial)."""
    if model_requests.is_model_turn(intent):
        return MODEL_TURN
    return sent_as(parse_intent(intent))


def sent_as(intent: Intent) -> str:
    """The task name a remote intent is sent as: with `@queue` when it has a queue of its
    own (dispatch.own_queue)."""
    queue = getattr(intent, "queue", None)
    return f"{task_for(intent)}@{queue}" if queue else task_for(intent)


@dataclass
class _Parked:
    """Where a suspended pass left the run."""

    status: run_rows.RunStatus = "running"
    labels: list[str] = field(default_factory=list)


class DurableHooks(LoopHooks):
    """One coordinator pass: replays the journal, runs new local steps in `conn`."""

    def __init__(
        self,
        conn: Connection,
        run: RunView,
        rows: list[Any],
        env: StepEnv,
        disabled_patches: frozenset[str],
    ) -> None:
        self.conn = conn
        self.run = run
        self.env = env
        self.disabled_patches = disabled_patches
        self.by_seq = {row.seq: row for row in rows}
        self.by_name = {row.step: row for row in rows}
        self.pos = 0
        self.to_dispatch: list[tuple[str, str]] = []
        self.children: list[str] = []  # delegated runs to start once this pass commits
        self.new_rows: list[dict[str, Any]] = []  # inserted in one statement before commit
        self.parked = _Parked()
        self.resumed = False  # whether this pass resumed the run from a human wait
        self.in_block = False  # inside a fan-out: steps are found by name
        self.block_end = 0  # the last position a fan-out's steps took
        self.whole: dict[str, dict[str, Any]] = {}  # new model steps' whole intents
        # (step, whole intent) of the last model step this process scheduled, if known.
        self.known_model: tuple[str, Any] | None = None

    def park(self) -> str:
        """The pass suspended: record what the run now waits on; returns the outcome."""
        run, parked = self.run, self.parked
        waiting_on = " ".join(parked.labels) if parked.status != "running" else None
        if run.status != parked.status or run.waiting_on != waiting_on:
            run_rows.note_status(self.conn, run.run_id, parked.status, waiting_on=waiting_on)
        # A human wait streams its own `status` frame, and so does the wait a person
        # released the run from; a run released some other way (its wait's row completed
        # by a repair) says so here.
        if parked.status == "running" and run.status in waits.PARKED and not self.resumed:
            kind, fields = waits.RESUMED
            self.env.emit_after_commit(kind, **fields)
        if parked.status == "running":
            return "waiting " + " ".join(parked.labels)
        return " ".join(parked.labels)

    def whole_intent(self, step: str) -> Any:
        """A new step's intent, whole (a model step's is journaled against the one
        before)."""
        if step in self.whole:
            return self.whole[step]
        return next(r["intent"] for r in self.new_rows if r["step"] == step)

    def _last_model_turn(self) -> tuple[str, Any] | None:
        """(step, whole intent) of the run's latest model step before this one: as this
        process scheduled it, or from the journal."""
        recorded = [
            row
            for row in self.by_seq.values()
            if not isinstance(row, _Marker) and row.step.startswith(names.model_prefix())
        ]
        if not recorded:
            return None
        step = max(recorded, key=lambda row: row.seq).step
        if self.known_model is not None and self.known_model[0] == step:
            return self.known_model
        intent = journal_rows.whole_model_intent(self.conn, self.run.run_id, step)
        return (step, intent) if intent is not None else None

    # --- positions ---------------------------------------------------------------------

    def _recorded(self, name: str) -> Any | None:
        """The journal row at the next position, checked against the step asked for."""
        if self.in_block:
            return self._recorded_in_block(name)
        self.pos += 1
        row = self.by_seq.get(self.pos)
        if row is not None:
            if row.step != name:
                raise NonDeterminismError(self.pos, row.step, name)
            return row
        if name in self.by_name:
            raise NonDeterminismError(self.pos, None, name)
        return None

    def _recorded_in_block(self, name: str) -> Any | None:
        """A fan-out member's row, found by its name.

        How far each member got in earlier passes decided the order the members' rows
        were written in (a pass stops a member at its first unfinished step and goes on
        to the next member), so positions inside a fan-out say nothing about its shape;
        names do, being unique per call. A new row takes the next free position.
        """
        row = self.by_name.get(name)
        if row is not None:
            self.block_end = max(self.block_end, row.seq)
            return row
        self.pos = self.block_end = max(self.by_seq, default=0) + 1
        return None

    def _record(
        self, name: str, state: journal_rows.StepState, intent: Any, result: Any = None
    ) -> None:
        self.new_rows.append(
            journal_rows.row(
                run_id=self.run.run_id,
                step=name,
                seq=self.pos,
                state=state,
                intent=intent,
                result=result,
            )
        )
        self.by_name[name] = self.by_seq[self.pos] = _Marker(name, self.pos)

    def _wait(self, label: str, status: run_rows.RunStatus = "running") -> Suspend:
        self.parked.labels.append(label)
        if status != "running":
            self.parked.status = status
        return Suspend(label)

    # --- hooks -------------------------------------------------------------------------

    def step(self, call: StepCall) -> Any:
        row = self._recorded(call.name)
        if row is not None:
            if row.state == "done":
                return row.result
            if row.state == "failed":
                raise StepFailedError(call.name, row.error or "failed")
            raise self._wait(call.name)
        intent = call.intent
        if intent.remote:
            if isinstance(intent, InvokeTool) and intent.call.name in self.env.app.registry:
                queue = self.env.app.registry.get(intent.call.name).queue
                if queue is not None:  # recorded, so that every re-send goes there too
                    intent = intent.model_copy(update={"queue": queue})
            recorded = dump(intent)
            if isinstance(intent, ModelTurn):  # journaled as what changed since the last
                self.whole[call.name] = recorded
                recorded = model_requests.slim(recorded, self._last_model_turn())
            self._record(call.name, "scheduled", recorded)
            self.to_dispatch.append((sent_as(intent), call.name))
            raise self._wait(call.name)
        result = dump(execute_local(intent, self.conn, self.env, call.name))
        self._record(call.name, "done", dump(intent), result)
        return result

    def await_approval(self, wait: ApprovalWait) -> Decision:
        def given() -> dict[str, Any] | None:
            decided = waits.decided(self.conn, self.run.run_id, wait)
            return None if decided is None else waits.decision_result(decided)

        return waits.recorded_decision(self._await(waits.approval(wait), given))

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        def given() -> dict[str, Any] | None:
            answers = waits.ask(self.conn, self.run.run_id, wait)
            return None if answers is None else waits.answers_result(answers)

        return waits.recorded_answers(self._await(waits.answers(wait), given))

    def _await(self, wait: waits.HumanWait, given: Callable[[], dict[str, Any] | None]) -> Any:
        """The wait's recorded result, or suspend on it. `given` is what a person already
        said (recorded before this pass reached the wait), and puts the ask on record."""
        row = self._recorded(wait.step)
        if row is not None:
            if row.state == "done":
                self._resumed(wait)
                return row.result
            raise self._wait(wait.label, wait.status)
        result = given()
        self._record(wait.step, "waiting" if result is None else "done", wait.intent, result)
        self._announce(wait)
        if result is None:
            raise self._wait(wait.label, wait.status)
        self._resumed(wait)
        return result

    def _announce(self, wait: waits.HumanWait) -> None:
        for kind, fields in wait.frames:
            self.env.emit_after_commit(kind, **fields)

    def _resumed(self, wait: waits.HumanWait) -> None:
        """A person answered the wait the run was parked on: it runs again from here."""
        if self.resumed or self.run.status != wait.status:
            return  # replaying a wait the run left in an earlier pass
        self.resumed = True
        kind, fields = waits.RESUMED
        self.env.emit_after_commit(kind, **fields)

    def run_agent(self, delegation: Delegation) -> DelegationOutcome:
        """Start the delegated agent as a child run; the parent waits until it ends."""
        name = names.delegation(delegation.call.id)
        child_id = child_run_id(self.run.run_id, delegation.call.id)
        label = delegation_label(delegation, child_id)
        row = self._recorded(name)
        if row is not None:
            if row.state == "done":
                return DelegationOutcome.model_validate(row.result)
            raise self._wait(label)
        create_child(
            self.conn, self.env.app, self.run, delegation, runner="durable", status="queued"
        )
        self._record(name, "waiting", delegation_intent(delegation, child_id))
        self.children.append(child_id)
        raise self._wait(label)

    def parallel(self, block: ParallelBlock[T]) -> list[Settled[T]]:
        """The members one after the other; each settles, a suspended one included."""
        if self.in_block:
            return [settle(task) for task in block.tasks]
        self.in_block, self.block_end = True, self.pos
        try:
            return [settle(task) for task in block.tasks]
        finally:
            self.in_block = False
            self.pos = self.block_end  # the steps after the fan-out follow its last row

    def patched(self, patch: Patch) -> bool:
        if patch.id in self.disabled_patches:
            return False  # as if this code predated the patch: no position is used
        name = names.patch(patch.id)
        marker = self.by_name.get(name)
        if marker is not None and marker.seq <= self.pos:
            return True  # the run took the new shape earlier; asking again costs nothing
        row = self.by_seq.get(self.pos + 1)
        if row is not None:
            if row.step == name:
                self.pos += 1
                return True
            return False  # the run recorded history here before the patch existed
        # At the frontier nothing recorded depends on the old shape: take the new one.
        self.pos += 1
        self._record(name, "done", {"patch": patch.id}, True)
        return True


@dataclass(frozen=True)
class _Marker:
    """A row written during this pass, as later calls of the same pass see it."""

    step: str
    seq: int
