"""W1 and W2 on the systems a user would pick instead of agent-jobs, measured on this
machine in the same run as our own figures: LangGraph with its Postgres checkpointer
(durability "sync": each step's checkpoint is committed before the next step starts),
DBOS (a workflow of steps, its system database in Postgres), Restate (a durable handler
whose every step is a journaled `ctx.run`, `bench/peers_restate.py`) and Temporal (a
workflow of activities on its CLI's dev server, `bench/peers_temporal.py`).

    .venv/bin/python -m bench.peers langgraph|dbos|restate|temporal --pg URL [--runs 200]
    .venv/bin/python -m bench.peers restate|temporal --w3 RUNS

Needs the `bench` extra (`pip install -e '.[bench]'`) and, for Restate, its server
(`npm ci --prefix bench/restate --ignore-scripts`). Each peer runs in a process of its
own (they keep global state), LangGraph and DBOS on a database of their own, Restate
and Temporal on a server of their own that this process starts on free ports of
127.0.0.1 in a temporary directory, and stops. It prints its figures as JSON:
W1 — `--runs` runs one after another (runs/s, p50/p95 a run, the CPU a run of every
process taking part; for LangGraph and DBOS write transactions and WAL a run, as
`bench.durable` counts them) and the same 4 at a time; W2 — one run whose first turn
asks for eight reads of 0.5 s, run together. With `--w3 RUNS` instead: W3, RUNS runs of
W1's shape whose model calls take 1.0 s and reads 0.2 s, all started at once: the
makespan against a run alone's 3.4 s, and the peak RSS of the peer's processes.
The workloads are ours (`bench/apps.py`): the same model script, the same tool results.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import psycopg

# W1: two turns of two reads each, then the answer; W2: eight slow reads, then the answer.
W1 = [
    [("lookup", {"order_id": "1"}), ("lookup", {"order_id": "2"})],
    [("lookup", {"order_id": "3"}), ("lookup", {"order_id": "4"})],
]
W2 = [[("slow", {"n": n}) for n in range(8)]]
# W3: W1's shape, each model call 1.0 s and each read 0.2 s; a run alone takes 3.4 s.
W3 = [
    [("fetch", {"order_id": "1"}), ("fetch", {"order_id": "2"})],
    [("fetch", {"order_id": "3"}), ("fetch", {"order_id": "4"})],
]
PLANS = {"w1": W1, "w2": W2, "w3": W3}
ANSWER = "answer"
SLOW_READ_S = 0.5
W3_MODEL_S = 1.0
W3_READ_S = 0.2
W3_IDEAL_S = 3 * W3_MODEL_S + 2 * W3_READ_S


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


async def model_async(plan: str, turn: int) -> dict[str, Any]:
    """The scripted model for an event loop: W3's calls take a second, as an LLM's would."""
    if plan == "w3":
        await asyncio.sleep(W3_MODEL_S)
    return script(PLANS[plan], turn)


async def read_async(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The tools for an event loop: `slow` waits half a second, `fetch` (W3's) 0.2 s."""
    await asyncio.sleep({"slow": SLOW_READ_S, "fetch": W3_READ_S}.get(name, 0.0))
    return {"tool": name, "args": args, "status": "shipped"}


def check(plan: str, result: dict[str, Any]) -> None:
    """A run's answer, and every message it should have: the prompt, each turn, each read."""
    turns = PLANS[plan]
    expected = 1 + len(turns) + sum(len(turn) for turn in turns) + 1
    assert result == {"text": ANSWER, "messages": expected}, result


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
    from bench.durable import cpu_seconds

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


# --- the peers with a server of their own: Restate, Temporal --------------------------


@dataclass
class Served:
    """A peer up on the server this process started: how to run a plan through it, the
    processes taking part by role (this process, a service's of its own, the server), how
    many entries the durable record of one W1 run holds, and, where the peer has a way of
    its own to start many runs and wait for them, W3 that way (its makespan)."""

    run: Callable[[str], Awaitable[dict[str, Any]]]
    processes: dict[str, int]
    record: Callable[[], Awaitable[int]]
    w3: Callable[[int], Awaitable[float]] | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before it runs the server: SIGTERM if the benchmark dies first."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{proc.args} exited with {proc.returncode}:\n{tail}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{proc.args}: nothing on 127.0.0.1:{port} in 120 s") from None
            time.sleep(0.1)


