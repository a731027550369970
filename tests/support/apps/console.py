"""The runs console's test app (workers and the server load
`tests.support.apps.console:app`): the HTTP API's app (`tests.support.apps.http`, its
actors and agents) with the agents the console's page tests need.

- `held_talker` streams its first word, then holds the rest of its reply until the test
  opens the run's gate (`tests.support.apps.open_gate`): a page that shows text as it
  comes has shown the first word while the others do not exist yet. Its reply calls
  `lookup`, a step boundary where a pause asked meanwhile takes hold.
- `broken` fails on its model step (the provider refuses it): a failed run, with its
  error, for the list's failed filter.
- `payer` asks to `pay`, an action that is not idempotent and that holds, once begun,
  until the test opens the run's gate: a worker killed inside it leaves the call's
  outcome unknown, for a person to reconcile.
- `office` delegates to `desk`, which delegates to `chat`: a tree of three runs.
"""

from __future__ import annotations

import os
from typing import Any

from agent_jobs.tools import ToolContext
from tests.support.apps.base import CountingModel, HeldTextModel, record, wait_for_gate_of
from tests.support.apps.http import app
from tests.support.apps.runtime import FlakyModel

__all__ = ["app"]

HELD_WORDS = "Reading the order history slowly, one entry at a time."


@app.tool(kind="action", approvers=["lead"])
def pay(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Pay an order out: not idempotent (an action's default). Its start is counted with
    the process that runs it (`pay:start:<pid>`), then it holds until the run's gate."""
    record(ctx.run_id, f"pay:start:{os.getpid()}", ctx.idempotency_key)
    wait_for_gate_of(ctx.run_id)
    record(ctx.run_id, "pay", ctx.idempotency_key)
    return {"paid": order_id}


app.agent(
    "held_talker",
    model=HeldTextModel(
        [
            {"text": HELD_WORDS, "tool_calls": [{"name": "lookup", "args": {"order_id": "42"}}]},
            {"text": "Order 42 was looked up."},
        ],
        name="held-talker",
    ),
    tools=["lookup"],
)
app.agent("broken", model=FlakyModel([{"text": "never"}], kind="auth", fail_times=1000))
app.agent(
    "payer",
    model=CountingModel(
        [{"tool_calls": [{"name": "pay", "args": {"order_id": "A1"}}]}, {"text": "all paid"}]
    ),
    tools=["pay"],
)


def _delegate(agent: str, task: str, answer: str) -> CountingModel:
    return CountingModel(
        [{"tool_calls": [{"name": agent, "args": {"task": task}}]}, {"text": answer}]
    )


app.agent("desk", model=_delegate("chat", "say something", "the desk is done"), tools=["chat"])
app.agent("office", model=_delegate("desk", "see to it", "the office is done"), tools=["desk"])
