"""The durable runner under stress: killed workers, lost messages, duplicates, replays."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from agent_jobs import session
from agent_jobs.dispatch import INVOKE_TOOL, MODEL_TURN
from agent_jobs.leases import Leases
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.session import fold_inbox
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.store import journal as journal_rows
from agent_jobs.streams.redis_streams import RedisStreams
from tests.support import apps
from tests.support.apps import executed
from tests.support.builders import whole_request
from tests.support.cluster import Cluster
from tests.support.services import truncate_all, waiting_on_a_lock
from tests.support.waiting import TIMEOUT, eventually, wait_status
from tests.support.workers import Process


def test_sigkill_during_a_model_step_and_a_tool_step(cluster: Cluster) -> None:
    first = cluster.worker(concurrency=1)
    run_id = cluster.client.enqueue_run("crashy", "go", actor="user-7")

    key = f"{run_id}:tool:call_1"
    # Killed as the model streams (it counts its call as it begins)…
    _wait_executed(cluster, run_id, ("model", "model:1"), 1)
    first.kill()
    second = cluster.worker(concurrency=1)
    cluster.beat()
    # …and as the tool runs (it counts its start first).
    _wait_executed(cluster, run_id, ("slow:start", key), 1)
    second.kill()
    cluster.worker(concurrency=1)

    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "survived"
    ran = executed(run_id)
    # The killed model step ran again; the completed one never did.
    assert ran.count(("model", "model:1")) == 2
    assert ran.count(("model", "model:2")) == 1
    # The killed tool step ran again, with the same idempotency key; it finished once.
    assert ran.count(("slow:start", key)) == 2
    assert ran.count(("slow", key)) == 1
    journal = {j["step"]: j for j in cluster.store.journal(run_id)}
    assert journal["model:1"]["attempts"] == 2 and journal["tool:call_1"]["attempts"] == 2
    assert journal["model:2"]["attempts"] == 1
    messages = cluster.store.thread_messages(run.thread_id)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]


def _wait_executed(cluster: Cluster, run_id: str, what: tuple[str, str], n: int) -> None:
    """Until `what` (an execution the test apps count as it begins) was seen `n` times."""
    eventually(
        lambda: executed(run_id).count(what) >= n,
        what=f"{what} to have begun {n} time(s) in {run_id}",
        context=cluster.logs,
    )


def _wait_tasks_ended(worker: Process, task_ids: Sequence[str]) -> None:
    """Until the worker has run each task to its end (Celery logs its outcome)."""

    def ended() -> bool:
        log = worker.log()
        return all(re.search(rf"\[{tid}\] (succeeded|raised|retry)", log) for tid in task_ids)

    eventually(ended, what=f"tasks {list(task_ids)} to end", context=lambda: worker.log()[-3000:])


def _coordinations_ended(worker: Process) -> int:
    return len(re.findall(r"Task agent_jobs\.coordinate\[[0-9a-f-]+\] succeeded", worker.log()))


def test_duplicate_deliveries_are_no_ops(cluster: Cluster) -> None:
    worker = cluster.worker()
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    assert cluster.wait(run_id).status == "completed"
    before = executed(run_id)

    # The same (run_id, step) delivered again, and the run re-driven twice more.
    queue = cluster.client.waker.broker().queue
    coordinated = _coordinations_ended(worker)
    replayed = cluster.celery.send_task(MODEL_TURN, args=[run_id, "model:1"], queue=queue)
    cluster.client.wake(run_id)
    cluster.client.wake(run_id)
    duplicate = cluster.celery.send_task(
        "agent_jobs.start_run",
        kwargs={
            "agent": "w1",
            "input": "go",
            "actor": "user-7",
            "run_id": run_id,
        },
        queue=queue,
    )
    assert duplicate.id
    # The worker had its chance: every duplicate was taken and ran to its end.
    _wait_tasks_ended(worker, [replayed.id, duplicate.id])
    eventually(
        lambda: _coordinations_ended(worker) >= coordinated + 2,
        what="the two wake-ups to be coordinated",
        context=lambda: worker.log()[-3000:],
    )
    assert executed(run_id) == before
    assert len(cluster.store.list_runs()) == 1


def test_flushall_loses_messages_not_runs(cluster: Cluster) -> None:
    worker = cluster.worker()
    parked = cluster.client.enqueue_run("gated", "go", actor="user-7")
    wait_status(cluster.store, parked, "awaiting_approval")
    worker.stop()

    # With no worker up: a decision is recorded and a new run is enqueued; then Redis
    # loses every message.
    assert cluster.client.approve(parked, "call_2", actor="alice")
    queued = cluster.client.enqueue_run("support", "Where is order 42?", actor="user-7")
    redis.Redis.from_url(cluster.broker).flushall()

    cluster.worker()
    cluster.beat()
    assert cluster.wait(parked).status == "completed"
    wait_status(cluster.store, queued, "awaiting_approval")
    assert cluster.client.approve(queued, "call_3", actor="alice")
    assert cluster.wait(queued).output == "Order 42 was refunded."


def test_flushall_while_a_step_runs(cluster: Cluster) -> None:
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("twoslow", "go", actor="user-7")
    cluster.wait_step(run_id, "tool:call_2", "started")
    redis.Redis.from_url(cluster.broker).flushall()
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "twoslow done"
    assert executed(run_id).count(("slow", f"{run_id}:tool:call_2")) == 1


def test_an_old_shape_run_finishes_on_its_shape_after_a_deploy(cluster: Cluster) -> None:
    old = cluster.worker(AGENT_JOBS_DISABLED_PATCHES="agent:parallel-tools")
    run_id = cluster.client.enqueue_run("gated", "go", actor="user-7")
    cluster.wait_step(run_id, "approval:call_2", "waiting")
    old.stop()
    steps = [j["step"] for j in cluster.store.journal(run_id)]
    assert "patch:agent:parallel-tools" not in steps
    # The sequential shape: call 1 recorded and run before call 2 is even recorded.
    assert steps.index("persist:toolexec:call_1") < steps.index("persist:toolcall:call_2")

    cluster.worker()  # the new code takes the parallel-tools shape for new runs
    assert cluster.client.approve(run_id, "call_2", actor="alice")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "gated done"

    fresh = cluster.client.enqueue_run("gated", "go", actor="user-7")
    cluster.wait_step(fresh, "approval:call_2", "waiting")
    steps = [j["step"] for j in cluster.store.journal(fresh)]
    assert "patch:agent:parallel-tools" in steps
    assert steps.index("persist:toolcall:call_2") < steps.index("tool:call_1")


def test_a_non_deterministic_replay_fails_the_run_clearly(cluster: Cluster) -> None:
    new = cluster.worker()
    run_id = cluster.client.enqueue_run("gated", "go", actor="user-7")
    cluster.wait_step(run_id, "approval:call_2", "waiting")
    new.stop()  # a warm shutdown: the task that parked the run finishes first
    # Code that takes the other shape resumes a run recorded under this one.
    cluster.worker(AGENT_JOBS_DISABLED_PATCHES="agent:parallel-tools")
    assert cluster.client.approve(run_id, "call_2", actor="alice")
    run = cluster.wait(run_id)
    assert run.status == "failed" and run.error_type == "NonDeterminismError"
    assert "patch:agent:parallel-tools" in (run.error or "")
    assert "refund" not in [what for what, _ in executed(run_id)]  # never ran on


# --- the coordinator in-process, against real Postgres ---------------------------------------


class Recorder:
    """A dispatcher that only remembers what it was asked to enqueue."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        with self.lock:
            self.sent.append(("coordinate", run_id))

    def steps(self, run_id: str, steps: Sequence[tuple[str, str]]) -> None:
        with self.lock:
            self.sent.extend((task, step) for task, step in steps)


