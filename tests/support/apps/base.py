"""The base of the tests' app: the side table that counts executions, the counting
model, the app itself with its basic tools (lookup, slow, boom, refund) and agents.

Every model call and tool execution is counted in a side table of the run's own
database (`test_executions`), so a test can tell from outside the worker process how
often each step really ran.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError, ProgrammingError
from sqlalchemy.pool import NullPool

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.tools import ToolContext
from tests.support.waiting import eventually

side = MetaData()
executions = Table(
    "test_executions",
    side,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("what", String(200), nullable=False),
    Column("key", String(300), nullable=False),
    Column("at", DateTime(timezone=True), server_default=func.now()),
)

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def side_engine() -> Engine:
    url = os.environ["AGENT_JOBS_DATABASE_URL"]
    with _lock:
        if url not in _engines:
            # No idle connection: every worker process of three test sessions has one,
            # and together they would hold half of Postgres's 100 for counting alone.
            engine = create_engine(
                url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool
            )
            create_side_table(engine)
            _engines[url] = engine
        return _engines[url]


def create_side_table(engine: Engine) -> None:
    """The side table, if it is not there. Worker processes starting together on a new
    database race to create it: the loser's CREATE fails, and the table is there."""
    try:
        side.create_all(engine, checkfirst=True)
    except (ProgrammingError, IntegrityError):
        side.create_all(engine, checkfirst=True)  # raises again if it is really missing


def record(run_id: str, what: str, key: str) -> None:
    with side_engine().begin() as conn:
        conn.execute(insert(executions).values(run_id=run_id, what=what, key=key))


def executed(run_id: str) -> list[tuple[str, str]]:
    """(what, key) of every execution of the run, in order."""
    with side_engine().connect() as conn:
        rows = conn.execute(
            select(executions.c.what, executions.c.key)
            .where(executions.c.run_id == run_id)
            .order_by(executions.c.id)
        ).all()
    return [(r.what, r.key) for r in rows]


def counted(run_id: str, what: str) -> int:
    """How many executions of the run recorded `what`."""
    with side_engine().connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(executions)
                .where(executions.c.run_id == run_id, executions.c.what == what)
            ).scalar_one()
        )


class CountingModel:
    """A ScriptedModel that records each call it serves."""

    def __init__(self, turns: list[dict[str, Any]], name: str = "counting") -> None:
        self.scripted = ScriptedModel(turns, name=name)

    @property
    def name(self) -> str:
        return self.scripted.name

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        record(request.run_id, "model", f"model:{request.step + 1}")
        return self.scripted.run_turn(request, sink)


app = AgentApp(
    roles={
        "user-7": ["support"],
        "alice": ["lead"],
        "bob": ["support"],
        "eve": [],
        "mia": ["manager"],
    },
)


