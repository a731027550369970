"""Apps the tests run in both runners; workers load them with AGENT_JOBS_APP=tests.support.apps:app.

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

from agent_jobs import (
    AgentApp,
    AgentOptions,
    ScriptedModel,
    SlidingWindowHistory,
    summarize_with_model,
)
from agent_jobs.messages import ModelRequest, ModelResponse, Usage
from agent_jobs.models.base import DeltaSink
from agent_jobs.prestep import PreStepContext, PreStepDecision
from agent_jobs.tools import ToolContext

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
            engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
            side.create_all(engine, checkfirst=True)
            _engines[url] = engine
        return _engines[url]


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

# Eight reads of half a second each.
app.agent(
    "fanout8",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "slow", "args": {"n": i, "seconds": 0.5}} for i in range(8)]},
            {"text": "eight done"},
        ]
    ),
    tools=TOOLS,
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


# --- the session runtime --------------------------------------------------------------


class FlakyModel(CountingModel):
    """Fails a model step's first `fail_times` calls with a classified provider error."""

    def __init__(
        self,
        turns: list[dict[str, Any]],
        *,
        kind: str,
        fail_times: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(turns, name=f"flaky-{kind}")
        self.kind = kind
        self.fail_times = fail_times
        self.retry_after = retry_after

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        from agent_jobs.errors import ModelError

        key = f"model:{request.step + 1}"
        tried = sum(1 for what, k in executed(request.run_id) if what == "flaky" and k == key)
        if tried < self.fail_times:
            record(request.run_id, "flaky", key)
            raise ModelError(
                f"provider says {self.kind}",
                kind=self.kind,  # type: ignore[arg-type]
                retry_after=self.retry_after,
                status=429 if self.kind == "rate_limit" else 401,
            )
        return super().run_turn(request, sink)


app.agent(
    "ratelimited",
    model=FlakyModel(
        [{"text": "after the wait"}], kind="rate_limit", fail_times=1, retry_after=1.0
    ),
    tools=TOOLS,
)
app.agent(
    "unauthorized",
    model=FlakyModel([{"text": "never"}], kind="auth", fail_times=5),
    tools=TOOLS,
)

# A first step whose tool takes a second: time to steer, cancel or switch the model.
app.agent(
    "steer",
    model=CountingModel(
        [
            {
                "text": "Looking. ",
                "tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 1.0}}],
            },
            {"text": "steered answer"},
        ]
    ),
    tools=TOOLS,
    options=AgentOptions(model="m1", reasoning_effort="high"),
)

# A model step that takes two seconds to stream.
app.agent(
    "slowtalk",
    model=CountingModel([{"text": "a slow and thoughtful answer", "delay": 2.0}]),
    tools=TOOLS,
)

# A deadline of one second against a tool of three.
app.agent(
    "timeboxed",
    model=CountingModel(
        [{"tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 3.0}}]}, {"text": "late"}]
    ),
    tools=TOOLS,
    options=AgentOptions(default_timeout=1.0),
)

# Pre-step listeners act on these agents.
for gated_agent in ("gatekeeper", "carrier", "series"):
    app.agent(
        gated_agent,
        model=CountingModel(
            [{"tool_calls": [{"name": "lookup", "args": {"order_id": "1"}}]}, {"text": "through"}]
        ),
        tools=TOOLS,
    )


@app.before_step
def gate(context: PreStepContext) -> PreStepDecision | None:
    if context.agent == "gatekeeper" and context.step == 2:
        return PreStepDecision(kind="reject", reason="step 2 is closed")
    if context.agent == "carrier" and context.step == 1:
        return PreStepDecision(kind="enter", messages=["(policy: be brief)"])
    if context.agent == "series" and context.step == 2:
        return PreStepDecision(
            kind="enter", messages=["start over from here"], starts_request_series=True
        )
    return None


# Step 2's model call streams for three seconds: a worker can be killed after the claim.
app.agent(
    "claimkill",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 1.0}}]},
            {"text": "answered after the crash", "delay": 3.0},
        ]
    ),
    tools=TOOLS,
)


# --- delegation, questions, personas ------------------------------------------------------

app.persona("pirate", "Arr, matey.\n{system}", tools=["lookup"])


def _delegate(agent: str, task: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": agent, "args": {"task": task}}]}


# Three levels: boss → manager → clerk, and the clerk's refund needs a lead's approval.
app.agent(
    "boss",
    model=CountingModel([_delegate("manager", "handle order 42"), {"text": "boss: all handled"}]),
    tools=["manager"],
)
app.agent(
    "manager",
    model=CountingModel([_delegate("clerk", "refund order 42"), {"text": "manager: clerk did it"}]),
    tools=["clerk"],
)
app.agent(
    "clerk",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "refund", "args": {"order_id": "42", "amount": 3}}]},
            {"text": "clerk: refunded 42"},
        ]
    ),
    tools=["refund"],
)
# An agent that hands its task to itself until the depth budget says no.
app.agent(
    "recurse",
    model=CountingModel([_delegate("recurse", "again"), {"text": "stopped"}]),
    tools=["recurse"],
)


@app.tool(kind="read")
def schedule(what: str, ctx: ToolContext) -> str:
    """Book something on a day the person picks."""
    if ctx.answers is None:
        ctx.ask(["Which day suits you?"])
    record(ctx.run_id, "schedule", ctx.idempotency_key)
    return f"{what} booked for {ctx.answers['q1']}"


