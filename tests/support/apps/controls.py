"""The app of the operator-control tests (workers load it with
AGENT_JOBS_APP=tests.support.apps.controls:app). Model calls and tool runs are counted in the side
table of tests/apps.py; a step that fails, or kills its worker, does so until the test
opens its run's gate (a file `$TEST_GATE_DIR/<run_id>`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from agent_jobs import AgentApp
from agent_jobs.errors import ModelError
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.tools import ToolContext
from tests.support.apps import CountingModel, record

app = AgentApp(
    roles={
        "user-7": ["support"],
        "alice": ["lead"],
        "carol": ["support", "lead"],  # runs charges and may decide them
        "backend": ["service"],
        "eve": [],
    }
)


def gate_open(run_id: str) -> bool:
    return (Path(os.environ["TEST_GATE_DIR"]) / run_id).exists()


@app.tool(kind="read")
def crawl(n: int, seconds: float, ctx: ToolContext) -> int:
    """A read that takes a while."""
    record(ctx.run_id, "crawl:start", ctx.idempotency_key)
    time.sleep(seconds)
    record(ctx.run_id, "crawl", ctx.idempotency_key)
    return n * 10


@app.tool(kind="read")
def peek(item: str, ctx: ToolContext) -> dict[str, Any]:
    """Look something up."""
    record(ctx.run_id, "peek", ctx.idempotency_key)
    return {"item": item, "found": True}


@app.tool(kind="action", roles=["support"], approvers=["lead"])
def charge(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Charge an order: a side effect."""
    record(ctx.run_id, "charge", ctx.idempotency_key)
    return {"order_id": order_id, "charged": amount}


@app.tool(kind="read")
def shaky(ctx: ToolContext) -> str:
    """Kills the process that runs it until the run's gate is open."""
    record(ctx.run_id, "shaky", ctx.idempotency_key)
    if not gate_open(ctx.run_id):
        os.kill(os.getpid(), signal.SIGKILL)
    return "steady now"


TOOLS = ["crawl", "peek", "charge", "shaky"]

# A slow read, another, then the answer: paused while the first runs.
app.agent(
    "pausable",
    model=CountingModel(
        [
            {"text": "first ", "tool_calls": [{"name": "crawl", "args": {"n": 1, "seconds": 1.5}}]},
            {
                "text": "second ",
                "tool_calls": [{"name": "crawl", "args": {"n": 2, "seconds": 0.1}}],
            },
            {"text": "all crawled"},
        ]
    ),
    tools=TOOLS,
)


class FlakyModel(CountingModel):
    """Its second call fails (not a failure to retry) until the run's gate is open."""

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        if request.step == 1 and not gate_open(request.run_id):
            record(request.run_id, "model", f"model:{request.step + 1}")
            raise ModelError("the provider refused the request", kind="invalid_request")
        return super().run_turn(request, sink)


# A read, then a model call that fails on the step until the gate opens.
app.agent(
    "flaky",
    model=FlakyModel(
        [
            {"tool_calls": [{"name": "peek", "args": {"item": "a"}}]},
            {"text": "answered after all"},
        ]
    ),
    tools=TOOLS,
)

# A read that kills its worker until the gate opens: a dead letter.
app.agent(
    "crashing",
    model=CountingModel([{"tool_calls": [{"name": "shaky", "args": {}}]}, {"text": "survived"}]),
    tools=TOOLS,
)

# A read, a charge a person approves, the answer: forked at a model or a tool step.
app.agent(
    "forkable",
    model=CountingModel(
        [
            {"text": "Looking. ", "tool_calls": [{"name": "peek", "args": {"item": "42"}}]},
            {
                "text": "Charging. ",
                "tool_calls": [{"name": "charge", "args": {"order_id": "42", "amount": 5}}],
            },
            {"text": "Order 42 charged."},
        ]
    ),
    system="You are billing.",
    tools=TOOLS,
)

# Two reads of one turn, together: a fan-out.
app.agent(
    "fanning",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "peek", "args": {"item": "x"}},
                    {"name": "peek", "args": {"item": "y"}},
                ]
            },
            {"text": "both seen"},
        ]
    ),
    tools=TOOLS,
)
