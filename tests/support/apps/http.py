"""The HTTP API's test app (workers and the server load `tests.support.apps.http:app`).

An actor for each part of the auth model: `user-7` and `bob` ask (support), `alice`
and `carol` approve (lead), `eve` has no role, `backend` is a service, `olga` an operator
(reads and controls every run, decides nothing). `sleeper` (tests/support/apps/timers.py)
calls `wait` with its input's arguments (`{"seconds": 3600}`). The refund's
`note` carries the run's input word for word, so a test chooses the arguments a person
is shown (markup included). Executions are counted in `tests.apps`' side table.
"""

from __future__ import annotations

from typing import Any

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.tools import ToolContext
from tests.support.apps import record
from tests.support.apps.timers import SleepyModel

ACTORS = {
    "user-7": ["support"],
    "bob": ["support"],
    "alice": ["lead"],
    "carol": ["lead"],
    "eve": [],
    "backend": ["service"],
    "olga": ["operator"],
}
ANSWER = "Refunded order 42."

app = AgentApp(roles=ACTORS)


@app.tool(kind="read")
def lookup(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Look up an order."""
    record(ctx.run_id, "lookup", ctx.idempotency_key)
    return {"order_id": order_id, "status": "lost"}


@app.tool(kind="action", roles=["support"], approvers=["lead"])
def refund(order_id: str, amount: float, note: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order."""
    record(ctx.run_id, "refund", ctx.idempotency_key)
    return {"order_id": order_id, "refunded": amount}


@app.tool(kind="read")
def schedule(what: str, ctx: ToolContext) -> str:
    """Book something on a day the person picks."""
    if ctx.answers is None:
        ctx.ask(["Which day suits you?", "Morning or afternoon?"])
    record(ctx.run_id, "schedule", ctx.idempotency_key)
    return f"{what} booked for {ctx.answers['q1']} ({ctx.answers['q2']})"


class NoteRefund:
    """Asks to refund order 42 with the user's words as the note, then answers."""

    name = "note-refund"

    def __init__(self, words: int = 0, delay: float = 0.0) -> None:
        # `words` deltas streamed over `delay` seconds before the refund is asked for.
        self.prelude = " ".join(f"w{i}" for i in range(words))
        self.delay = delay

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        said = next(m.content for m in reversed(request.messages) if m.role == "user")
        refund_call = {"name": "refund", "args": {"order_id": "42", "amount": 5, "note": said}}
        first = {"text": f"{self.prelude} Refunding. ".lstrip(), "delay": self.delay}
        script = ScriptedModel([{**first, "tool_calls": [refund_call]}, {"text": ANSWER}])
        return script.run_turn(request, sink)


app.agent("support", model=NoteRefund(), tools=["lookup", "refund"])
# Forty deltas over two seconds, then the refund: a stream long enough to leave and rejoin.
app.agent("talker", model=NoteRefund(words=40, delay=2.0), tools=["lookup", "refund"])
app.agent(
    "planner",
    model=ScriptedModel(
        [{"tool_calls": [{"name": "schedule", "args": {"what": "a call"}}]}, {"text": "planned"}]
    ),
    tools=["schedule"],
)
app.agent("chat", model=ScriptedModel([{"text": "just words, no tools"}]))
app.agent("sleeper", model=SleepyModel(), timers=True, max_steps=4)