@contextmanager
def server(
    args: list[str],
    ports: list[int],
    cwd: Path,
    env: dict[str, str] | None = None,
    stop: signal.Signals = signal.SIGTERM,
) -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own, its output logged in `cwd`, up once each of
    `ports` on 127.0.0.1 answers; `stop` on the way out (SIGKILL if it lingers)."""
    log = cwd / f"{Path(args[0]).name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        for port in ports:
            _wait_for_port(port, proc, log)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, stop)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def cpu_by_role(processes: dict[str, int]) -> dict[str, float]:
    """CPU seconds each process has used so far (all its threads)."""
    from bench.durable import _ticks

    hz = os.sysconf("SC_CLK_TCK")
    return {role: _ticks(pid) / hz for role, pid in processes.items()}


async def _phase(served: Served, plan: str, runs: int, at_once: int) -> tuple[float, list[float]]:
    """`runs` runs of `plan`, `at_once` of them at a time: wall time, each run's latency."""
    gate = asyncio.Semaphore(at_once)

    async def one() -> float:
        async with gate:
            started = time.perf_counter()
            check(plan, await served.run(plan))
            return time.perf_counter() - started

    started = time.perf_counter()
    latencies = await asyncio.gather(*(one() for _ in range(runs)))
    return time.perf_counter() - started, list(latencies)


async def measure_served(served: Served, runs: int) -> dict[str, float]:
    """As `measure`: W1 one run after another, then 4 at a time; W2 once. The CPU a run
    counts every process taking part, the server's too."""
    await _phase(served, "w1", 10, 1)
    figures: dict[str, float] = {}
    for label, at_once in (("seq", 1), ("conc4", 4)):
        cpu0 = cpu_by_role(served.processes)
        wall, latencies = await _phase(served, "w1", runs, at_once)
        cpu1 = cpu_by_role(served.processes)
        figures[f"w1_{label}_runs_per_s"] = runs / wall
        figures[f"w1_{label}_p50_ms"] = statistics.median(latencies) * 1000
        figures[f"w1_{label}_p95_ms"] = statistics.quantiles(latencies, n=20)[-1] * 1000
        if label == "seq":
            for role in cpu0:
                figures[f"w1_cpu_ms_per_run_{role}"] = (cpu1[role] - cpu0[role]) / runs * 1000
            figures["w1_cpu_ms_per_run"] = sum(cpu1[k] - cpu0[k] for k in cpu0) / runs * 1000
    figures["w2_wall_s"] = (await _phase(served, "w2", 1, 1))[0]
    figures["w1_record_entries_per_run"] = await served.record()
    return figures


async def w3_served(served: Served, runs: int) -> dict[str, float]:
    """W3: `runs` runs started at once; the makespan, and each process's peak RSS and CPU."""
    from bench.durable import _rss_bytes

    await _phase(served, "w3", 2, 2)  # warm up
    peak = dict.fromkeys(served.processes, 0)

    async def all_at_once() -> float:
        return (await _phase(served, "w3", runs, runs))[0]  # every run checked

    cpu0 = cpu_by_role(served.processes)
    every = asyncio.ensure_future(served.w3(runs) if served.w3 else all_at_once())
    while not every.done():
        for role, pid in served.processes.items():
            peak[role] = max(peak[role], _rss_bytes([pid]))
        await asyncio.wait([every], timeout=0.2)
    makespan = every.result()
    cpu1 = cpu_by_role(served.processes)
    return {
        "runs": runs,
        "makespan_s": makespan,
        "vs_ideal": makespan / W3_IDEAL_S,
        **{f"rss_mib_{role}": rss / 2**20 for role, rss in peak.items()},
        **{f"cpu_s_{role}": cpu1[role] - cpu0[role] for role in cpu0},
    }


SERVED = {"restate": "bench.peers_restate", "temporal": "bench.peers_temporal"}


def served(name: str, runs: int, w3: int | None) -> dict[str, float]:
    """A server peer's figures: its module's `serve()` brings it up, and takes it down."""
    module = importlib.import_module(SERVED[name])

    async def go() -> dict[str, float]:
        async with module.serve() as peer:
            if w3:
                return await w3_served(peer, w3)
            return await measure_served(peer, runs)

    return asyncio.run(go())


PEERS: dict[str, Callable[[str, int], dict[str, float]]] = {"langgraph": langgraph, "dbos": dbos}


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the servers started are stopped on the way out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted([*PEERS, *SERVED]))
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--w3",
        type=int,
        metavar="RUNS",
        help="instead of W1 and W2, W3 with RUNS runs at once (restate, temporal)",
    )
    args = parser.parse_args()
    if args.peer in SERVED:
        signal.signal(signal.SIGTERM, _stop)
        figures = served(args.peer, args.runs, args.w3)
    elif args.w3:
        parser.error(f"--w3 is measured on {' and '.join(SERVED)} only")
    else:
        url = fresh(args.pg, f"agent_jobs_peer_{args.peer}")
        figures = PEERS[args.peer](url, args.runs)
    json.dump(figures, sys.stdout)
    print()


if __name__ == "__main__":
    main()
