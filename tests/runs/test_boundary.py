"""The step boundary's order (runners/boundary.py), on the store both runners use: a stop
before a pause, a pause before admission, admission before the run goes on."""

from __future__ import annotations

from datetime import timedelta

from agent_jobs import controls, session
from agent_jobs.executor import StepEnv
from agent_jobs.runners import boundary
from agent_jobs.runs import RunRequest, admit
from agent_jobs.store import RunView, Store
from agent_jobs.store import runs as run_rows
from agent_jobs.store.db import utcnow
from agent_jobs.streams.base import MemoryStreams, RunStream
from tests.support.apps.concurrency import app


def _verdict(store: Store, run_id: str, **kwargs: bool) -> boundary.Verdict:
    with store.begin() as conn:
        run = RunView.from_row(run_rows.lock_run(conn, run_id))
        env = StepEnv(app=app, stream=RunStream(MemoryStreams(), run.root_run_id, run_id))
        return boundary.decide(conn, env, app, run, (), **kwargs)


def _queued(store: Store) -> str:
    """A run of an agent with one place for each actor: written `queued`."""
    request = RunRequest(agent="single_slow", input="go", actor="user-7")
    return admit(store, app, request, runner="durable", status="running").run_id


def _running(store: Store) -> str:
    run_id = _queued(store)
    assert _verdict(store, run_id) == boundary.Go(admitted=True)
    with store.begin() as conn:
        run_rows.set_status(conn, run_id, "running")  # as the runner that admits it does
    return run_id


def test_a_queued_run_is_stopped_before_it_is_held_and_held_before_it_is_admitted(
    store: Store,
) -> None:
    _running(store)  # the key's one place is taken
    queued = _queued(store)
    assert _verdict(store, queued) == boundary.Queue(
        "queued: concurrency single_slow/user-7: 1 of 1 running"
    )

    with store.begin() as conn:
        controls.pause(conn, queued, "alice")
    assert _verdict(store, queued) == boundary.Hold("paused by alice")
    assert store.get_run(queued).status == "paused"

    with store.begin() as conn:
        session.request_cancel(conn, queued, "user")
    assert _verdict(store, queued) == boundary.Stop("user")


def test_the_inline_queue_leaves_a_queued_runs_pause_to_its_first_step(store: Store) -> None:
    queued = _queued(store)
    with store.begin() as conn:
        controls.pause(conn, queued, "alice")
    assert _verdict(store, queued, queued_pause=False) == boundary.Go(admitted=True)
    assert store.get_run(queued).status == "queued"  # the caller moves it on


def test_a_run_past_its_deadline_is_stopped_and_its_cancel_recorded(store: Store) -> None:
    running = _running(store)
    assert _verdict(store, running) == boundary.Go()
    with store.begin() as conn:
        run = RunView.from_row(run_rows.lock_run(conn, running))
        late = run.model_copy(update={"deadline": utcnow() - timedelta(seconds=1)})
        assert boundary.stops(late) and not boundary.quiet(late)
        assert boundary.stop(conn, late) == boundary.Stop("timeout", (running,))
    assert store.get_run(running).cancel_cause == "timeout"
