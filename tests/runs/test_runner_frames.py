"""Both runners on the same scenario: a stream reader sees the same frames, field for field.

Run ids differ between the two runs, so each is replaced by the order it first appears
in; everything else of every frame must be equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agent_jobs import InlineRunner, Store
from agent_jobs.leases import Leases
from agent_jobs.observability import diagnostics
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.settings import Settings
from agent_jobs.streams.base import Frame
from agent_jobs.streams.redis_streams import RedisStreams
from tests.support import apps
from tests.support.harness import Harness
from tests.support.services import truncate_all


def _normalised(frames: list[Frame]) -> list[dict[str, Any]]:
    runs: dict[str, str] = {}
    out = []
    for frame in frames:
        copy = dict(frame)
        run_id = str(copy.pop("run_id"))
        copy["run"] = runs.setdefault(run_id, f"run{len(runs) + 1}")
        out.append(copy)
    return out


def _until_end(h: Harness, run_id: str, act: Any = None) -> list[Frame]:
    """Every frame of the run's stream, `act` called on each as it arrives (the stream's
    own read blocks for at most TIMEOUT)."""
    seen: list[Frame] = []
    for frame in h.frames_live(run_id):
        seen.append(frame)
        if act is not None:
            act(frame)
        if frame["type"] in ("done", "error"):
            return seen
    raise AssertionError(f"the stream of {run_id} ended without a last frame")


def _approving(h: Harness) -> Any:
    def act(frame: Frame) -> None:
        if frame["type"] == "approval_request":
            assert h.decide(frame["run_id"], frame["call_id"], "approve", "alice")

    return act


def _answering(h: Harness) -> Any:
    def act(frame: Frame) -> None:
        if frame["type"] == "question":
            assert h.client.answer(
                frame["run_id"], frame["request_id"], {"q1": "Friday"}, actor="bob"
            )

    return act


def _same(pair: tuple[Harness, Harness], agent: str, text: str, act: Any) -> None:
    inline, durable = pair
    seen = {}
    for h in (inline, durable):
        run_id = h.start(agent, text)
        seen[h.kind] = _normalised(_until_end(h, run_id, act(h)))
        assert h.wait(run_id).status == "completed"
    assert seen["durable"] == seen["inline"]


def test_reads_and_an_approval_stream_the_same_frames(
    both_harnesses: tuple[Harness, Harness],
) -> None:
    _same(both_harnesses, "support", "Where is order 42?", _approving)


def test_a_question_streams_the_same_frames(both_harnesses: tuple[Harness, Harness]) -> None:
    _same(both_harnesses, "planner", "set up a call", _answering)


def test_delegation_with_a_nested_approval_streams_the_same_frames(
    both_harnesses: tuple[Harness, Harness],
) -> None:
    _same(both_harnesses, "boss", "sort out order 42", _approving)


class _Unsent:
    """A dispatcher for a run that never gets as far as a remote step."""

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        raise AssertionError(f"nothing should be sent for {run_id}")

    def steps(self, run_id: str, steps: Sequence[tuple[str, str]]) -> None:
        raise AssertionError(f"nothing should be sent for {run_id}: {steps}")


def test_a_failed_run_publishes_the_same_lifecycle_diagnostics_in_both_runners(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    store = Store.from_url(pg_url)
    truncate_all(store)
    streams = RedisStreams.from_url(redis_url)
    settings = Settings(database_url=pg_url, daily_token_quota=0)  # every run is over budget
    seen: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = diagnostics.subscribe(lambda name, payload: seen.append((name, payload)))
    try:
        inline = InlineRunner(apps.app, store, settings=settings, poll_interval=0.05)
        inline_run = inline.start("support", "hello", actor="user-7")
        assert inline.wait(inline_run, 10).status == "failed"
        durable = DurableRunner(
            apps.app, store, _Unsent(), streams, settings, Leases(streams.client)
        )
        durable_run = "diagnostics-durable"
        durable.create(RunRequest(agent="support", input="hello", actor="user-7"), durable_run)
        assert durable.coordinate(durable_run).startswith("failed")
    finally:
        unsubscribe()
        diagnostics.set_enabled(True)
        streams.client.close()
        store.engine.dispose()

    def lifecycle(run_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (name, {k: v for k, v in payload.items() if k != "run_id"})
            for name, payload in seen
            if payload.get("run_id") == run_id and name.startswith("run.")
        ]

    assert lifecycle(inline_run) == lifecycle(durable_run)
    finished = lifecycle(durable_run)[-1]
    assert finished[0] == "run.finished" and finished[1]["status"] == "failed"
    assert "quota" in finished[1]["error"]
