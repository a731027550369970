"""Faults: a poison step, a CPU-bound tool on a queue of its own, steps that overrun
their time limit, and hardening tools that wait for the test and name their process."""

from __future__ import annotations

import os
import time

from sqlalchemy import select

from agent_jobs.tools import ToolContext
from tests.support.apps.base import CountingModel, app, executions, record, side_engine
from tests.support.waiting import eventually


@app.tool(kind="read")
def crash_worker(ctx: ToolContext) -> str:
    """Kills the process that runs it, every time: a step no worker survives."""
    import os
    import signal

    record(ctx.run_id, "crash", ctx.idempotency_key)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


app.agent(
    "poison",
    model=CountingModel([{"tool_calls": [{"name": "crash_worker", "args": {}}]}, {"text": "x"}]),
    tools=["crash_worker"],
)


# --- a CPU-bound tool on a queue of its own --------------------------------------------------

CPU_QUEUE = "agent_jobs_test_cpu"  # the cluster tests' own broker: no other session's


@app.tool(kind="read", queue=CPU_QUEUE)
def crunch(n: int, ctx: ToolContext) -> dict[str, int]:
    """Adds up numbers, holding the GIL: run on a prefork worker of its own."""
    record(ctx.run_id, f"crunch:{os.getpid()}", ctx.idempotency_key)
    return {"sum": sum(range(n)), "pid": os.getpid()}


app.agent(
    "cruncher",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "crunch", "args": {"n": 1000}},
                    {"name": "lookup", "args": {"order_id": "A1"}},
                ]
            },
            {"tool_calls": [{"name": "crunch", "args": {"n": 10}}]},
            {"text": "crunched"},
        ]
    ),
    tools=["crunch", "lookup"],
)


# --- steps that overrun their time limit ---------------------------------------------------


@app.tool(kind="read")
def python_loop(seconds: float, ctx: ToolContext) -> str:
    """Runs Python for `seconds` (a time limit can interrupt it)."""
    record(ctx.run_id, f"loop:start:{os.getpid()}", ctx.idempotency_key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)
    record(ctx.run_id, "loop:end", ctx.idempotency_key)
    return "looped"


@app.tool(kind="read")
def stubborn_loop(seconds: float, ctx: ToolContext) -> str:
    """As `python_loop`, but it ignores the soft time limit."""
    from celery.exceptions import SoftTimeLimitExceeded

    record(ctx.run_id, f"loop:start:{os.getpid()}", ctx.idempotency_key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.02)
        except SoftTimeLimitExceeded:
            record(ctx.run_id, "loop:soft", ctx.idempotency_key)
    record(ctx.run_id, "loop:end", ctx.idempotency_key)
    return "looped"


for _name, _tool in (("overrun", "python_loop"), ("stubborn", "stubborn_loop")):
    app.agent(
        _name,
        model=CountingModel(
            [{"tool_calls": [{"name": _tool, "args": {"seconds": 30}}]}, {"text": "went on"}]
        ),
        tools=[_tool],
    )


# --- hardening: steps that wait for the test, and name the process that runs them ----------


@app.tool(kind="read")
def held(seconds: float, ctx: ToolContext) -> int:
    """A read that records the process running it, then takes a while."""
    record(ctx.run_id, f"held:start:{os.getpid()}", ctx.idempotency_key)
    time.sleep(seconds)
    record(ctx.run_id, "held", ctx.idempotency_key)
    return os.getpid()


def held_starts(run_id: str) -> list[tuple[int, float]]:
    """(pid, time) of each start of the run's `held` step, in order."""
    with side_engine().connect() as conn:
        rows = conn.execute(
            select(executions.c.what, executions.c.at)
            .where(executions.c.run_id == run_id, executions.c.what.like("held:start:%"))
            .order_by(executions.c.id)
        ).all()
    return [(int(r.what.rsplit(":", 1)[1]), r.at.timestamp()) for r in rows]


def held_start_of(run_id: str, step: str) -> list[tuple[int, float]]:
    """(pid, time) of each start of one `held` step of the run, in order."""
    with side_engine().connect() as conn:
        rows = conn.execute(
            select(executions.c.what, executions.c.at)
            .where(
                executions.c.run_id == run_id,
                executions.c.what.like("held:start:%"),
                executions.c.key == f"{run_id}:{step}",
            )
            .order_by(executions.c.id)
        ).all()
    return [(int(r.what.rsplit(":", 1)[1]), r.at.timestamp()) for r in rows]


def wait_held_starts(run_id: str, n: int, timeout: float | None = None) -> list[tuple[int, float]]:
    """Block until the run's `held` step has started `n` times (`timeout`: a guard
    against a hang, TIMEOUT by default)."""
    return eventually(
        lambda: found if len(found := held_starts(run_id)) >= n else None,
        timeout,
        what=f"the held step of run {run_id} to start {n} times",
        context=lambda: held_starts(run_id),
    )


@app.tool(kind="read")
def wait_for_gate(ctx: ToolContext) -> str:
    """A read that waits until the test creates `$TEST_GATE_DIR/<run_id>`."""
    record(ctx.run_id, "wait_for_gate:start", ctx.idempotency_key)
    path = os.path.join(os.environ["TEST_GATE_DIR"], ctx.run_id)
    eventually(lambda: os.path.exists(path), what=f"the test to open {path}")
    record(ctx.run_id, "wait_for_gate", ctx.idempotency_key)
    return "opened"


app.agent(
    "held",
    model=CountingModel(
        [{"tool_calls": [{"name": "held", "args": {"seconds": 4.0}}]}, {"text": "held done"}]
    ),
    tools=["held"],
)

# A fan-out of two held reads: the first member runs where model:1 ended, the second is sent.
app.agent(
    "held_pair",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "held", "args": {"seconds": 4.0}},
                    {"name": "held", "args": {"seconds": 4.0}},
                ]
            },
            {"text": "both held"},
        ]
    ),
    tools=["held"],
)

app.agent(
    "gated_by_file",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "wait_for_gate", "args": {}}]},
            {"tool_calls": [{"name": "lookup", "args": {"order_id": "9"}}]},
            {"text": "through the gate"},
        ]
    ),
    tools=["wait_for_gate", "lookup"],
)
