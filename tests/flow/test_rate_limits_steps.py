"""A model step under a provider's rate limit, in this process: on the durable runner it
is deferred before it counts as an attempt (its row held back, the step sent with a
countdown, its place kept for when it comes back); the inline runner waits on the run's
own thread, and a 429's pause holds back every run of the process.

Real Postgres and Redis; the models are scripted (named as a provider's)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_jobs import AgentApp, InlineRunner, ScriptedModel, Store
from agent_jobs.dispatch import MODEL_TURN
from agent_jobs.errors import Deferred, ModelError
from agent_jobs.leases import Leases
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.ratelimits.buckets import LocalBuckets, Verdict
from agent_jobs.ratelimits.rules import Rule
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.settings import Settings
from agent_jobs.store.db import utcnow
from agent_jobs.streams.redis_streams import RedisStreams
from tests.support.services import dispose, finish_inline, truncate_all
from tests.support.waiting import TIMEOUT, eventually


class Timed(ScriptedModel):
    """A scripted model that notes when each call reached it; with `refuse`, the calls
    numbered so are answered 429 with that Retry-After."""

    def __init__(self, name: str, refuse: dict[int, float] | None = None) -> None:
        super().__init__([{"text": "answered"}], name=name)
        self.calls: list[float] = []
        self.refuse = refuse or {}
        self.lock = threading.Lock()
        self.granted: Granted | None = None

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        with self.lock:
            self.calls.append(time.monotonic())
            number = len(self.calls)
            if self.granted is not None:
                self.granted.called(self.calls[-1])
        if number in self.refuse:
            raise ModelError("HTTP 429", kind="rate_limit", retry_after=self.refuse[number])
        return super().run_turn(request, sink)


class Granted(LocalBuckets):
    """The process's buckets, noting by their own clock the place each call was given
    (the moment the limiter let it go, or promised it) and when a 429 paused the key: the
    limit is judged by these, not by when a busy machine's thread came round to a call."""

    def __init__(self) -> None:
        self.now = threading.local()  # the limiter's own reading, on each thread
        self.mine = threading.local()  # the place of the call this thread makes next
        super().__init__(clock=self._read)
        self.promised: dict[str, tuple[float, float]] = {}  # owner: (asked, place to come for)
        self.places: list[tuple[float, float]] = []  # (asked, place) of each call let go
        self.pauses: list[float] = []
        self.calls: list[tuple[float, float]] = []  # (place, called) of each call made

    def _read(self) -> float:
        self.now.value = time.monotonic()
        return float(self.now.value)

    def take(self, rule: Rule, tokens: int, owner: str) -> Verdict:
        verdict = super().take(rule, tokens, owner)
        now = self.now.value
        if verdict.wait > 0:
            self.promised[owner] = (now, now + verdict.wait)
        else:
            asked, self.mine.place = self.promised.pop(owner, (now, now))
            self.places.append((asked, self.mine.place))
        return verdict

    def pause(self, rule: Rule, seconds: float) -> None:
        super().pause(rule, seconds)
        self.pauses.append(self.now.value)

    def called(self, at: float) -> None:
        self.calls.append((self.mine.place, at))


