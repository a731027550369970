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
- `held_writer` writes a `refund` call's arguments in two pieces and holds between them
  until the test opens the run's gate: the page shows the call being written, then the
  call as recorded (an action: the run waits for a lead).
- The schedule `console-tick` starts a `chat` run every five seconds (beat ticks it): runs
  whose ids (`sched:console-tick:<time>`) hold colons. It catches up nothing, so a stack
  started again does not begin with the occurrences it missed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agent_jobs.messages import ModelRequest, ModelResponse, ToolCall, Usage
from agent_jobs.models.base import DeltaSink, args_writer
from agent_jobs.tools import ToolContext
from tests.support.apps.base import CountingModel, HeldTextModel, record, wait_for_gate_of
from tests.support.apps.http import app
from tests.support.apps.runtime import FlakyModel

__all__ = ["TICK", "app"]

TICK = "console-tick"  # the schedule's name

HELD_WORDS = "Reading the order history slowly, one entry at a time."
# The two pieces of the arguments `held_writer` writes, the second held until the gate opens.
HELD_ARGS = ('{"order_id": "42", "amount": 5, ', '"note": "<img src=x onerror=alert(1)>"}')


class HeldArgsModel:
    """Streams a refund's arguments as a provider does, holding between the pieces."""

    name = "held-writer"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        usage = Usage(input_tokens=10, output_tokens=5)
        if request.step > 0:
            sink.text("Refunded.")
            return ModelResponse(text="Refunded.", usage=usage, model=self.name)
        write = args_writer(sink)
        assert write is not None, "the run's stream takes arguments as they are written"
        sink.text("Refunding. ")
        first, rest = HELD_ARGS
        write("call_w", "refund", first, index=0, offset=0)
        wait_for_gate_of(request.run_id)
        write("call_w", "refund", rest, index=0, offset=len(first))
        call = ToolCall(id="call_w", name="refund", args=json.loads(first + rest))
        return ModelResponse(text="Refunding. ", tool_calls=[call], usage=usage, model=self.name)


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
app.agent("held_writer", model=HeldArgsModel(), tools=["refund"])
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
app.schedule(
    TICK, agent="chat", cron="* * * * * */5", input="a tick", actor="backend", catch_up="none"
)
