"""How a step task reports what it did: the result it returns (`StepOutcome`, and the
few words Flower shows) and, for a step run in a chain where no task was delivered, the
task events that stand for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .completion import Completion


class StepOutcome(str):
    """What a step task did with its step, as the runner says it (`model:1 done; waiting
    tool:call_1 tool:call_2`), with what the task reports: whether the step failed, and
    `summary`, the few words Flower shows. The runner's other answers (a delivery that
    left the row alone) are plain strings."""

    step: str
    state: Literal["done", "failed"]
    error: str | None
    run: str  # where the run stands after the pass the step's outcome woke

    def __new__(cls, completion: Completion, run: str) -> StepOutcome:
        self = super().__new__(cls, f"{completion.step} {completion.state}; {run}")
        self.step, self.state, self.error, self.run = (
            completion.step,
            completion.state,
            completion.error,
            run,
        )
        return self

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @property
    def summary(self) -> str:
        """`done → waiting tool:call_3, tool:call_4`, `failed: <why> → run failed`."""
        run = self.run.removeprefix(f"{self.step} recorded; ")  # a fan-out's member
        if self.state == "done":
            return f"done → {where(run)}"
        # The run fails with this step's error: said once.
        return (
            f"failed: {self.error} → {'run failed' if run.startswith('failed: ') else where(run)}"
        )


def where(outcome: str) -> str:
    """A pass's outcome as a task's result says it: the steps a run waits on listed
    (`waiting tool:call_3, tool:call_4`), anything else as it is."""
    if outcome.startswith("waiting ") and not outcome.startswith("waiting for "):
        return "waiting " + ", ".join(outcome.removeprefix("waiting ").split())
    return outcome


def summary(outcome: str) -> str:
    """What a step task's result says: a `StepOutcome`'s summary, or the runner's word."""
    return outcome.summary if isinstance(outcome, StepOutcome) else where(outcome)


# (task, task id, run id, step, tool) -> a context that reports the step's outcome (a
# `StepOutcome` says whether the step failed), or the exception that ended it.
EagerEvents = Callable[
    [str, str, str, str, str | None], AbstractContextManager[Callable[[str], None]]
]


@contextmanager
def quiet_events(
    task: str, task_id: str, run_id: str, step: str, tool: str | None = None
) -> Iterator[Callable[[str], None]]:
    """`EagerEvents` that report nothing (a runner outside a worker)."""
    yield lambda outcome: None
