"""Async tools, approval deadlines, and every approval of a turn at once."""

from __future__ import annotations

from typing import Any

from agent_jobs.tools import ToolContext
from tests.support.apps.base import TOOLS, CountingModel, app, record


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
