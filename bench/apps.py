"""The benchmark's agents: W1 (two turns of two reads, then an answer) and W2 (eight slow reads)."""

from __future__ import annotations

import time

from agent_jobs import AgentApp, ScriptedModel

app = AgentApp(name="bench")


@app.tool(kind="read")
def lookup(order_id: str) -> dict[str, str]:
    """An instant read."""
    return {"order_id": order_id, "status": "shipped"}


@app.tool(kind="read")
def slow(n: int) -> int:
    """A read that takes half a second."""
    time.sleep(0.5)
    return n


def _reads(*ids: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "lookup", "args": {"order_id": i}} for i in ids]}


app.agent(
    "w1",
    model=ScriptedModel([_reads("1", "2"), _reads("3", "4"), {"text": "w1 answer"}]),
    tools=["lookup"],
)
app.agent(
    "w2",
    model=ScriptedModel(
        [{"tool_calls": [{"name": "slow", "args": {"n": i}} for i in range(8)]}, {"text": "w2"}]
    ),
    tools=["slow"],
)
