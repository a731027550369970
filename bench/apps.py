"""The benchmark's agents: W1 (two turns of two reads, then an answer), W2 (eight slow
reads), W3 (W1's shape with an LLM's and a tool's latency)."""

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


@app.tool(kind="read")
def fetch(order_id: str) -> dict[str, str]:
    """A read that waits on another service for 0.2 s."""
    time.sleep(0.2)
    return {"order_id": order_id, "status": "shipped"}


def _fetches(*ids: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "fetch", "args": {"order_id": i}} for i in ids], "delay": 1.0}


# W3: each model call takes 1.0 s and each read 0.2 s; a run alone takes 3 x 1.0 + 2 x 0.2.
app.agent(
    "w3",
    model=ScriptedModel(
        [_fetches("1", "2"), _fetches("3", "4"), {"text": "w3 answer", "delay": 1.0}]
    ),
    tools=["fetch"],
)
