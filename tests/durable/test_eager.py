"""The fast path: the step a pass schedules runs where the last one ended, not through
the broker, and a process killed in such a step is recovered as fast as a delivered one."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from agent_jobs.dispatch import INVOKE_TOOL, MODEL_TURN
from agent_jobs.leases import Holder, Leases
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.streams.redis_streams import RedisStreams
from tests.durable.test_durable import Recorder
from tests.durable.test_recovery import SHIPPED, assert_recovered_by_the_death, held_starts
from tests.support import apps
from tests.support.cluster import Cluster
from tests.support.services import truncate_all


def _received(log: str, task: str) -> int:
    return len(re.findall(rf"Task agent_jobs\.{task}\[[0-9a-f-]+\] received", log))


def test_a_runs_steps_run_where_the_last_one_ended(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=2)
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "w1 answer"
    log = worker.log()
    # Three model steps and four reads: every model step ran in the task before it, and
    # of each fan-out of two reads one member was kept and the other sent.
    assert _received(log, "model_turn") == 0, log
    assert _received(log, "invoke_tool") == 2, log
    steps = [j["step"] for j in cluster.store.journal(run_id) if j["state"] == "done"]
    assert [s for s in steps if s.startswith(("model:", "tool:"))] == [
        "model:1",
        "tool:call_1",
        "tool:call_2",
        "model:2",
        "tool:call_3",
        "tool:call_4",
        "model:3",
    ]


def test_with_the_fast_path_off_every_step_crosses_the_broker(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=2, AGENT_JOBS_EAGER_STEPS="false")
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "w1 answer"
    log = worker.log()
    assert _received(log, "model_turn") == 3 and _received(log, "invoke_tool") == 4, log


def test_an_eager_chain_stops_at_its_step_budget_and_sends_the_rest(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=2, AGENT_JOBS_EAGER_MAX_STEPS="1")
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    assert cluster.wait(run_id).status == "completed"
    log = worker.log()
    # Each task runs one step of its own and at most one more, so some go by the broker.
    assert 0 < _received(log, "model_turn") + _received(log, "invoke_tool") < 7, log


def test_a_process_killed_in_an_eagerly_kept_fan_out_member_is_recovered_in_seconds(
    cluster: Cluster,
) -> None:
    # The redelivery may go to either worker. On a threads pool the process killed is a
    # whole worker: it is started again, and recovers at once the process that died.
    cluster.worker(concurrency=2, restart=True, **SHIPPED)
    cluster.worker(concurrency=2, restart=True, **SHIPPED)
    for _ in range(3):
        run_id = cluster.client.enqueue_run("held_pair", "go", actor="user-7")
        [(pid, _)] = held_starts(cluster, run_id, "tool:call_1", 1)  # the member runs
        os.kill(pid, signal.SIGKILL)
        starts = held_starts(cluster, run_id, "tool:call_1", 2)
        assert_recovered_by_the_death(cluster, run_id, "tool:call_1", starts)
        run = cluster.wait(run_id)
        assert run.status == "completed" and run.output == "both held"
        journal = {j["step"]: j for j in cluster.store.journal(run_id)}
        assert journal["tool:call_1"]["attempts"] == 2
        finished = [key for what, key in apps.executed(run_id) if what == "held"]
        # Each member finished once: the sibling in the other process was not run again.
        assert sorted(finished) == [f"{run_id}:tool:call_1", f"{run_id}:tool:call_2"]


# --- the chain in-process, against real Postgres and Redis -----------------------------------


@pytest.fixture
def local(pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def make(**settings: Any) -> tuple[DurableRunner, Recorder]:
        recorder = Recorder()
        runner = DurableRunner(
            apps.app,
            store,
            recorder,
            streams,
            Settings(database_url=pg_url, **settings),
            Leases(streams.client),
        )
        return runner, recorder

    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    store = Store.from_url(pg_url)
    truncate_all(store)
    streams = RedisStreams.from_url(redis_url)
    yield make
    streams.client.close()
    store.engine.dispose()


def _states(runner: DurableRunner, run_id: str) -> dict[str, str]:
    return {j["step"]: j["state"] for j in runner.store.journal(run_id) if ":" in j["step"]}


def _start(runner: DurableRunner, run_id: str) -> str:
    runner.create(RunRequest(agent="w1", input="go", actor="user-7"), run_id)
    return runner.continue_run(run_id)


def test_a_fan_out_keeps_its_first_member_and_sends_the_others(local: Any) -> None:
    runner, recorder = local()
    assert _start(runner, "eager-fan-out") == "waiting model:1"
    # model:1 ran here, then the first read of its fan-out; the second was sent.
    assert recorder.sent == [(INVOKE_TOOL, "tool:call_2")]
    states = _states(runner, "eager-fan-out")
    assert states["model:1"] == "done" and states["tool:call_1"] == "done"
    assert states["tool:call_2"] == "scheduled"
    # The sent member, delivered, carries the run on through the rest of the chain.
    runner.execute_step("eager-fan-out", "tool:call_2", task=INVOKE_TOOL)
    assert recorder.sent[-1] == (INVOKE_TOOL, "tool:call_4")
    runner.execute_step("eager-fan-out", "tool:call_4", task=INVOKE_TOOL)
    assert runner.store.get_run("eager-fan-out").status == "completed"


def test_with_no_step_budget_the_kept_step_is_sent(local: Any) -> None:
    runner, recorder = local(eager_max_steps=0)
    assert _start(runner, "eager-budget") == "waiting model:1"
    assert recorder.sent == [(MODEL_TURN, "model:1")]
    assert _states(runner, "eager-budget")["model:1"] == "scheduled"


def test_a_failure_on_the_fast_path_gives_the_step_back_to_the_broker(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, recorder = local()

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise redis.ConnectionError("Redis went away")

    run_step = runner._run_step
    monkeypatch.setattr(runner, "_run_step", unreachable)
    assert _start(runner, "eager-fallback") == "waiting model:1"
    assert recorder.sent == [(MODEL_TURN, "model:1")]  # nothing ran, nothing is lost
    [row] = [j for j in runner.store.journal("eager-fallback") if j["step"] == "model:1"]
    # The claim is given back: whoever is sent the step takes it as a first attempt.
    assert (row["state"], row["holder"], row["attempts"]) == ("scheduled", None, 0)
    monkeypatch.setattr(runner, "_run_step", run_step)
    assert runner.execute_step("eager-fallback", "model:1", task=MODEL_TURN, retries=0).startswith(
        "model:1 done"
    )


def _journal_row(runner: DurableRunner, run_id: str, step: str) -> dict[str, Any]:
    [row] = [j for j in runner.store.journal(run_id) if j["step"] == step]
    return row


def test_a_kept_step_is_claimed_in_its_row_with_no_lease_in_redis(local: Any) -> None:
    runner, _ = local(eager_max_steps=1)
    seen: dict[str, Any] = {}

    def looking(run_id: str, step: str) -> None:
        seen[step] = _journal_row(runner, run_id, step)
        seen[step + " lease"] = runner.leases.client.get(f"agent_jobs:lease:{run_id}:{step}")
        # A delivery of the step meanwhile (a stray, a re-send) leaves it alone.
        runner.before_lease = None
        seen["duplicate"] = runner.execute_step(run_id, step, task=MODEL_TURN)
        runner.before_lease = looking

    runner.before_lease = looking
    assert _start(runner, "eager-claim") == "waiting model:1"
    row = seen["model:1"]
    assert row["state"] == "started" and row["attempts"] == 1
    assert Holder.parse(row["holder"]) is not None
    assert Holder.parse(row["holder"]).pid == os.getpid()  # type: ignore[union-attr]
    assert seen["model:1 lease"] is None
    assert seen["duplicate"] == "model:1 already running"
    done = _journal_row(runner, "eager-claim", "model:1")
    assert (done["state"], done["attempts"]) == ("done", 1)
    assert runner.leases.client.get("agent_jobs:attempts:eager-claim:model:1") is None


def _claim_as(runner: DurableRunner, run_id: str, step: str, holder: Holder) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from agent_jobs.store.db import utcnow
    from agent_jobs.store.schema import journal

    with runner.store.begin() as conn:
        conn.execute(
            update(journal)
            .where(journal.c.run_id == run_id, journal.c.step == step)
            .values(
                state="started",
                attempts=1,
                holder=str(holder),
                lease_until=utcnow() + timedelta(seconds=30),
            )
        )


def test_a_claim_whose_process_died_is_re_sent_and_taken_over(local: Any) -> None:
    runner, recorder = local(eager_max_steps=0)
    _start(runner, "eager-dead-claim")
    me = Holder.me()
    # A live claimant's step is neither re-sent nor run by a delivery.
    _claim_as(runner, "eager-dead-claim", "model:1", me)
    recorder.sent.clear()
    runner.continue_run("eager-dead-claim")
    assert recorder.sent == []
    assert (
        runner.execute_step("eager-dead-claim", "model:1", task=MODEL_TURN)
        == "model:1 already running"
    )
    # The claimant died (a pid that cannot be running): the returning message re-sends
    # the step, and its delivery runs it as the second attempt.
    _claim_as(runner, "eager-dead-claim", "model:1", Holder(me.machine, 2**22 + 7, "gone", "t"))
    runner.continue_run("eager-dead-claim")
    assert recorder.sent == [(MODEL_TURN, "model:1")]
    outcome = runner.execute_step("eager-dead-claim", "model:1", task=MODEL_TURN)
    assert outcome.startswith("model:1 done"), outcome
    assert _journal_row(runner, "eager-dead-claim", "model:1")["attempts"] == 2


def test_a_redelivered_task_sends_the_steps_a_dead_process_held(local: Any) -> None:
    runner, recorder = local(eager_max_steps=0)
    _start(runner, "eager-orphan")
    assert recorder.sent == [(MODEL_TURN, "model:1")]
    # A process that took model:1's lease died (a pid that cannot be running).
    me = Holder.me()
    dead = Holder(me.machine, 2**22 + 7, "gone", me.token)
    assert runner.leases.take("eager-orphan", "model:1", dead, 30)
    recorder.sent.clear()
    assert runner.continue_run("eager-orphan") == "waiting model:1"
    assert recorder.sent == [(MODEL_TURN, "model:1")]
    # A live holder's step is left alone.
    runner.leases.release("eager-orphan", "model:1", dead)
    assert runner.leases.take("eager-orphan", "model:1", Holder.me(), 30)
    recorder.sent.clear()
    runner.continue_run("eager-orphan")
    assert recorder.sent == []


@pytest.mark.pools_named
def test_a_threads_worker_keeps_a_database_connection_for_each_task_it_runs_at_once(
    cluster: Cluster,
) -> None:
    # The pools as a user's worker sizes them: not the tests' one idle connection.
    big = cluster.worker(concurrency=150, pool="threads", AGENT_JOBS_DB_POOL_SIZE="")
    assert cluster.wait(cluster.client.enqueue_run("w1", "go", actor="user-7")).status == (
        "completed"
    )
    # And Redis connections: redis-py 8 allows 100 by default, fewer than its tasks; each
    # task also notes its run over the beats' client (8 connections failed 500 threads
    # with "Too many connections": their runs were not known as held).
    assert "166 Redis connections (and 166 for its beats" in big.log(), big.log()
    big.stop()
    threads = cluster.worker(concurrency=12, pool="threads", AGENT_JOBS_DB_POOL_SIZE="")
    ids = [cluster.client.enqueue_run("w1", "go", actor="user-7") for _ in range(12)]
    for run_id in ids:
        run = cluster.wait(run_id)
        assert run.status == "completed" and run.output == "w1 answer"
    assert "up to 14 database connections" in threads.log(), threads.log()
    prefork = cluster.worker(concurrency=1, pool="prefork", AGENT_JOBS_DB_POOL_SIZE="")
    assert cluster.wait(cluster.client.enqueue_run("w1", "go", actor="user-7")).status == (
        "completed"
    )
    assert "up to 5 database connections" in prefork.log(), prefork.log()


def test_no_free_database_connection_delays_a_pass_and_fails_no_run(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose every connection is busy for longer than the pool waits is a
    transient condition, like a dropped connection: the pass is retried, the run goes on."""
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    runner, _ = local()
    runner.create(RunRequest(agent="w1", input="go", actor="user-7"), "starved")
    coordinate = runner._coordinate

    def starved(*args: Any) -> Any:
        monkeypatch.setattr(runner, "_coordinate", coordinate)  # the next pass finds one
        raise PoolTimeout("QueuePool limit of size 1 overflow 0 reached")

    monkeypatch.setattr(runner, "_coordinate", starved)
    with pytest.raises(PoolTimeout):
        runner.continue_run("starved")
    assert runner.store.get_run("starved").status == "queued"
    assert runner.continue_run("starved") == "waiting model:1"


