"""Test helpers: a recording wrapper around ScriptedModel and a small app builder."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.store import Store, runs, threads


class RecordingModel:
    """A ScriptedModel that remembers every request it received."""

    def __init__(self, turns: Sequence[Mapping[str, Any]]) -> None:
        self.scripted = ScriptedModel(turns)
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "recording"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        with self._lock:
            self.requests.append(request)
        return self.scripted.run_turn(request, sink)


def support_app(model: Any, *, quota: int | None = None, max_steps: int = 8) -> AgentApp:
    """An app with two reads, an action needing a lead's approval, and one agent."""
    app = AgentApp(
        roles={"user-7": ["support"], "alice": ["lead"], "bob": ["support"], "eve": []},
        quota=quota,
    )
    app.calls = []  # type: ignore[attr-defined]

    @app.tool(kind="read")
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look up an order."""
        app.calls.append(("lookup_order", order_id))  # type: ignore[attr-defined]
        return {"order_id": order_id, "status": "shipped"}

    @app.tool(kind="read")
    def slow_read(n: int) -> int:
        app.calls.append(("slow_read", n))  # type: ignore[attr-defined]
        time.sleep(0.3)
        return n * 10

    @app.tool(kind="action", roles=["support"], approvers=["lead"])
    def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        app.calls.append(("refund", order_id, amount))  # type: ignore[attr-defined]
        return {"refunded": amount}

    app.agent(
        "support",
        model=model,
        system="You are support.",
        tools=["lookup_order", "slow_read", "refund"],
        max_steps=max_steps,
    )
    return app


def whole_request(journal: Mapping[str, Mapping[str, Any]], step: str) -> dict[str, Any]:
    """The request a model step was asked with, whole: the durable runner journals it
    against the run's model step before it (agent_jobs/store/model_requests.py)."""
    from agent_jobs.store.model_requests import expand

    def earlier(name: str) -> Any:
        return journal[name]["intent"] if name in journal else None

    return expand(journal[step]["intent"], earlier)["request"]


def add_run(
    store: Store,
    run_id: str = "r1",
    *,
    runner: str = "inline",
    metadata: dict[str, Any] | None = None,
) -> None:
    """A running run of agent "a" for actor "u" on thread "t1", written straight to the
    store."""
    with store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        runs.insert_run(
            conn,
            run_id=run_id,
            thread_id="t1",
            agent="a",
            actor="u",
            persona=None,
            input="x",
            status="running",
            runner=runner,
            day="2026-01-01",
            metadata={"k": [1, 2]} if metadata is None else metadata,
        )
