"""A process taken for dead that was only cut off comes back: it may finish the call it
was making, but it writes nothing of the step any more (its outcome, a renewed lease), and
a delivery that comes late to a step finished meanwhile calls nothing (docs/durable.md,
"A host cut off from the network").

The durable runner in this process, on real Postgres and Redis; the deliveries are
threads of it, held where a network cut holds them, and the lost host is taken for dead
the way another worker takes it (`recover_process`)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent_jobs import AgentApp, ScriptedModel, Store
from agent_jobs.dispatch import MODEL_TURN
from agent_jobs.leases import Holder, Leases
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.runners.durable.liveness import QUICK_SHARE
from agent_jobs.runners.durable.recovery import recover_process
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.settings import Settings
from agent_jobs.store import holds
from agent_jobs.store import journal as journal_rows
from agent_jobs.streams.redis_streams import RedisStreams
from tests.support.services import truncate_all
from tests.support.waiting import TIMEOUT, eventually


class Gated(ScriptedModel):
    """Answers `answer <n>` to its n-th call; a call whose number is in `gates` waits for
    that gate first (as a call in flight through a network cut does)."""

    def __init__(self) -> None:
        super().__init__([{"text": "unused"}], name="gated")
        self.calls = 0
        self.lock = threading.Lock()
        self.gates: dict[int, threading.Event] = {}
        self.reached: dict[int, threading.Event] = {}

    def gate(self, n: int) -> threading.Event:
        self.reached[n] = threading.Event()
        self.gates[n] = threading.Event()
        return self.gates[n]

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        with self.lock:
            self.calls += 1
            n = self.calls
        if n in self.gates:
            self.reached[n].set()
            assert self.gates[n].wait(TIMEOUT), "never let go"
        response = super().run_turn(request, sink)
        return response.model_copy(update={"text": f"answer {n}"})


class Sent:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        pass

    def steps(self, run_id: str, steps: Sequence[tuple[str, str]], **_: Any) -> None:
        self.sent.extend((run_id, step) for _, step in steps)


@pytest.fixture
def durable(pg_url: str, redis_url: str) -> Iterator[tuple[DurableRunner, Gated, Sent]]:
    """Every step crosses the broker (no chains); a beat's timeout short, so a delivery
    held for a moment counts as one that came late."""
    model = Gated()
    app = AgentApp()
    app.agent("gated", model=model)
    store = Store.from_url(pg_url)
    truncate_all(store)
    streams = RedisStreams.from_url(redis_url)
    sent = Sent()
    settings = Settings(
        database_url=pg_url, eager_steps=False, sticky_loops=False, process_timeout=0.4
    )
    runner = DurableRunner(app, store, sent, streams, settings, Leases(streams.client))
    try:
        yield runner, model, sent
    finally:
        streams.client.close()
        store.engine.dispose()


def scheduled_model_step(runner: DurableRunner, sent: Sent) -> str:
    run_id = f"fenced-{uuid.uuid4().hex[:8]}"
    runner.create(RunRequest(agent="gated", input="hi", actor="u"), run_id)
    runner.continue_run(run_id)
    assert (run_id, "model:1") in sent.sent
    return run_id


class Delivery:
    """A delivery of the step on a thread of its own: what it returned."""

    def __init__(self, runner: DurableRunner, run_id: str, step: str, name: str = "") -> None:
        self.outcome: str | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.outcome = str(runner.execute_step(run_id, step, task=MODEL_TURN))
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, name=name or None, daemon=True)
        self.thread.start()

    def ended(self) -> bool:
        return not self.thread.is_alive()


def taken_for_dead(runner: DurableRunner, run_id: str) -> None:
    """Another worker takes this process for dead and recovers its run (this process's
    holder names it; the test's deliveries all run in it, each with its own token)."""
    dispatcher: Any = Sent()
    later = recover_process(runner.store, runner.leases, dispatcher, Holder.me().process, {run_id})
    assert later == set()


def model_step(runner: DurableRunner, run_id: str) -> dict[str, Any]:
    return next(j for j in runner.store.journal(run_id) if j["step"] == "model:1")


def test_a_finished_step_delivered_late_calls_nothing(
    durable: tuple[DurableRunner, Gated, Sent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a model step ran again 10 s after it was finished: a delivery had read
    the row just before a cut, and the answer (the step still in flight) reached it after
    the heal, when another worker had run the step and written its outcome."""
    runner, model, sent = durable
    run_id = scheduled_model_step(runner, sent)
    read, cut = threading.Event(), threading.Event()
    get = journal_rows.get_with_whole_intent

    def read_then_cut(*args: Any, **kwargs: Any) -> Any:
        row = get(*args, **kwargs)
        if threading.current_thread().name == "late":
            read.set()
            assert cut.wait(TIMEOUT), "never healed"
        return row

    monkeypatch.setattr(journal_rows, "get_with_whole_intent", read_then_cut)
    began = time.monotonic()
    late = Delivery(runner, run_id, "model:1", name="late")
    try:
        eventually(read.is_set, what="the late delivery to read the step in flight")
        taken_for_dead(runner, run_id)
        runner.execute_step(run_id, "model:1", task=MODEL_TURN)  # another worker runs it
        assert model_step(runner, run_id)["state"] == "done" and model.calls == 1
        # Cut off for longer than a beat may take on a quick round trip.
        quick = runner.settings.process_timeout * QUICK_SHARE
        eventually(lambda: time.monotonic() - began > quick, what="the cut to outlast a beat")
    finally:
        cut.set()  # healed
    eventually(late.ended, what="the late delivery to end")
    assert late.error is None and late.outcome == "model:1 already done"
    assert model.calls == 1  # the provider was called once
    assert model_step(runner, run_id)["result"]["text"] == "answer 1"


def test_a_holder_let_go_of_writes_neither_its_outcome_nor_its_lease(
    durable: tuple[DurableRunner, Gated, Sent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost host's call ends first, after it was taken for dead and the step was
    sent again: its outcome is refused (before, the first writer won), its lease is not
    renewed, and the delivery that holds the step now writes the outcome."""
    runner, model, sent = durable
    run_id = scheduled_model_step(runner, sent)
    renewals: list[tuple[str, bool]] = []
    mark_started = holds.mark_started

    def noted(*args: Any, **kwargs: Any) -> bool:
        renewed = mark_started(*args, **kwargs)
        renewals.append((str(kwargs.get("fence")), renewed))
        return renewed

    monkeypatch.setattr(holds, "mark_started", noted)
    lost_call, new_call = model.gate(1), model.gate(2)
    lost = Delivery(runner, run_id, "model:1")
    eventually(model.reached[1].is_set, what="the lost host's call to be in flight")
    taken_for_dead(runner, run_id)
    eventually(lambda: ("0", False) in renewals, what="the lost host's lease renewal to be refused")
    renewed_before = len([r for r in renewals if r == ("0", True)])
    again = Delivery(runner, run_id, "model:1")
    eventually(model.reached[2].is_set, what="the step to run again, sent by recovery")
    lost_call.set()  # its call ends first
    eventually(lost.ended, what="the lost host's delivery to end")
    assert lost.error is None
    row = model_step(runner, run_id)
    assert row["state"] in ("scheduled", "started") and row["result"] is None  # refused
    new_call.set()
    eventually(again.ended, what="the new delivery to end")
    assert again.error is None and str(again.outcome).startswith("model:1 done")
    row = model_step(runner, run_id)
    assert (row["state"], row["result"]["text"]) == ("done", "answer 2")
    assert len([r for r in renewals if r == ("0", True)]) == renewed_before  # none after
