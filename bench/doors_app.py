"""The doors benchmark's agents: an action that notes when it starts, a model that notes
when it emits each delta (wall-clock seconds, shared by every process on the machine)."""

from __future__ import annotations

import os
import time
from functools import lru_cache

import redis

from agent_jobs import AgentApp, ScriptedModel, ToolContext
from agent_jobs.messages import ModelRequest, ModelResponse, Usage
from agent_jobs.models.base import DeltaSink

DELTAS = 20
DELTA_GAP = 0.05  # seconds between deltas, like a model streaming tokens
WARM_UP = 2.0  # seconds before the first delta, so `tail` is already following

app = AgentApp(name="bench-doors", roles={"bench": ["requester"], "approver": ["lead"]})


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["AGENT_JOBS_BROKER_URL"])


def started_key(run_id: str) -> str:
    return f"bench:tool_started:{run_id}"


@app.tool(kind="action", approvers=["lead"])
def act(n: int, ctx: ToolContext) -> int:
    """An action: it records the moment it starts."""
    _redis().set(started_key(ctx.run_id), repr(time.time()), ex=3600)
    return n


class ClockModel:
    """Streams deltas whose text is the wall-clock time they were emitted."""

    @property
    def name(self) -> str:
        return "clock"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        time.sleep(WARM_UP)
        parts = []
        for _ in range(DELTAS):
            part = f"{time.time():.6f} "
            sink.text(part)
            parts.append(part)
            time.sleep(DELTA_GAP)
        return ModelResponse(text="".join(parts), usage=Usage(input_tokens=1, output_tokens=1))


app.agent(
    "gated",
    model=ScriptedModel([{"tool_calls": [{"name": "act", "args": {"n": 1}}]}, {"text": "ok"}]),
    tools=["act"],
)
app.agent("clock", model=ClockModel())
