"""Pre-step decisions: listeners on the app may gate or steer each step of a turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class PreStepContext:
    """What a listener sees before step `step` (1-based) of a run's turn."""

    run_id: str
    thread_id: str
    agent: str
    actor: str
    step: int
    claimed: list[str]  # steering messages this step takes from the inbox


class PreStepDecision(BaseModel):
    """`reject` the step, or `enter` it carrying extra messages (a new request series:
    the model is sent only what this step carries in, not the turn's earlier messages)."""

    kind: Literal["reject", "enter"]
    messages: list[str] = Field(default_factory=list)
    starts_request_series: bool = False
    reason: str | None = None


PreStepListener = Callable[[PreStepContext], PreStepDecision | None]


def decide(listeners: Sequence[PreStepListener], context: PreStepContext) -> PreStepDecision:
    """Ask each listener in order: the first rejection wins; entries add up."""
    messages: list[str] = []
    new_series = False
    for listener in listeners:
        decision = listener(context)
        if decision is None:
            continue
        if decision.kind == "reject":
            return decision
        messages.extend(decision.messages)
        new_series = new_series or decision.starts_request_series
    return PreStepDecision(kind="enter", messages=messages, starts_request_series=new_series)
