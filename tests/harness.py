"""One interface over both runners, so a scenario runs the same way in each."""

from __future__ import annotations

import time
from typing import Any, Literal

from agent_jobs import InlineRunner, RunView, Store
from agent_jobs.client import Client
from agent_jobs.redis_streams import RedisStreams
from agent_jobs.stream import Frame


class Harness:
    kind: str
    store: Store

    def start(self, agent: str, text: str, **kwargs: Any) -> str:
        raise NotImplementedError

    def decide(
        self, run_id: str, call_id: str, decision: Literal["approve", "reject"], actor: str
    ) -> bool:
        raise NotImplementedError

    def frames(self, run_id: str) -> list[Frame]:
        raise NotImplementedError

    def wait(self, run_id: str, timeout: float = 30) -> RunView:
        deadline = time.monotonic() + timeout
        while True:
            run = self.store.get_run(run_id)
            if run.finished:
                return run
            assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
            time.sleep(0.02)

    def wait_status(self, run_id: str, status: str, timeout: float = 30) -> RunView:
        deadline = time.monotonic() + timeout
        while True:
            run = self.store.get_run(run_id)
            if run.status == status:
                return run
            assert not run.finished, f"run {run_id} ended {run.status}: {run.error}"
            assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
            time.sleep(0.02)

    def run_approving(
        self, agent: str, text: str, decision: Literal["approve", "reject"] = "approve", **kw: Any
    ) -> RunView:
        """Start a run and answer every approval request with `decision` as alice."""
        run_id = self.start(agent, text, **kw)
        deadline = time.monotonic() + 30
        while True:
            run = self.store.get_run(run_id)
            if run.finished:
                return run
            for call in self.store.pending_calls(run_id):
                self.decide(run_id, call["call_id"], decision, "alice")
            assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
            time.sleep(0.02)


class InlineHarness(Harness):
    kind = "inline"

    def __init__(self, runner: InlineRunner) -> None:
        self.runner = runner
        self.store = runner.store

    def start(self, agent: str, text: str, **kwargs: Any) -> str:
        kwargs.setdefault("actor", "user-7")
        return self.runner.start(agent, text, **kwargs)

    def decide(
        self, run_id: str, call_id: str, decision: Literal["approve", "reject"], actor: str
    ) -> bool:
        return self.runner.signal(run_id, call_id, decision, actor=actor)

    def frames(self, run_id: str) -> list[Frame]:
        return list(self.runner.frames(run_id))


class DurableHarness(Harness):
    kind = "durable"

    def __init__(self, client: Client, streams: RedisStreams) -> None:
        self.client = client
        self.store = client.store
        self.streams = streams

    def start(self, agent: str, text: str, **kwargs: Any) -> str:
        kwargs.setdefault("actor", "user-7")
        return self.client.enqueue_run(agent, text, **kwargs)

    def decide(
        self, run_id: str, call_id: str, decision: Literal["approve", "reject"], actor: str
    ) -> bool:
        return self.client.decide(run_id, call_id, decision, actor=actor)

    def frames(self, run_id: str) -> list[Frame]:
        return [frame for _, frame in self.streams.read(run_id, block=5)]