app.agent(
    "planner",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "schedule", "args": {"what": "a call"}}]},
            {"text": "planned"},
        ]
    ),
    tools=["schedule"],
)
# Two reads of one turn that both ask: the fan-out waits on two people at once.
app.agent(
    "planner2",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "schedule", "args": {"what": "a call"}},
                    {"name": "schedule", "args": {"what": "a visit"}},
                ]
            },
            {"text": "planned both"},
        ]
    ),
    tools=["schedule"],
)


# --- a bounded history ---------------------------------------------------------------------


class SummaryModel:
    """Summarises, and counts how often it was asked."""

    name = "summarizer"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        record(request.run_id, "summary", request.messages[0].content[:50])
        return ModelResponse(
            text="they talked about orders",
            usage=Usage(input_tokens=40, output_tokens=5),
            model=self.name,
        )


app.agent(
    "windowed",
    model=CountingModel([{"text": "windowed answer"}]),
    history=SlidingWindowHistory(max_messages=4),
)
app.agent(
    "summarized",
    model=CountingModel([{"text": "summarized answer", "delay": 0.0}]),
    history=SlidingWindowHistory(max_messages=2, summarize=summarize_with_model(SummaryModel())),
)
# The summary is made, then the model streams for three seconds: time to kill a worker.
app.agent(
    "summarykill",
    model=CountingModel([{"text": "after the summary", "delay": 3.0}]),
    history=SlidingWindowHistory(max_messages=2, summarize=summarize_with_model(SummaryModel())),
)


# --- a poison step ----------------------------------------------------------------------------


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


def wait_held_starts(run_id: str, n: int, timeout: float) -> list[tuple[int, float]]:
    """Block until the run's `held` step has started `n` times."""
    deadline = time.monotonic() + timeout
    while len(found := held_starts(run_id)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the held step started {len(found)} times, not {n}")
        time.sleep(0.02)
    return found


@app.tool(kind="read")
def wait_for_gate(ctx: ToolContext) -> str:
    """A read that waits until the test creates `$TEST_GATE_DIR/<run_id>`."""
    record(ctx.run_id, "wait_for_gate:start", ctx.idempotency_key)
    path = os.path.join(os.environ["TEST_GATE_DIR"], ctx.run_id)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never opened {path}")
        time.sleep(0.02)
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


# --- async tools: awaited to completion on both runners -------------------------------------


@app.tool(kind="read")
async def track(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Track an order's parcel, awaiting the carrier on the way."""
    import asyncio

    await asyncio.sleep(0.05)
    record(ctx.run_id, "track", ctx.idempotency_key)
    return {"order_id": order_id, "parcel": f"PX-{order_id}", "awaited": True}


app.agent(
    "tracker",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "track", "args": {"order_id": "42"}},
                    {"name": "track", "args": {"order_id": "7"}},
                ]
            },
            {"text": "both parcels tracked"},
        ]
    ),
    tools=["track"],
)


# --- approval deadlines, and every approval of a turn at once ---------------------------

DEADLINE = 1.0  # seconds an approval of the tools below waits for a person


@app.tool(kind="action", roles=["support"], approvers=["lead"], approval_timeout=DEADLINE)
def refund_or_lapse(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order; nobody deciding in time rejects it."""
    record(ctx.run_id, "refund_or_lapse", ctx.idempotency_key)
    return {"order_id": order_id, "refunded": amount}


@app.tool(
    kind="action",
    roles=["support"],
    approvers=["lead"],
    approval_timeout=DEADLINE,
    on_timeout="approve",
)
def refund_unless_stopped(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order; nobody deciding in time approves it."""
    record(ctx.run_id, "refund_unless_stopped", ctx.idempotency_key)
    return {"order_id": order_id, "refunded": amount}


@app.tool(
    kind="action",
    roles=["support"],
    approvers=["lead"],
    approval_timeout=DEADLINE,
    on_timeout="escalate",
    escalate_to=["manager"],
)
def refund_escalated(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order; nobody deciding in time hands it to a manager."""
    record(ctx.run_id, "refund_escalated", ctx.idempotency_key)
    return {"order_id": order_id, "refunded": amount}


def _one_action(tool: str) -> CountingModel:
    call = {"name": tool, "args": {"order_id": "42", "amount": 2}}
    return CountingModel([{"tool_calls": [call]}, {"text": f"{tool} done"}])


DEADLINED = ["refund_or_lapse", "refund_unless_stopped", "refund_escalated"]
app.agent("lapsing", model=_one_action("refund_or_lapse"), tools=DEADLINED)
app.agent("lenient", model=_one_action("refund_unless_stopped"), tools=DEADLINED)
app.agent("escalating", model=_one_action("refund_escalated"), tools=DEADLINED)

# Two refunds and a read in one turn: both asked for at once, run in call order.
app.agent(
    "two_refunds",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "refund", "args": {"order_id": "42", "amount": 4}},
                    {"name": "lookup", "args": {"order_id": "7"}},
                    {"name": "refund", "args": {"order_id": "7", "amount": 6}},
                ]
            },
            {"text": "two_refunds done"},
        ]
    ),
    tools=TOOLS,
)
