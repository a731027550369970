"""W1 and W2 on the two systems a user would pick instead of agent-jobs, measured on this
machine in the same run as our own figures: LangGraph with its Postgres checkpointer
(durability "sync": each step's checkpoint is committed before the next step starts)
and DBOS (a workflow of steps, its system database in Postgres).

    .venv/bin/python -m bench.peers langgraph|dbos --pg URL [--runs 200]

Needs the `bench` extra (`pip install -e '.[bench]'`). Each peer runs in a process of its
own (both keep global state) on a database of its own, and prints its figures as JSON:
W1 — `--runs` runs one after another in one process (runs/s, p50/p95 a run, write
transactions and WAL a run, as `bench.durable` counts them) and the same with 4
threads; W2 — one run whose first turn asks for eight reads of 0.5 s, run together.
The workloads are ours (`bench/apps.py`): the same model script, the same tool results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import psycopg

from bench.durable import cpu_seconds

# W1: two turns of two reads each, then the answer; W2: eight slow reads, then the answer.
W1 = [
    [("lookup", {"order_id": "1"}), ("lookup", {"order_id": "2"})],
    [("lookup", {"order_id": "3"}), ("lookup", {"order_id": "4"})],
]
W2 = [[("slow", {"n": n}) for n in range(8)]]
ANSWER = "answer"
SLOW_READ_S = 0.5


def script(plan: list[list[tuple[str, dict[str, Any]]]], turn: int) -> dict[str, Any]:
    """The scripted model: no latency; tool calls for the plan's turns, then the answer."""
    if turn >= len(plan):
        return {"text": ANSWER, "tool_calls": []}
    calls = [
        {"id": f"call_{turn}_{i}", "name": name, "args": args}
        for i, (name, args) in enumerate(plan[turn])
    ]
    return {"text": "", "tool_calls": calls}


def read(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The tools: `lookup` answers at once, `slow` after half a second."""
    if name == "slow":
        time.sleep(SLOW_READ_S)
    return {"tool": name, "args": args, "status": "shipped"}


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def fresh(url: str, name: str) -> str:
    """A database of the peer's own, empty; returns its URL."""
    base = libpq(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return base.rsplit("/", 1)[0] + "/" + name


def counters(url: str) -> tuple[int, int]:
    """(transaction id, WAL position): their advance counts write transactions and WAL."""
    with psycopg.connect(url, autocommit=True) as conn:
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        wal = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert xid is not None and wal is not None
    return int(xid[0]), int(wal[0])


def _timed(run: Callable[[str], None]) -> float:
    started = time.perf_counter()
    run("w1")
    return time.perf_counter() - started


def measure(run: Callable[[str], None], url: str, runs: int) -> dict[str, float]:
    """W1 one run after another, then on 4 threads; W2 once."""
    for _ in range(10):
        run("w1")
    figures: dict[str, float] = {}
    for label, threads in (("seq", 1), ("conc4", 4)):
        xid0, wal0 = counters(url)
        cpu0 = cpu_seconds(os.getpid(), None)
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            latencies = list(pool.map(lambda _: _timed(run), range(runs)))
        wall = time.perf_counter() - started
        cpu1 = cpu_seconds(os.getpid(), None)
        xid1, wal1 = counters(url)
        figures[f"w1_{label}_runs_per_s"] = runs / wall
        figures[f"w1_{label}_p50_ms"] = statistics.median(latencies) * 1000
        figures[f"w1_{label}_p95_ms"] = statistics.quantiles(latencies, n=20)[-1] * 1000
        if label == "seq":
            # This process (the peer runs in it) and every Postgres process.
            figures["w1_cpu_ms_per_run"] = sum(cpu1[k] - cpu0[k] for k in cpu0) / runs * 1000
            figures["w1_commits_per_run"] = (xid1 - xid0 - 1) / runs
            figures["w1_wal_bytes_per_run"] = (wal1 - wal0) / runs
    started = time.perf_counter()
    run("w2")
    figures["w2_wall_s"] = time.perf_counter() - started
    return figures


# --- LangGraph + PostgresSaver --------------------------------------------------------


def langgraph(url: str, runs: int) -> dict[str, float]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool
    from typing_extensions import TypedDict

    plans = {"w1": W1, "w2": W2}

    # Spelled as a call: its annotations are needed at run time, and they name locals.
    Conversation = TypedDict(  # noqa: UP013
        "Conversation", {"messages": Annotated[list[Any], add_messages], "plan": str}
    )

    @tool
    def lookup(order_id: str) -> dict[str, Any]:
        """Look up an order."""
        return read("lookup", {"order_id": order_id})

    @tool
    def slow(n: int) -> dict[str, Any]:
        """A read that takes half a second."""
        return read("slow", {"n": n})

    def model(state: Conversation) -> dict[str, Any]:
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        reply = script(plans[state["plan"]], turn)
        calls = [{**c, "type": "tool_call"} for c in reply["tool_calls"]]
        return {"messages": [AIMessage(content=reply["text"], tool_calls=calls)]}

    graph = StateGraph(Conversation)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup, slow]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ConnectionPool(url, min_size=2, max_size=8, open=True, kwargs=kwargs) as pool:
        saver = PostgresSaver(pool)  # type: ignore[arg-type]
        saver.setup()
        app = graph.compile(checkpointer=saver)

        def run(plan: str) -> None:
            config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}}
            if plan == "w2":
                config["max_concurrency"] = 8
            state = app.invoke(
                {"messages": [HumanMessage("go")], "plan": plan}, config, durability="sync"
            )
            messages = state["messages"]
            reads = sum(len(turn) for turn in plans[plan])
            assert messages[-1].content == ANSWER, messages[-1]
            assert sum(isinstance(m, ToolMessage) for m in messages) == reads, messages

        return measure(run, url, runs)


