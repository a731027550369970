"""The seam between the loop and a runner.

The hooks are the entire difference between running in-process and running durably.
Each hook takes one input object, so adding a field never breaks a runner, and each
has a sensible default so a runner supplies only what it changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

from .checkpoints import Decision, DelegationOutcome
from .errors import ApprovalError, ControlFlowSignal
from .messages import ToolCall
from .steps import Intent

T = TypeVar("T")


@dataclass(frozen=True)
class StepCall:
    """Run the intent as the checkpoint named `name`; returns its JSON result.

    `given` is the intent, or a function that builds it: a replay that finds the step
    recorded never needs it, and a model turn's carries the whole history so far.
    """

    name: str
    given: Intent | Callable[[], Intent]

    @cached_property
    def intent(self) -> Intent:
        return self.given() if callable(self.given) else self.given


@dataclass(frozen=True)
class ApprovalWait:
    """The turn waits for a decision on one call of one run.

    `requested`: the call was asked for with the turn's other calls
    (`LoopHooks.request_approvals`); the wait finds the request on record and streams
    nothing again.
    """

    run_id: str
    call: ToolCall
    args_sha256: str
    requested: bool = False


@dataclass(frozen=True)
class ApprovalRequests:
    """Every decision a model turn's calls need, asked for at once, in call order: a
    person sees them all and may decide them in any order."""

    waits: Sequence[ApprovalWait]


@dataclass(frozen=True)
class AnswersWait:
    """The turn waits for a person's answers to a tool's questions."""

    run_id: str
    request_id: str
    questions: list[dict[str, Any]]
    call: ToolCall


@dataclass(frozen=True)
class TimerWait:
    """The turn sleeps on a `wait` call (agent_jobs/timers.py) until its time or a
    message to the run."""

    run_id: str
    call: ToolCall


@dataclass(frozen=True)
class Delegation:
    """Run another agent on `task` as a child of `run_id`."""

    run_id: str
    call: ToolCall
    agent: str
    task: str
    depth: int


@dataclass(frozen=True)
class ParallelBlock(Generic[T]):
    """Tasks to run together; every task settles, none fails fast."""

    tasks: Sequence[Callable[[], T]]


@dataclass
class Settled(Generic[T]):
    value: T | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Patch:
    """Asks whether this run takes the shape introduced under `id`."""

    id: str


@dataclass
class LoopHooks:
    """Defaults: sequential `parallel`, every patch taken, no humans to ask."""

    def step(self, call: StepCall) -> Any:
        raise NotImplementedError("a runner must supply hooks.step")

    def await_approval(self, wait: ApprovalWait) -> Decision:
        raise ApprovalError(
            f"run {wait.run_id} needs a decision on {wait.call.name} ({wait.call.id}) "
            "but this runner has no way to ask for one"
        )

    def request_approvals(self, requests: ApprovalRequests) -> None:
        """Ask for every decision at once (each then awaited in call order); by default
        each is asked for only when it is awaited."""

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        raise ApprovalError(f"run {wait.run_id} asks questions but nobody can answer them")

    def await_timer(self, wait: TimerWait) -> dict[str, Any]:
        raise ApprovalError(f"run {wait.run_id} asks to sleep but this runner cannot wake it")

    def run_agent(self, delegation: Delegation) -> DelegationOutcome:
        return DelegationOutcome(ok=False, error="this runner cannot delegate to other agents")

    def parallel(self, block: ParallelBlock[T]) -> list[Settled[T]]:
        return [settle(task) for task in block.tasks]

    def patched(self, patch: Patch) -> bool:
        return True


def settle(task: Callable[[], T]) -> Settled[T]:
    """Run one task and capture its outcome; control-flow signals are captured too."""
    try:
        return Settled(value=task())
    except (Exception, ControlFlowSignal) as exc:
        return Settled(error=exc)
