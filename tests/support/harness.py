"""One interface over both runners, so a scenario runs the same way in each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from agent_jobs import InlineRunner, RunView, Store
from agent_jobs.client import Client
from agent_jobs.commands import Commands
from agent_jobs.controls import Forked
from agent_jobs.runs import RunRequest
from agent_jobs.session import ModelSelection
from agent_jobs.streams.base import Frame
from agent_jobs.streams.redis_streams import RedisStreams

from .local_worker import LocalDispatcher
from .waiting import TIMEOUT, eventually, wait_finished, wait_status


class Harness:
    """A scenario's runner: its commands (agent_jobs.commands, with the runner's wake) and
    how its frames are read."""

    kind: str
    store: Store
    commands: Commands
    client: Client  # reads the session log (no broker needed)

    def start(self, agent: str, text: str, **kwargs: Any) -> str:
        kwargs.setdefault("actor", "user-7")
        return self.commands.admit(RunRequest.of(agent, text, **kwargs))[0]

    def post(self, run_or_thread: str, text: str, target: str = "next-step") -> str:
        return self.commands.post_message(run_or_thread, text, target=target)

    def cancel(self, run_id: str, cause: str = "user", keep_inbox: bool = False) -> list[str]:
        return self.commands.cancel(run_id, cause, keep_inbox=keep_inbox)

    def decide(
        self, run_id: str, call_id: str, decision: Literal["approve", "reject"], actor: str
    ) -> bool:
        return self.commands.decide(run_id, call_id, decision, actor=actor)

    def fork(self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False) -> Forked:
        return self.commands.fork(run_id, at, actor=actor, keep_decisions=keep_decisions)

    def select_model(self, run_or_thread: str, **selection: Any) -> str:
        return self.commands.select_model(run_or_thread, ModelSelection(**selection))

    def events(self, run_or_thread: str) -> list[Any]:
        return self.client.events(run_or_thread)

    def wait_frame(self, run_id: str, kind: str) -> Frame:
        """Block until the run's stream carries a frame of this type; return it (the
        stream's own read blocks for at most TIMEOUT)."""
        for frame in self.frames_live(run_id):
            if frame["type"] == kind:
                return frame
        raise AssertionError(f"the stream of {run_id} ended without a {kind} frame")

    def frames_live(self, run_id: str) -> Iterator[Frame]:
        raise NotImplementedError

    def types(self, run_id: str) -> list[str]:
        """The event types a run wrote, in order."""
        return [e.type for e in self.events(run_id) if e.run_id == run_id]

    def frames(self, run_id: str) -> list[Frame]:
        raise NotImplementedError

    def wait(self, run_id: str, timeout: float | None = None) -> RunView:
        return wait_finished(self.store, run_id, timeout)

    def wait_status(self, run_id: str, status: str, timeout: float | None = None) -> RunView:
        return wait_status(self.store, run_id, status, timeout=timeout, strict=True)

    def run_approving(
        self, agent: str, text: str, decision: Literal["approve", "reject"] = "approve", **kw: Any
    ) -> RunView:
        """Start a run and answer every approval request with `decision` as alice."""
        run_id = self.start(agent, text, **kw)

        def ended() -> RunView | None:
            run = self.store.get_run(run_id)
            if run.finished:
                return run
            for call in self.store.pending_calls(run_id):
                self.decide(run_id, call["call_id"], decision, "alice")
            return None

        return eventually(ended, what=f"run {run_id} to end, approving every call")


class InlineHarness(Harness):
    kind = "inline"

    def __init__(self, runner: InlineRunner) -> None:
        self.runner = runner
        self.store = runner.store
        self.commands = runner.commands
        self.client = Client(runner.store, runner.app, runner.settings)

    def frames(self, run_id: str) -> list[Frame]:
        return list(self.runner.frames(run_id))

    def frames_live(self, run_id: str) -> Iterator[Frame]:
        return self.runner.frames(run_id)


class DurableHarness(Harness):
    kind = "durable"
    # The durable-local harness's in-process dispatcher (tests/support/local_worker.py);
    # None on real workers.
    local: LocalDispatcher | None = None

    def __init__(self, client: Client, streams: RedisStreams) -> None:
        self.client = client
        self.commands = client.commands
        self.store = client.store
        self.streams = streams

    def frames(self, run_id: str) -> list[Frame]:
        return [frame for _, frame in self.streams.read(run_id, block=5)]

    def frames_live(self, run_id: str) -> Iterator[Frame]:
        return (frame for _, frame in self.streams.read(run_id, block=TIMEOUT))