# --- DBOS ----------------------------------------------------------------------------


def dbos(url: str, runs: int) -> dict[str, float]:
    import asyncio
    import logging
    import threading

    from dbos import DBOS

    plans = {"w1": W1, "w2": W2}

    @DBOS.step()
    async def model_step(plan: str, turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
        return script(plans[plan], turn)

    @DBOS.step()
    async def tool_step(name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "slow":
            await asyncio.sleep(SLOW_READ_S)
            return read("lookup", args) | {"tool": name}
        return read(name, args)

    @DBOS.workflow()
    async def agent(plan: str) -> dict[str, Any]:
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for turn in range(10):
            reply = await model_step(plan, turn, history)
            history.append({"role": "assistant", **reply})
            if not reply["tool_calls"]:
                return {"text": reply["text"], "messages": len(history)}
            # The reads of a turn together, each a step of its own, as ours are.
            calls = reply["tool_calls"]
            results = await asyncio.gather(*(tool_step(c["name"], c["args"]) for c in calls))
            history += [
                {"role": "tool", "id": c["id"], "content": r}
                for c, r in zip(calls, results, strict=True)
            ]
        raise RuntimeError("the script never answered")

    DBOS(config={"name": "agent-jobs-peers", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:

        def run(plan: str) -> None:
            result = asyncio.run_coroutine_threadsafe(agent(plan), loop).result()
            reads = sum(len(turn) for turn in plans[plan])
            assert result == {"text": ANSWER, "messages": 1 + len(plans[plan]) + reads + 1}

        return measure(run, url, runs)
    finally:
        DBOS.destroy()
        loop.call_soon_threadsafe(loop.stop)


PEERS: dict[str, Callable[[str, int], dict[str, float]]] = {"langgraph": langgraph, "dbos": dbos}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    url = fresh(args.pg, f"agent_jobs_peer_{args.peer}")
    figures = PEERS[args.peer](url, args.runs)
    json.dump(figures, sys.stdout)
    print()


if __name__ == "__main__":
    main()