@app.tool(kind="read")
def lookup(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Look up an order."""
    record(ctx.run_id, "lookup", ctx.idempotency_key)
    return {"order_id": order_id, "status": "lost" if order_id == "42" else "shipped"}


@app.tool(kind="read")
def slow(n: int, seconds: float, ctx: ToolContext) -> int:
    """A read that takes a while."""
    record(ctx.run_id, "slow:start", ctx.idempotency_key)
    time.sleep(seconds)
    record(ctx.run_id, "slow", ctx.idempotency_key)
    return n * 10


@app.tool(kind="read")
def together(n: int, of: int, ctx: ToolContext) -> int:
    """A read that waits until `of` reads of its run have started: it ends only if they
    all ran at once (one after another, the first would wait for good)."""
    record(ctx.run_id, "together:start", ctx.idempotency_key)
    eventually(
        lambda: counted(ctx.run_id, "together:start") >= of,
        what=f"{of} reads of {ctx.run_id} to run at once",
    )
    record(ctx.run_id, "together", ctx.idempotency_key)
    return n * 10


@app.tool(kind="read")
def until_opened(ctx: ToolContext) -> str:
    """A read that runs until the test opens its run's gate (`open_gate`): the test, not
    the clock, says when it returns."""
    record(ctx.run_id, "until_opened:start", ctx.idempotency_key)
    wait_for_gate_of(ctx.run_id)
    record(ctx.run_id, "until_opened", ctx.idempotency_key)
    return "opened"


def open_gate(run_id: str) -> None:
    """Let the run's `until_opened` read return."""
    record(run_id, "gate:open", run_id)


@app.tool(kind="read")
def boom(message: str, ctx: ToolContext) -> str:
    """A read that always fails."""
    record(ctx.run_id, "boom", ctx.idempotency_key)
    raise RuntimeError(message)


@app.tool(kind="action", roles=["support"], approvers=["lead"])
def refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order."""
    record(ctx.run_id, "refund", ctx.idempotency_key)
    return {"order_id": order_id, "refunded": amount}


TOOLS = ["lookup", "slow", "boom", "refund"]

# Two parallel reads, an approval, an answer: the product in one run.
app.agent(
    "support",
    model=CountingModel(
        [
            {
                "text": "Checking. ",
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "42"}},
                    {"name": "lookup", "args": {"order_id": "7"}},
                ],
            },
            {
                "text": "Refunding. ",
                "tool_calls": [{"name": "refund", "args": {"order_id": "42", "amount": 5}}],
            },
            {"text": "Order 42 was refunded."},
        ]
    ),
    system="You are support.",
    tools=TOOLS,
)

# A failing read beside two good ones, then a bad call, then an answer.
app.agent(
    "mixed",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "1"}},
                    {"name": "boom", "args": {"message": "kaput"}},
                    {"name": "lookup", "args": {"order_id": "2"}},
                ]
            },
            {"tool_calls": [{"name": "lookup", "args": {"order": "bad"}}]},
            {"text": "Done with what I could."},
        ]
    ),
    tools=TOOLS,
)

# Eight reads that each wait until all eight have started.
app.agent(
    "fanout8",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "together", "args": {"n": i, "of": 8}} for i in range(8)]},
            {"text": "eight done"},
        ]
    ),
    tools=["together"],
)

# A slow model step, then a slow tool step, then an answer: crash tests kill workers.
app.agent(
    "crashy",
    model=CountingModel(
        [
            {
                "text": "thinking slowly ",
                "delay": 3.0,
                "tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 3.0}}],
            },
            {"text": "survived"},
        ]
    ),
    tools=TOOLS,
)


class HeldTextModel(CountingModel):
    """A CountingModel whose first reply stops after its first word until the test opens
    the run's gate (`open_gate`): a reader that shows words as they come has shown the
    first while the second does not exist yet."""

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        if request.step > 0:
            return super().run_turn(request, sink)
        run_id = request.run_id

        class Held:
            said = 0

            def text(self, delta: str) -> None:
                if self.said == 1:
                    wait_for_gate_of(run_id)
                self.said += 1
                sink.text(delta)

        return super().run_turn(request, Held())


def wait_for_gate_of(run_id: str) -> None:
    """Return once the test opened the run's gate (`open_gate`)."""
    eventually(lambda: counted(run_id, "gate:open"), what=f"the test to open {run_id}'s gate")


# Words the test lets out one at a time: the first, then the rest once the gate opens.
app.agent(
    "held_words",
    model=HeldTextModel(
        [
            {
                "text": "thinking slowly ",
                "tool_calls": [{"name": "lookup", "args": {"order_id": "1"}}],
            },
            {"text": "survived"},
        ]
    ),
    tools=TOOLS,
)

# The benchmark's W1 shape: two turns of two reads each, then an answer.
app.agent(
    "w1",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "1"}},
                    {"name": "lookup", "args": {"order_id": "2"}},
                ]
            },
            {
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "3"}},
                    {"name": "lookup", "args": {"order_id": "4"}},
                ]
            },
            {"text": "w1 answer"},
        ]
    ),
    tools=TOOLS,
)

# A read and an action in one turn: the sequential shape, parked on an approval.
app.agent(
    "gated",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "42"}},
                    {"name": "refund", "args": {"order_id": "42", "amount": 1}},
                ]
            },
            {"text": "gated done"},
        ]
    ),
    tools=TOOLS,
)

# Two reads in one turn, the second slow: the parallel shape, parked on a step.
app.agent(
    "twoslow",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "1"}},
                    {"name": "slow", "args": {"n": 2, "seconds": 2.0}},
                ]
            },
            {"text": "twoslow done"},
        ]
    ),
    tools=TOOLS,
)
