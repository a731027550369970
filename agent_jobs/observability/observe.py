"""What the runners report to metrics and traces (agent_jobs/observability/metrics.py, tracing.py).

Each event is reported once, after the transaction that records it has committed: what a
pass observes waits in its `StepEnv` (`committed`) and is reported by `StepEnv.flush`,
which runs after the commit, so a pass that rolls back (and is tried again) reports
nothing, and a step a replay reads back was reported when it ran. With both off, each
function is a check of two flags.

Steps are reported by kind: `model` (a model call, a summary), `tool` (a tool call) and
`local` (every step a pass carries out in its own transaction: persisting messages and
calls, the usage ledger, the quota check, the step boundary). Human waits are not steps
that run: a decision is reported where it is recorded, as the time it took and as a span
`approval:<call_id>` from the request to the decision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from ..checkpoints import attempted
from . import metrics, tracing

if TYPE_CHECKING:
    from ..executor import StepEnv
    from ..messages import Usage
    from ..store import RunView

log = logging.getLogger(__name__)


def on() -> bool:
    return metrics.enabled() or tracing.enabled()


def clock() -> int:
    """Now in nanoseconds, to time a step with; 0 (and no clock read) while both are off."""
    return time.time_ns() if on() else 0


def report(observed: list[Callable[[], None]]) -> None:
    """Report what a committed transaction observed; a failure here never fails a run."""
    for observation in observed:
        try:
            observation()
        except Exception:
            log.warning("could not report a metric or a span", exc_info=True)


def kind_of(step: str) -> str:
    """A remote step's kind, by its name (a retry row's: the step it runs again)."""
    return "tool" if attempted(step).startswith(("tool:", "mcp:")) else "model"


# --- steps -----------------------------------------------------------------------------------


def local_step(env: StepEnv, run: RunView, step: str, started_ns: int) -> None:
    """A local step just ran in the pass's transaction (`started_ns` from `clock`)."""
    if not started_ns:
        return
    ended = time.time_ns()
    env.committed.append(
        partial(_step, run.trace_context, run.run_id, step, "local", started_ns, ended, 1, "done")
    )


def completed(env: StepEnv, run: RunView, completion: Any) -> None:
    """A remote step's outcome (runners/durable/completion.py), written by the pass of
    `env`: the step's time from its start to its outcome, its retries, a dead letter."""
    if not on():
        return
    step, attempt = completion.step, completion.attempt or 1
    ended = _ns(completion.finished_at)
    started = _ns(completion.started_at) if completion.started_at is not None else None
    outcome = "dead_letter" if completion.dead_letter else completion.state
    env.committed.append(
        partial(
            _step,
            run.trace_context,
            run.run_id,
            step,
            kind_of(step),
            started,
            ended,
            attempt,
            outcome,
            completion.error,
            completion.dead_letter,
            completion.genai,
        )
    )


def remote_step(
    run: RunView,
    step: str,
    started: datetime,
    attempt: int,
    error: str | None = None,
    genai: Mapping[str, str | int | float] | None = None,
) -> None:
    """A remote step the inline runner carried out, its outcome committed already
    (`genai`: its span's GenAI attributes, observability/genai.py)."""
    if on():
        ended = time.time_ns()
        outcome = "failed" if error is not None else "done"
        kind = kind_of(step)
        _step(
            run.trace_context,
            run.run_id,
            step,
            kind,
            _ns(started),
            ended,
            attempt,
            outcome,
            error,
            genai=genai,
        )


def _step(
    context: dict[str, str] | None,
    run_id: str,
    step: str,
    kind: str,
    started: int | None,
    ended: int,
    attempt: int,
    outcome: str,
    error: str | None = None,
    dead_letter: bool = False,
    genai: Mapping[str, str | int | float] | None = None,
) -> None:
    seconds = (ended - started) / 1e9 if started is not None else None
    metrics.step(kind, seconds, attempt - 1)
    if dead_letter:
        metrics.dead_letter()
    attributes: dict[str, str | int | float] = {
        **(genai or {}),
        "agent_jobs.run_id": run_id,
        "agent_jobs.step": step,
        "agent_jobs.attempt": attempt,
        "agent_jobs.outcome": outcome,
    }
    begun = started if started is not None else ended  # given up: the moment it was
    tracing.span(context, step, start_ns=begun, end_ns=ended, attributes=attributes, error=error)


# --- runs and tokens -------------------------------------------------------------------------


def run_started(env: StepEnv, run: RunView) -> None:
    if metrics.enabled():
        env.committed.append(partial(metrics.run_started, run.agent))


def run_finished(env: StepEnv | None, run: RunView | Any, status: str) -> None:
    """A run's end, recorded in the transaction of `env` (None: committed already)."""
    if not metrics.enabled():
        return
    if env is None:
        metrics.run_finished(run.agent, status)
    else:
        env.committed.append(partial(metrics.run_finished, run.agent, status))


def tokens(env: StepEnv, model: str | None, spent: Usage) -> None:
    if metrics.enabled():
        env.committed.append(
            partial(metrics.tokens, model, spent.input_tokens, spent.output_tokens, spent.cost)
        )


# --- decisions -------------------------------------------------------------------------------


def decided(run: Any, call: Any, decision: str, step: str) -> None:
    """A person's decision on `call` (its tool-call row; `run` its run's row) is recorded:
    the caller's transaction commits it next."""
    if not on():
        return
    now = time.time_ns()
    requested = _ns(call.created_at)
    metrics.decision((now - requested) / 1e9)
    attributes: dict[str, str | int] = {
        "agent_jobs.run_id": run.id,
        "agent_jobs.step": step,
        "agent_jobs.attempt": 1,
        "agent_jobs.outcome": decision,
    }
    context = run._mapping.get("trace_context")
    tracing.span(context, step, start_ns=requested, end_ns=now, attributes=attributes)


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000) * 1000
