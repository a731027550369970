"""Delegation, questions, personas."""

from __future__ import annotations

from typing import Any

from agent_jobs.tools import ToolContext
from tests.support.apps.base import CountingModel, app, record

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
