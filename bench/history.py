"""What one new turn reads and journals on a long thread, with and without a bounded read.

    .venv/bin/python -m bench.history

A thread of 50 turns, each of which stored a 50 KB tool output, then one more turn on
three agents: no window; a window of 4 messages (the store reads only the newest 4
rows); a window of 4 messages that also budgets tokens (no row count follows from a
token budget, so the whole thread is read and bounded in process). Bytes read: the
message rows the turn's `load:thread` fetched (content and tool calls). Bytes
journaled: intents and results of every journal row the new turn wrote.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from agent_jobs import AgentApp, InlineRunner, ScriptedModel, SlidingWindowHistory, Store
from agent_jobs.messages import Message, ToolCall
from agent_jobs.runs import RunRequest, create_run
from agent_jobs.settings import Settings
from agent_jobs.store import threads

TURNS = 50
OUTPUT = 50 * 1024

app = AgentApp(name="history-bench")
reply = ScriptedModel([{"text": "the answer"}])
app.agent("unbounded", model=reply)
app.agent("windowed", model=reply, history=SlidingWindowHistory(max_messages=4))
app.agent("budgeted", model=reply, history=SlidingWindowHistory(max_messages=4, max_tokens=200_000))


def long_thread(store: Store, thread_id: str) -> None:
    """50 turns, each: question, a tool call, its 50 KB output, an answer."""
    with store.begin() as conn:
        request = RunRequest(agent="unbounded", input="seed", thread_id=thread_id)
        create_run(conn, request, run_id=f"{thread_id}-seed", runner="inline", status="completed")
        for turn in range(TURNS):
            call = ToolCall(id=f"c{turn}", name="fetch", args={"page": turn})
            for message in (
                Message(role="user", content=f"question {turn}"),
                Message(role="assistant", content="fetching", tool_calls=[call]),
                Message(role="tool", content="x" * OUTPUT, tool_call_id=call.id, name="fetch"),
                Message(role="assistant", content=f"answer {turn}"),
            ):
                threads.append_message(conn, thread_id, f"{thread_id}-seed", message)


def measure(store: Store, runner: InlineRunner, agent: str) -> dict[str, Any]:
    thread_id = f"t-{agent}"
    long_thread(store, thread_id)
    run = runner.run(agent, "one more question", thread_id=thread_id, actor="bench", timeout=60)
    assert run.status == "completed", run.error
    rows = store.journal(run.run_id)
    load = next(r for r in rows if r["step"] == "load:thread")
    read = sum(
        len(m["content"]) + len(json.dumps(m["tool_calls"])) for m in load["result"]["messages"]
    )
    journaled = sum(len(json.dumps(r["intent"])) + len(json.dumps(r["result"])) for r in rows)
    sent = next(r for r in rows if r["step"] == "model:1")["intent"]["request"]["messages"]
    return {
        "agent": agent,
        "rows_read": len(load["result"]["messages"]),
        "bytes_read": read,
        "bytes_journaled": journaled,
        "messages_sent": len(sent),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.from_url(f"sqlite:///{Path(tmp) / 'history.db'}")
        runner = InlineRunner(app, store, settings=Settings(diagnostics=False))
        results = [measure(store, runner, agent) for agent in ("unbounded", "budgeted", "windowed")]
        store.engine.dispose()
    print(f"a thread of {TURNS} turns, each with a {OUTPUT // 1024} KB tool output; one more turn:")
    for r in results:
        print(
            f"  {r['agent']:<9}  read {r['rows_read']:>3} rows, {r['bytes_read'] / 1e6:6.2f} MB;"
            f"  journaled {r['bytes_journaled'] / 1e6:6.2f} MB;"
            f"  {r['messages_sent']} messages sent to the model"
        )


if __name__ == "__main__":
    main()
