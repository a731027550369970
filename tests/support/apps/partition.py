"""The app of the partition lab (tests/support/partition.py): runs that cross a network
cut. Every model call and tool execution notes where it ran (host and process) when it
begins and when it ends, in the side table of the run's database, so the lab can tell
which step ran twice, on which hosts, whether at once, and whether after it was done.

Loaded by its path: AGENT_JOBS_APP=tests.support.apps.partition:app.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from sqlalchemy import Engine, text

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.store.db import make_engine
from agent_jobs.tools import ToolContext
from tests.support.apps.base import record

BEGIN, END = "begin", "end"


def here() -> str:
    """This host (its own UTS namespace's name), this process, and now (one clock for
    every host of the lab: they share the machine), as a record's `what` ends."""
    return f"{socket.gethostname()}:{os.getpid()}:{time.time():.3f}"


class StampedModel:
    """A scripted model whose calls note where and when each began and ended."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.scripted = ScriptedModel(turns, name="stamped")

    @property
    def name(self) -> str:
        return self.scripted.name

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        key = f"{request.run_id}:model:{request.step + 1}"
        record(request.run_id, f"{BEGIN}:{here()}", key)
        response = self.scripted.run_turn(request, sink)
        record(request.run_id, f"{END}:{here()}", key)
        return response


app = AgentApp(roles={"user-7": ["support"], "alice": ["lead"]})


@app.tool(kind="read")
def survey(seconds: float, ctx: ToolContext) -> str:
    """A read that takes a while."""
    record(ctx.run_id, f"{BEGIN}:{here()}", ctx.idempotency_key)
    time.sleep(seconds)
    record(ctx.run_id, f"{END}:{here()}", ctx.idempotency_key)
    return "surveyed"


_engine: list[Engine] = []


def _own_engine() -> Engine:
    """An engine as the worker's own (its schema, and a peer that vanished given up on
    by both sides within `AGENT_JOBS_DATABASE_KEEPALIVE`), for a transaction of its own."""
    if not _engine:
        _engine.append(make_engine(os.environ["AGENT_JOBS_DATABASE_URL"], pool_size=2))
    return _engine[0]


@app.tool(kind="read")
def hold_rows(seconds: float, ctx: ToolContext) -> str:
    """A read that keeps a transaction open on its run's journal rows for a while, as a
    worker's own write does for a moment: a cut then leaves Postgres holding the lock."""
    record(ctx.run_id, f"{BEGIN}:{here()}", ctx.idempotency_key)
    with _own_engine().begin() as conn:
        conn.execute(
            text("UPDATE journal SET attempts = attempts WHERE run_id = :run"), {"run": ctx.run_id}
        )
        time.sleep(seconds)
    record(ctx.run_id, f"{END}:{here()}", ctx.idempotency_key)
    return "held"


@app.tool(kind="action", roles=["support"], approvers=["lead"])
def ship(parcel: str, ctx: ToolContext) -> str:
    """A non-idempotent action: it must never run twice for one call."""
    record(ctx.run_id, f"{BEGIN}:{here()}", ctx.idempotency_key)
    time.sleep(0.5)
    record(ctx.run_id, f"{END}:{here()}", ctx.idempotency_key)
    return f"shipped {parcel}"


def _turns(first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"text": "Looking. ", "delay": 0.6, "tool_calls": first},
        {"text": "Shipping. ", "delay": 0.6, "tool_calls": [_call("ship", parcel="p1")]},
        {"text": "Shipped.", "delay": 0.3},
    ]


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args}


app.agent(
    "across_a_cut",
    model=StampedModel(_turns([_call("survey", seconds=1.5), _call("survey", seconds=1.0)])),
    tools=["survey", "ship"],
)
# The same, one of its reads holding its run's journal rows in an open transaction.
app.agent(
    "across_a_cut_locking",
    model=StampedModel(_turns([_call("hold_rows", seconds=2.0), _call("survey", seconds=1.0)])),
    tools=["survey", "hold_rows", "ship"],
)