class Sent:
    """A dispatcher that remembers the steps it was asked to send, with their countdown."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float | None]] = []

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        pass

    def steps(
        self, run_id: str, steps: Sequence[tuple[str, str]], *, countdown: float | None = None
    ) -> None:
        self.sent.extend((run_id, step, countdown) for _, step in steps)


# Seconds between two requests of the durable fixture's model: long enough that a pass
# slowed by a loaded machine still finds the next place ahead of it.
INTERVAL = 3.0


def _name() -> str:
    return f"openai:test-{uuid.uuid4().hex[:8]}"  # a bucket of the test's own


@pytest.fixture
def durable(pg_url: str, redis_url: str) -> Iterator[tuple[DurableRunner, Sent]]:
    """The durable runner in this process: one request every `INTERVAL` seconds for its
    model (a key of the test's own)."""
    name = _name()
    app = AgentApp()
    app.agent("limited", model=Timed(name))
    store = Store.from_url(pg_url)
    truncate_all(store)
    streams = RedisStreams.from_url(redis_url)
    sent = Sent()
    limits = {name: {"requests_per_minute": 60 / INTERVAL}}
    settings = Settings(database_url=pg_url, rate_limits=limits)
    runner = DurableRunner(app, store, sent, streams, settings, Leases(streams.client))
    try:
        yield runner, sent
    finally:
        streams.client.close()
        store.engine.dispose()


def _row(runner: DurableRunner, run_id: str, step: str = "model:1") -> dict[str, Any]:
    return next(j for j in runner.store.journal(run_id) if j["step"] == step)


def test_a_model_step_with_no_capacity_is_deferred_and_makes_no_attempt(
    durable: tuple[DurableRunner, Sent],
) -> None:
    runner, sent = durable
    first, second = (f"limited-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for run_id in (first, second):
        runner.create(RunRequest(agent="limited", input="hi", actor="user-7"), run_id)
    model = runner.app.get_agent("limited").model
    assert isinstance(model, Timed)
    runner.continue_run(first)  # its call went at once, in the chain the pass began
    assert runner.store.get_run(first).status == "completed" and sent.sent == []
    deferred_at = utcnow()
    runner.continue_run(second)  # its call waits for the next place, INTERVAL after
    waited = time.monotonic() - model.calls[0]  # at most this much of it has gone by
    [(run_id, step, countdown)] = sent.sent
    assert (run_id, step) == (second, "model:1") and countdown is not None
    assert INTERVAL - waited - 0.1 <= countdown <= INTERVAL + 0.01, (countdown, waited)
    row = _row(runner, second)
    # Held back until then; the pass's claim given back with the attempt it counted:
    # whoever is sent the step takes it as its first attempt.
    assert (row["state"], row["holder"], row["attempts"]) == ("scheduled", None, 0)
    held = (row["not_before"] - deferred_at).total_seconds()
    assert countdown - 0.1 <= held <= INTERVAL + 0.1, (held, countdown)
    assert runner.store.get_run(second).status == "running"

    # Delivered early (a stray, a re-send): deferred again, for the rest of its wait.
    with pytest.raises(Deferred) as early:
        runner.execute_step(second, "model:1", task=MODEL_TURN)
    assert 0 < early.value.delay <= countdown and early.value.key.startswith("openai:test-")
    assert "at its rate limit" in str(early.value)
    assert runner.leases.client.get(f"agent_jobs:attempts:{second}:model:1") is None
    assert _row(runner, second)["attempts"] == 0

    # On time: its place was kept, it goes.
    time.sleep(max(0.0, (row["not_before"] - utcnow()).total_seconds()))
    assert runner.execute_step(second, "model:1", task=MODEL_TURN).startswith("model:1 done")
    assert runner.store.get_run(second).status == "completed"
    assert _row(runner, second)["attempts"] == 1
    assert len(model.calls) == 2
    assert model.calls[1] - model.calls[0] >= INTERVAL - 0.05


def test_a_429_pauses_the_key_for_the_next_steps(durable: tuple[DurableRunner, Sent]) -> None:
    runner, sent = durable
    model = runner.app.get_agent("limited").model
    assert isinstance(model, Timed)
    model.refuse = {1: 10.0}  # the first call: 429, Retry-After 10
    first, second = (f"limited-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for run_id in (first, second):
        runner.create(RunRequest(agent="limited", input="hi", actor="user-7"), run_id)
    runner.continue_run(first)
    assert sent.sent[-1][:2] == (first, "model:1")  # the waterfall: again after 10 s
    runner.continue_run(second)
    run_id, step, countdown = sent.sent[-1]
    assert (run_id, step) == (second, "model:1") and 5.0 < countdown <= 10.0
    with pytest.raises(Deferred) as paused:
        runner.execute_step(second, "model:1", task=MODEL_TURN)
    assert "paused by the provider" in str(paused.value)
    assert len(model.calls) == 1  # nothing was sent during the pause


@pytest.fixture
def inline(tmp_path: Path) -> Iterator[tuple[InlineRunner, Timed]]:
    """The inline runner on SQLite with no Redis: the limits apply in this process. Two
    requests a second (a bucket of two) for the test's own model: the process's buckets
    are shared by every runner in it, so a key of the test's own (not `openai:*`, which
    another test of this process may have drained) starts full."""
    name = _name()
    model = Timed(name, refuse={5: 1.5})  # the fifth call: 429, Retry-After 1.5
    app = AgentApp()
    app.agent("limited", model=model)
    store = Store.from_url(f"sqlite:///{tmp_path / 'inline.db'}")
    limits = {name: {"requests_per_minute": 120}}
    settings = Settings(rate_limits=limits, model_retry_base_delay=0.01)
    runner = InlineRunner(app, store, settings=settings, poll_interval=0.05)
    assert runner.limits is not None
    runner.limits.buckets = model.granted = Granted()
    try:
        yield runner, model
    finally:
        finish_inline(runner)
        dispose(store)


def test_the_inline_runner_waits_on_its_own_thread_and_a_429_pauses_every_run(
    inline: tuple[InlineRunner, Timed], caplog: pytest.LogCaptureFixture
) -> None:
    runner, model = inline
    caplog.set_level(logging.INFO, logger="agent_jobs.ratelimits.gate")
    run_ids = [runner.start("limited", f"question {n}", actor="user-7") for n in range(8)]
    # Nobody waits for capacity but the runs: `start` returned before most calls went (a
    # start that waited for its run's place would return after eight: seven runs' calls
    # and the refused one).
    assert len(model.calls) < 8, model.calls
    ended = [runner.wait(run_id, timeout=TIMEOUT) for run_id in run_ids]
    assert [run.status for run in ended] == ["completed"] * 8
    calls = [t - model.calls[0] for t in model.calls]
    assert len(calls) == 9  # eight answers and the refused call
    # Two at once, then one every half second...
    # (at once: two runs went with no wait for capacity, by the limiter's own word)
    waited = {r.getMessage().split(":model:")[0] for r in caplog.records if "waits" in r.msg}
    assert len(set(run_ids) - waited) >= 2, waited
    # ...by the limiter's own clock: no call went before its place...
    granted = model.granted
    assert granted is not None and len(granted.calls) == 9
    assert all(called >= place for place, called in granted.calls), granted.calls
    # ...and the places: two at once, then one every half second; the fifth call was
    # refused, Retry-After 1.5: nothing for a second and a half (the places given out
    # before the pause still hold theirs: the next may come up to one place later), then
    # one every half second again (the bucket restarts empty).
    [pause] = granted.pauses
    places = sorted(granted.places, key=lambda asked_place: asked_place[1])
    before = [p for p in places if p[1] <= pause]
    after = [p for p in places if p[1] > pause]
    assert (len(before), len(after)) == (5, 4), places
    assert paced(before, burst=2)
    assert pause + 1.5 <= after[0][1] <= max(after[0][0], pause + 1.5 + 0.5) + SLACK, after
    assert paced(after, burst=1)


SLACK = 0.002  # the limiter's rounding: it counts in whole milliseconds


def paced(places: Sequence[tuple[float, float]], burst: int, every: float = 0.5) -> bool:
    """(asked, place) in order: never more than the limit over any span (`burst` at once,
    then one every `every` seconds), and no place lost (each call's place is when it
    asked for the place it got, or one interval after the one before it)."""
    never_more = all(
        places[j][1] - places[i][1] >= (j - i - burst + 1) * every - SLACK
        for i in range(len(places))
        for j in range(i + 1, len(places))
    )
    none_lost = all(
        place <= max(asked, places[k - 1][1] + every) + SLACK
        for k, (asked, place) in enumerate(places)
        if k > 0
    )
    return never_more and none_lost


def test_a_cancel_stops_an_inline_run_waiting_for_capacity(
    inline: tuple[InlineRunner, Timed], caplog: pytest.LogCaptureFixture
) -> None:
    runner, model = inline
    caplog.set_level(logging.INFO, logger="agent_jobs.ratelimits.gate")
    runner.limits.buckets.pause(runner.limits.rules.match(model.name), 30)  # type: ignore[union-attr, arg-type]
    run_id = runner.start("limited", "hello", actor="user-7")
    eventually(lambda: "for capacity" in caplog.text, what=f"{run_id} to wait for capacity")
    runner.cancel(run_id)
    assert runner.wait(run_id, timeout=TIMEOUT).status == "cancelled"
    assert model.calls == []