def _drive_by_hand(runners: list[DurableRunner], recorder: Any, run_id: str) -> None:
    """Deliver every sent step, each to the next runner in turn (as to another process)."""
    turn = 0
    while recorder.sent:
        task, step = recorder.sent.pop(0)
        runners[turn % len(runners)].execute_step(run_id, step, task=task)
        turn += 1


def test_a_pass_reads_only_the_rows_after_those_it_knows_and_sees_other_processes_rows(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_jobs.store import journal as journal_rows

    first, recorder = local(eager_steps=False)
    second, _ = local(eager_steps=False)
    second.dispatcher = first.dispatcher  # one broker: the recorder
    read: list[int] = []
    lock_and_load = journal_rows.lock_and_load

    def counted(*args: Any, **kwargs: Any) -> Any:
        locked = lock_and_load(*args, **kwargs)
        read.append(len(locked[1]))  # the journal's rows
        return locked

    monkeypatch.setattr(journal_rows, "lock_and_load", counted)
    first.create(RunRequest(agent="w1", input="go", actor="user-7"), "two-readers")
    first.continue_run("two-readers")
    _drive_by_hand([second, first], recorder, "two-readers")
    run = first.store.get_run("two-readers")
    assert run.status == "completed" and run.output == "w1 answer"
    # Each process knows the final rows it has seen; what the other wrote it reads once.
    assert read[0] == 0 and max(read[1:]) <= 9, read
    assert sum(read) < len(first.store.journal("two-readers")) * 2, read
    # And the replay each one made from what it knew and what it read was the same run:
    # a process that missed a row would have failed it (non-determinism) or re-run it.
    assert [j["attempts"] for j in first.store.journal("two-readers")] == [1] * len(
        first.store.journal("two-readers")
    )


@pytest.mark.pools_named
def test_a_tool_with_a_queue_of_its_own_runs_on_the_worker_of_that_queue(
    cluster: Cluster,
) -> None:
    """A CPU-bound tool goes to a prefork worker of its own, even from a fan-out whose
    other member runs where the model step ended; the step after it is sent back to the
    workers' queue, not run on the prefork worker."""
    main = cluster.worker(concurrency=8, pool="threads")
    cpu = cluster.worker(concurrency=1, pool="prefork", queues=apps.CPU_QUEUE)
    run_id = cluster.client.enqueue_run("cruncher", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "crunched"
    assert cpu.proc is not None and main.proc is not None
    crunched = [w for w, _ in apps.executed(run_id) if w.startswith("crunch:")]
    assert len(crunched) == 2
    for what in crunched:  # both calls ran in the prefork worker's pool
        assert os.getpgid(int(what.split(":")[1])) == cpu.proc.pid
    assert _received(cpu.log(), "invoke_tool") == 2, cpu.log()
    assert _received(cpu.log(), "model_turn") == 0
    assert "ran where the last one ended" not in cpu.log()
    assert _received(main.log(), "invoke_tool") == 0  # the lookup ran in model:1's chain


# --- the loop kept in the process between passes (runners/durable/sticky.py) ----------------


def _counting_loops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose loop a pass starts from the beginning (a replay), one entry each."""
    from agent_jobs.runners.durable import passes as durable

    started: list[str] = []
    run_agent_loop = durable.run_agent_loop

    def counted(turn: Any, deps: Any, hooks: Any) -> Any:
        started.append(turn.run_id)
        return run_agent_loop(turn, deps, hooks)

    monkeypatch.setattr(durable, "run_agent_loop", counted)
    return started


def _shape(runner: DurableRunner, run_id: str) -> list[tuple[str, int, str, int]]:
    return [(j["step"], j["seq"], j["state"], j["attempts"]) for j in runner.store.journal(run_id)]


def test_a_kept_loop_goes_on_where_it_stopped_and_journals_what_a_replay_does(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process drives a W1 run a step at a time: its loop starts once and every
    later pass resumes it (the sibling of a fan-out that finishes first runs no loop),
    where with the loop replayed every such pass starts it again; the journals are the
    same, and no loop is kept once the run has ended."""
    started = _counting_loops(monkeypatch)
    kept, kept_sent = local(eager_steps=False)
    replayed, replayed_sent = local(eager_steps=False, sticky_loops=False)
    for runner, recorder, run_id in (
        (kept, kept_sent, "kept-loop"),
        (replayed, replayed_sent, "replayed-loop"),
    ):
        runner.create(RunRequest(agent="w1", input="go", actor="user-7"), run_id)
        runner.coordinate(run_id)
        _drive_by_hand([runner], recorder, run_id)
        run = runner.store.get_run(run_id)
        assert run.status == "completed" and run.output == "w1 answer"
    assert started.count("kept-loop") == 1
    assert started.count("replayed-loop") == 6, started  # the start, 3 model steps, 2 reads
    assert _shape(kept, "kept-loop") == _shape(replayed, "replayed-loop")
    assert len(kept.loops) == 0


def test_a_parked_loop_is_let_go_of_when_the_run_moves_on_in_another_process(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes take turns at one run's steps: a loop parked in one finds the
    journal moved on by the other, is let go of, and the run is replayed there; the
    journal is the one a single process writes, each step run once."""
    started = _counting_loops(monkeypatch)
    first, recorder = local(eager_steps=False)
    second, _ = local(eager_steps=False)
    alone, alone_sent = local(eager_steps=False)
    second.dispatcher = first.dispatcher  # one broker: the recorder
    first.create(RunRequest(agent="w1", input="go", actor="user-7"), "two-processes")
    first.coordinate("two-processes")
    _drive_by_hand([second, first], recorder, "two-processes")
    assert first.store.get_run("two-processes").status == "completed"
    assert started.count("two-processes") > 1  # replayed where the other had moved on
    alone.create(RunRequest(agent="w1", input="go", actor="user-7"), "one-process")
    alone.coordinate("one-process")
    _drive_by_hand([alone], alone_sent, "one-process")
    assert _shape(first, "two-processes") == _shape(alone, "one-process")
    # The process that did not end the run still has the loop it parked, stale: it is
    # let go of once it has been idle for `sticky_idle` seconds.
    assert len(first.loops) + len(second.loops) <= 1
    assert [loop.run_id for loop in (*first.loops.purge(0), *second.loops.purge(0))] in (
        [],
        ["two-processes"],
    )


def test_a_loop_whose_pass_did_not_commit_is_let_go_of_and_the_run_replayed(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit of a pass that resumed the loop fails: what the loop knows was not
    written. Its thread is let go of; the step's redelivery replays the run from the
    journal and it completes."""
    from sqlalchemy.exc import OperationalError

    from agent_jobs.store import journal as journal_rows

    started = _counting_loops(monkeypatch)
    runner, recorder = local(eager_steps=False)
    insert_many = journal_rows.insert_many
    failures = [1]

    def failing_once(conn: Any, rows: Any, *args: Any) -> None:
        if any(r["step"] == "model:2" for r in rows) and failures:
            failures.pop()
            raise OperationalError("INSERT", {}, Exception("the database went away"))
        insert_many(conn, rows, *args)

    monkeypatch.setattr(journal_rows, "insert_many", failing_once)
    runner.create(RunRequest(agent="w1", input="go", actor="user-7"), "no-commit")
    runner.coordinate("no-commit")
    with pytest.raises(OperationalError):
        _drive_by_hand([runner], recorder, "no-commit")  # the pass scheduling model:2
    assert len(runner.loops) == 0
    # The step whose pass failed is delivered again (as its unacked message would be).
    runner.execute_step("no-commit", "tool:call_2", task=INVOKE_TOOL)
    _drive_by_hand([runner], recorder, "no-commit")
    run = runner.store.get_run("no-commit")
    assert run.status == "completed" and run.output == "w1 answer"
    assert started.count("no-commit") == 2  # the start, and the replay after the failure


def test_a_loop_parked_on_an_approval_resumes_when_the_decision_lands(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_jobs.approvals.record import record_decision
    from agent_jobs.checkpoints import Decision

    started = _counting_loops(monkeypatch)
    runner, recorder = local(eager_steps=False)
    runner.create(RunRequest(agent="gated", input="go", actor="user-7"), "gated-kept")
    runner.coordinate("gated-kept")
    _drive_by_hand([runner], recorder, "gated-kept")
    assert runner.store.get_run("gated-kept").status == "awaiting_approval"
    assert len(runner.loops) == 1  # parked on the approval
    with runner.store.begin() as conn:
        decision = Decision(decision="approve", actor="alice")
        record_decision(conn, apps.app, "gated-kept", "call_2", decision)
    runner.coordinate("gated-kept")  # the listener's wake-up
    _drive_by_hand([runner], recorder, "gated-kept")
    run = runner.store.get_run("gated-kept")
    assert run.status == "completed" and run.output == "gated done"
    assert started.count("gated-kept") == 1 and len(runner.loops) == 0