@pytest.fixture
def local(pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    store = Store.from_url(pg_url)
    truncate_all(store)
    streams = RedisStreams.from_url(redis_url)
    recorder = Recorder()
    runner = DurableRunner(
        apps.app, store, recorder, streams, Settings(database_url=pg_url), Leases(streams.client)
    )
    yield runner, recorder
    streams.client.close()
    store.engine.dispose()


def _new_run(runner: DurableRunner, agent: str, run_id: str) -> str:
    runner.create(RunRequest(agent=agent, input="go", actor="user-7"), run_id)
    return run_id


def test_two_coordinators_at_once_make_one_decision(local: Any) -> None:
    runner, recorder = local
    run_id = _new_run(runner, "w1", "two-at-once")
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def drive() -> None:
        barrier.wait()
        outcomes.append(runner.coordinate(run_id))

    threads = [threading.Thread(target=drive) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert recorder.sent == [(MODEL_TURN, "model:1")]
    assert sorted(outcomes) == ["waiting model:1", "waiting model:1"]
    steps = [j["step"] for j in runner.store.journal(run_id)]
    assert steps == ["quota:check", "persist:user", "load:thread", "prepare:1", "model:1"]


def test_a_result_that_lands_mid_replay_is_not_lost(local: Any) -> None:
    """Force the interleaving: a step result commits while a coordinator replays."""
    runner, recorder = local
    run_id = _new_run(runner, "w1", "mid-replay")
    runner.coordinate(run_id)  # schedules model:1

    in_replay = threading.Event()
    release = threading.Event()

    def pause(rid: str) -> None:
        if threading.current_thread().name == "slow-coordinator":
            in_replay.set()
            assert release.wait(10)

    runner.before_replay = pause
    slow = threading.Thread(target=lambda: runner.coordinate(run_id), name="slow-coordinator")
    slow.start()
    assert in_replay.wait(10)  # the slow coordinator has loaded the journal: model:1 pending

    # The step's result lands now, and its task re-drives the run.
    from agent_jobs.messages import ModelResponse, ToolCall

    reply = ModelResponse(
        tool_calls=[
            ToolCall(id="call_1", name="lookup", args={"order_id": "1"}),
            ToolCall(id="call_2", name="lookup", args={"order_id": "2"}),
        ]
    )
    with runner.store.begin() as conn:
        journal_rows.complete(
            conn, run_id, "model:1", state="done", result=reply.model_dump(mode="json")
        )
    waker = threading.Thread(target=lambda: runner.coordinate(run_id), name="waker")
    waker.start()
    # The wake-up waits for the replay in progress: its transaction is seen blocked on a
    # lock the slow coordinator holds.
    eventually(
        lambda: waiting_on_a_lock(runner.store),
        what="the wake-up to wait on the run's lock",
    )
    assert waker.is_alive(), "the wake-up must wait for the replay in progress"
    release.set()
    slow.join(10)
    waker.join(10)

    # The waker saw the result the slow coordinator missed and moved the run on.
    assert recorder.sent[-2:] == [
        ("agent_jobs.invoke_tool", "tool:call_1"),
        ("agent_jobs.invoke_tool", "tool:call_2"),
    ]
    assert runner.store.get_run(run_id).status == "running"


# --- the session runtime across processes ----------------------------------------------------


def test_a_cancel_posted_while_no_worker_runs_takes_effect_when_one_returns(
    cluster: Cluster,
) -> None:
    worker = cluster.worker()
    run_id = cluster.client.enqueue_run("gated", "go", actor="user-7")
    cluster.wait_step(run_id, "approval:call_2", "waiting")
    worker.stop()
    assert cluster.client.cancel(run_id) == [run_id]
    # Its wake-up waits in the broker, with nobody to take it: the run is as it was.
    assert redis.Redis.from_url(cluster.broker).llen(cluster.client.waker.broker().queue) >= 1
    assert cluster.store.get_run(run_id).status == "awaiting_approval"  # nobody to stop it yet
    cluster.worker()
    run = cluster.wait(run_id)
    assert run.status == "cancelled" and run.error == "cancelled (user)"
    assert "refund" not in [what for what, _ in executed(run_id)]


def test_a_killed_worker_resumes_with_the_batch_it_had_claimed(cluster: Cluster) -> None:
    first = cluster.worker(concurrency=1)
    run_id = cluster.client.enqueue_run("claimkill", "go", actor="user-7")
    cluster.wait_step(run_id, "tool:call_1", "started")  # running, for a second
    cluster.client.post_message(run_id, "first steer")
    cluster.wait_step(run_id, "model:2", "started")  # claimed…
    _wait_executed(cluster, run_id, ("model", "model:2"), 1)  # …and streaming
    first.kill()
    cluster.client.post_message(run_id, "second steer")  # too late for step 2
    cluster.worker(concurrency=1)
    cluster.beat()
    run = cluster.wait(run_id)

    assert run.status == "completed" and run.output == "answered after the crash"
    journal = {j["step"]: j for j in cluster.store.journal(run_id)}
    assert journal["prepare:2"]["result"]["claimed"] == ["first steer"]
    assert journal["model:2"]["attempts"] == 2
    sent = [m["content"] for m in whole_request(journal, "model:2")["messages"]]
    assert "first steer" in sent and "second steer" not in sent
    claims = [
        e.data
        for e in cluster.client.events(run_id)
        if e.type == "agent/inbox/spliced" and e.data["outcome"] == "claimed"
    ]
    assert claims == [session.splice("next-step", 0, 1, [], "claimed")]  # claimed once
    assert fold_inbox(cluster.client.events(run_id)).next_step == ["second steer"]


def test_a_summary_is_made_once_though_the_worker_dies_right_after(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=1)
    first = cluster.client.enqueue_run("summarykill", "one", actor="user-7")
    assert cluster.wait(first).status == "completed"
    thread = cluster.store.get_run(first).thread_id
    second = cluster.client.enqueue_run("summarykill", "two", actor="user-7", thread_id=thread)
    cluster.wait_step(second, "history:summarize", "done")
    cluster.wait_step(second, "model:1", "started")
    _wait_executed(cluster, second, ("model", "model:1"), 1)  # streaming
    worker.kill()
    cluster.worker(concurrency=1)
    cluster.beat()
    run = cluster.wait(second)
    assert run.status == "completed" and run.output == "after the summary"
    assert [what for what, _ in executed(second)].count("summary") == 1
    journal = {j["step"]: j for j in cluster.store.journal(second)}
    assert journal["model:1"]["attempts"] == 2
    assert [u["kind"] for u in cluster.store.usage(second)] == ["summary", "model"]


def test_a_step_that_keeps_killing_its_worker_becomes_a_dead_letter(cluster: Cluster) -> None:
    # On a threads pool the step kills the whole worker, which is started again.
    cluster.worker(concurrency=1, restart=True)
    cluster.beat()
    run_id = cluster.client.enqueue_run("poison", "go", actor="user-7")
    run = cluster.wait(run_id, timeout=1.5 * TIMEOUT)  # three deaths and restarts
    assert run.status == "failed" and run.error_type == "StepFailedError"
    assert "gave up after 3 attempts" in (run.error or "")
    assert executed(run_id).count(("crash", f"{run_id}:tool:call_1")) == 3
    step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
    assert step["state"] == "failed"


def test_a_duplicate_that_waited_for_the_lease_does_not_run_the_step_again(local: Any) -> None:
    """Force the interleaving: a duplicate delivery gets as far as the lease, then waits
    while the first delivery runs the step, records it and lets the lease go."""
    runner, _ = local
    run_id = _new_run(runner, "w1", "dup-after-lease")
    runner.coordinate(run_id)  # schedules model:1
    at_lease = threading.Event()
    first_done = threading.Event()

    def pause(rid: str, step: str) -> None:
        if threading.current_thread().name == "duplicate":
            at_lease.set()
            assert first_done.wait(10)

    runner.before_lease = pause
    outcomes: list[str] = []
    duplicate = threading.Thread(
        target=lambda: outcomes.append(runner.execute_step(run_id, "model:1", task=MODEL_TURN)),
        name="duplicate",
    )
    duplicate.start()
    assert at_lease.wait(10)
    first = runner.execute_step(run_id, "model:1", task=MODEL_TURN)
    first_done.set()
    duplicate.join(10)

    assert first.startswith("model:1 done")
    assert outcomes == ["model:1 already done"]
    assert executed(run_id).count(("model", "model:1")) == 1
    row = {j["step"]: j for j in runner.store.journal(run_id)}["model:1"]
    assert row["state"] == "done" and row["attempts"] == 1


def test_forged_step_tasks_change_nothing(local: Any) -> None:
    """Step tasks naming a step that is no remote step in flight, or one of another kind,
    return at once: no attempt is counted, nothing is marked failed."""
    runner, recorder = local
    run_id = _new_run(runner, "gated", "forged")
    runner.coordinate(run_id)
    for _ in range(20):  # drive the run to its approval with the steps it sent
        for task, step in list(recorder.sent):
            runner.execute_step(run_id, step, task=task)
        if runner.store.get_run(run_id).status == "awaiting_approval":
            break
    assert runner.store.get_run(run_id).status == "awaiting_approval"

    forged = [
        (INVOKE_TOOL, "approval:call_2"),  # a human wait, not a remote step
        (MODEL_TURN, "tool:call_1"),  # a finished step, and of the other kind
        (INVOKE_TOOL, "model:1"),
        (INVOKE_TOOL, "tool:nope"),  # no such step
        (INVOKE_TOOL, "persist:user"),  # a local step
    ]
    for _ in range(5):
        for task, step in forged:
            assert not runner.execute_step(run_id, step, task=task).startswith(step + " failed")
    journal = {j["step"]: j for j in runner.store.journal(run_id)}
    assert journal["approval:call_2"]["state"] == "waiting"
    assert journal["approval:call_2"]["attempts"] == 0

    # A valid approval then moves the run on to its end.
    with runner.store.begin() as conn:
        from agent_jobs.approvals.record import record_decision
        from agent_jobs.checkpoints import Decision

        record_decision(
            conn, apps.app, run_id, "call_2", Decision(decision="approve", actor="alice")
        )
    for _ in range(20):
        runner.coordinate(run_id)
        for task, step in list(recorder.sent):
            runner.execute_step(run_id, step, task=task)
        if runner.store.get_run(run_id).finished:
            break
    assert runner.store.get_run(run_id).status == "completed"


def test_a_cancel_whose_wake_up_was_lost_reaches_a_parked_run(cluster: Cluster) -> None:
    """The cancel is recorded, but no wake-up reaches the run (the broker was down when
    the client sent it): the sweep stops the parked run."""
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("gated", "go", actor="user-7")
    cluster.wait_step(run_id, "approval:call_2", "waiting")
    with cluster.store.begin() as conn:
        assert session.request_cancel(conn, run_id, "user") == [run_id]
    run = cluster.wait(run_id)
    assert run.status == "cancelled" and run.error == "cancelled (user)"


def test_forged_step_tasks_on_a_real_worker_cannot_wedge_a_parked_run(cluster: Cluster) -> None:
    worker = cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("gated", "go", actor="user-7")
    cluster.wait_step(run_id, "approval:call_2", "waiting")
    queue = cluster.client.waker.broker().queue
    forged = []
    for _ in range(4):  # more than the attempts a step gets
        forged.append(
            cluster.celery.send_task(INVOKE_TOOL, args=[run_id, "approval:call_2"], queue=queue)
        )
        forged.append(
            cluster.celery.send_task(MODEL_TURN, args=[run_id, "tool:call_1"], queue=queue)
        )
    _wait_tasks_ended(worker, [f.id for f in forged])  # each was taken, and done with
    step = {j["step"]: j for j in cluster.store.journal(run_id)}["approval:call_2"]
    assert step["state"] == "waiting" and step["attempts"] == 0
    assert cluster.client.approve(run_id, "call_2", actor="alice")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "gated done"


def test_a_decision_with_a_nul_is_refused_and_changes_nothing(local: Any) -> None:
    from agent_jobs.approvals.record import record_decision
    from agent_jobs.checkpoints import Decision
    from agent_jobs.errors import DecisionRefusedError

    runner, recorder = local
    run_id = _new_run(runner, "gated", "nul-reason")
    runner.coordinate(run_id)
    for _ in range(20):
        for task, step in list(recorder.sent):
            runner.execute_step(run_id, step, task=task)
        if runner.store.get_run(run_id).status == "awaiting_approval":
            break
    verdict = Decision(decision="approve", actor="alice", reason="fine\x00")
    with pytest.raises(DecisionRefusedError), runner.store.begin() as conn:
        record_decision(conn, apps.app, run_id, "call_2", verdict)
    assert runner.store.pending_calls(run_id)[0]["call_id"] == "call_2"
