"""Agents with a concurrency key, for the flow-control tests; workers load them with
AGENT_JOBS_APP=tests.support.apps.concurrency:app.

Executions are counted in the side table of tests/apps.py (`record`, `held_starts`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from agent_jobs import AgentApp
from agent_jobs.runs import RunRequest
from agent_jobs.tools import ToolContext
from tests.support.apps import CountingModel, record

app = AgentApp(roles={"user-7": ["support"], "alice": ["lead"]})


@app.tool(kind="read")
def nap(seconds: float, ctx: ToolContext) -> str:
    """A read that takes a while."""
    record(ctx.run_id, "nap", ctx.idempotency_key)
    time.sleep(seconds)
    return "rested"


@app.tool(kind="read")
def held(seconds: float, ctx: ToolContext) -> int:
    """A read that says which process runs it (a test kills that one) and takes a while."""
    record(ctx.run_id, f"held:start:{os.getpid()}", ctx.idempotency_key)
    time.sleep(seconds)
    record(ctx.run_id, "held", ctx.idempotency_key)
    return os.getpid()


def _napping(seconds: float, answer: str) -> CountingModel:
    return CountingModel(
        [{"tool_calls": [{"name": "nap", "args": {"seconds": seconds}}]}, {"text": answer}]
    )


# At most two runs of one actor at once.
app.agent(
    "limited",
    model=_napping(0.3, "limited done"),
    tools=["nap"],
    concurrency_key="actor",
    max_concurrent=2,
)

# One run of an actor at a time, whose tool takes four seconds: a worker is killed then.
app.agent(
    "single_held",
    model=CountingModel(
        [{"tool_calls": [{"name": "held", "args": {"seconds": 4.0}}]}, {"text": "held done"}]
    ),
    tools=["held"],
    concurrency_key="actor",
    max_concurrent=1,
)

# One run of an actor at a time, a single model step of a second and a half.
app.agent(
    "single_slow",
    model=CountingModel([{"text": "slow done", "delay": 1.5}]),
    concurrency_key="actor",
    max_concurrent=1,
)

# One run per thread at a time (a thread's turns are one at a time anyway), and one per
# tenant, as the run's metadata names it; a run with no tenant is held by nothing.
app.agent(
    "per_thread",
    model=_napping(0.3, "thread done"),
    tools=["nap"],
    concurrency_key="thread",
    max_concurrent=1,
)


def tenant(request: RunRequest) -> str | None:
    found: Any = request.metadata.get("tenant")
    return None if found is None else str(found)


app.agent(
    "per_tenant",
    model=_napping(0.5, "tenant done"),
    tools=["nap"],
    concurrency_key=tenant,
    max_concurrent=1,
)

# A delegation to an agent whose single place another run holds: the child runs anyway.
app.agent(
    "helper",
    model=_napping(2.0, "helped"),
    tools=["nap"],
    description="Helps.",
    concurrency_key="actor",
    max_concurrent=1,
)
app.agent(
    "lead",
    model=CountingModel(
        [{"tool_calls": [{"name": "helper", "args": {"task": "help"}}]}, {"text": "led"}]
    ),
    tools=["helper"],
    concurrency_key="actor",
    max_concurrent=1,
)

# No key: a plain agent beside them.
app.agent("plain", model=_napping(0.2, "plain done"), tools=["nap"])
