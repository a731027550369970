"""`if_busy` through the doors a user meets: `POST /v1/runs` on `agent-jobs serve` (with a
real worker, and on the inline server), and `agent-jobs enqueue --if-busy`.

On a thread whose turn has not ended, `enqueue` (the default) runs after that turn,
`reject` is refused (409; exit 2) with nothing recorded, and `interrupt` cancels the turn
as a user would (only its actor or a service may) and runs next. Every refusal is checked
for having changed nothing: the runs, threads and events counted, and the busy run's row,
calls and journal as they were.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from agent_jobs.store import Store
from agent_jobs.store.schema import events, runs, threads
from tests.support import encryption as test_encryption
from tests.support.apps.http import ANSWER
from tests.support.doors import cli, wait_for
from tests.support.serve import Api, ApiServer, Stack, api_env, assert_error, open_stack
from tests.support.workers import ROOT

IF_BUSY_BROKER_DB = 10
CHAT = "just words, no tools"  # what the `chat` agent answers


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("if-busy")
    with open_stack(pg_url, redis_url, IF_BUSY_BROKER_DB, tmp, "serve-if-busy") as made:
        yield made


def counts(store: Store) -> tuple[int, int, int]:
    """Runs, threads and events: what a refused start must leave as it was. A runner
    writes a pass's journal rows, events and the run's status in one transaction, so
    once a run is seen parked (or cancelled) its writes are all in: no need to wait for
    the counts to settle."""
    with store.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (runs, threads, events)
        )


def snapshot(stack: Stack, run_id: str) -> dict[str, Any]:
    """`Doors.snapshot` in a stable order (Postgres promises no order of rows): every
    run and thread, and the busy run's calls and journal, each field of each row."""
    taken = stack.doors.snapshot(run_id)

    def by(key: str) -> Any:
        return lambda row: str(row[key])

    return {
        "runs": sorted(taken["runs"], key=by("id")),
        "threads": sorted(taken["threads"]),
        "calls": sorted(taken["calls"], key=by("call_id")),
        "journal": sorted(taken["journal"], key=by("step")),
    }


def parked(stack: Stack, actor: str = "user-7") -> tuple[str, str, str]:
    """A support run waiting for a lead's decision on its refund: (run id, its thread,
    the call id)."""
    run_id = stack.start(actor, text="refund it")
    stack.doors.wait_status(run_id, "awaiting_approval")
    [call] = stack.doors.store.pending_calls(run_id)
    return run_id, stack.doors.store.get_run(run_id).thread_id, str(call["call_id"])


def approve(stack: Stack, run_id: str, call_id: str) -> None:
    path = f"/v1/runs/{run_id}/approvals/{call_id}"
    decided = stack.call("alice", "POST", path, json={"decision": "approve"})
    assert decided.status_code == 200 and decided.json() == {"recorded": True}, decided.text


def cancel(stack: Stack, run_id: str) -> None:
    """End a parked run the test is done with."""
    cancelled = stack.call("user-7", "POST", f"/v1/runs/{run_id}/cancel", json={})
    assert cancelled.status_code == 202, cancelled.text
    stack.doors.wait_status(run_id, "cancelled")


def chat(thread_id: str, **more: Any) -> dict[str, Any]:
    """A request for a `chat` run (no tools: it completes at once) on `thread_id`."""
    return {"agent": "chat", "input": "and then?", "thread_id": thread_id, **more}


def turns(stack: Stack, thread_id: str) -> list[tuple[str | None, str]]:
    """(run id, type) of the thread's turn/start and turn/end events, in order."""
    return [
        (e.run_id, e.type)
        for e in stack.doors.client.events(thread_id)
        if e.type in ("turn/start", "turn/end")
    ]


# --- the HTTP API, durable ----------------------------------------------------------------------


def test_reject_on_a_busy_thread_is_409_naming_the_busy_run_and_records_nothing(
    stack: Stack,
) -> None:
    first, thread, call_id = parked(stack)
    before, busy = counts(stack.doors.store), snapshot(stack, first)

    for actor in ("user-7", "backend"):
        body = chat(thread, run_id=f"busy-reject-{actor}", if_busy="reject")
        reply = stack.call(actor, "POST", "/v1/runs", json=body)
        message = assert_error(reply, 409, "ConflictError")
        assert f"thread {thread!r} is busy: run {first!r} has not ended" in message
        assert "'enqueue'" in message and "'interrupt'" in message  # what to send instead
        assert stack.doors.store.find_run(f"busy-reject-{actor}") is None

    assert counts(stack.doors.store) == before
    assert snapshot(stack, first) == busy
    assert stack.doors.store.get_run(first).status == "awaiting_approval"

    # Once the turn has ended, the same request runs.
    approve(stack, first, call_id)
    stack.doors.wait_status(first, "completed")
    body = chat(thread, run_id="busy-reject-later", if_busy="reject")
    started = stack.call("user-7", "POST", "/v1/runs", json=body)
    assert started.status_code == 201, started.text
    stack.doors.wait_status("busy-reject-later", "completed")
    assert stack.doors.store.get_run("busy-reject-later").thread_id == thread


@pytest.mark.parametrize("actor", ["user-7", "backend"])
def test_interrupt_by_the_runs_actor_or_a_service_cancels_it_and_runs_next(
    stack: Stack, actor: str
) -> None:
    first, thread, _ = parked(stack)
    waiting = stack.start("user-7", agent="chat", text="queued behind", thread_id=thread)
    assert stack.doors.store.get_run(waiting).status == "queued"

    reply = stack.call(actor, "POST", "/v1/runs", json=chat(thread, if_busy="interrupt"))
    assert reply.status_code == 201, reply.text
    assert set(reply.json()) == {"run_id", "status"}
    third = reply.json()["run_id"]

    stack.doors.wait_status(first, "cancelled")
    ended = stack.doors.store.get_run(first)
    assert (ended.status, ended.cancel_cause) == ("cancelled", "user")
    stack.doors.wait_status(waiting, "cancelled")  # queued before it: asked to stop too
    stack.doors.wait_status(third, "completed")
    done = stack.doors.store.get_run(third)
    assert (done.output, done.actor, done.thread_id) == (CHAT, actor, thread)
    assert stack.call("user-7", "GET", f"/v1/runs/{first}").json()["status"] == "cancelled"

    log = turns(stack, thread)
    assert log.index((first, "turn/end")) < log.index((third, "turn/start"))
    assert (waiting, "turn/start") not in log  # it never began
    logged = stack.doors.client.events(thread)
    [aborted] = [e.data for e in logged if (e.run_id, e.type) == (first, "turn/end")]
    assert aborted == {"reason": "aborted", "cause": "user"}
    assert not stack.doors.store.pending_calls(first)


def test_interrupt_by_another_actor_is_refused_and_changes_nothing(stack: Stack) -> None:
    first, thread, call_id = parked(stack)
    before, busy = counts(stack.doors.store), snapshot(stack, first)

    # The thread is user-7's conversation: alice (who may decide the refund, so reads the
    # run), bob (support) and eve (no role) may not continue it, so not interrupt it
    # either: 404, as for no thread, whatever else they may read.
    for actor in ("alice", "bob", "eve"):
        body = chat(thread, run_id=f"busy-interrupt-{actor}", if_busy="interrupt")
        message = assert_error(
            stack.call(actor, "POST", "/v1/runs", json=body), 404, "UnknownThreadError"
        )
        assert thread in message and first not in message.replace(thread, "")
        assert stack.doors.store.find_run(f"busy-interrupt-{actor}") is None

    # A cancel asked for is written before the reply (the runs' cancel flags, in the
    # snapshot); one acted on would end the run: it completes below.
    assert counts(stack.doors.store) == before
    assert snapshot(stack, first) == busy
    run = stack.doors.store.get_run(first)
    assert (run.status, run.cancel_cause) == ("awaiting_approval", None)

    # The run goes on as if nothing had been asked.
    approve(stack, first, call_id)
    stack.doors.wait_status(first, "completed")
    assert stack.doors.store.get_run(first).output == ANSWER


def test_another_actors_thread_is_not_the_callers_to_continue_nor_to_learn_of(stack: Stack) -> None:
    opened = stack.start("user-7", agent="chat", text="hello")  # the thread's first turn
    stack.doors.wait_status(opened, "completed")
    thread = stack.doors.store.get_run(opened).thread_id
    busy = stack.start("user-7", text="refund it", thread_id=thread)  # its second: parked
    stack.doors.wait_status(busy, "awaiting_approval")
    assert busy != thread  # the id is nothing bob could know from the thread's
    try:
        assert_error(stack.call("bob", "GET", f"/v1/runs/{busy}"), 404)  # not his to read
        for if_busy in ("enqueue", "reject", "interrupt"):
            body = chat(thread, if_busy=if_busy)
            message = assert_error(stack.call("bob", "POST", "/v1/runs", json=body), 404)
            assert busy not in message, (if_busy, message)
    finally:
        cancel(stack, busy)
    # Nor may he continue it once it is idle; a service may.
    before = counts(stack.doors.store)
    body = chat(thread, run_id="not-bobs")
    assert_error(stack.call("bob", "POST", "/v1/runs", json=body), 404, "UnknownThreadError")
    assert counts(stack.doors.store) == before
    assert stack.doors.store.find_run("not-bobs") is None
    started = stack.call("backend", "POST", "/v1/runs", json=chat(thread, actor="user-7"))
    assert started.status_code == 201, started.text


@pytest.mark.parametrize("value", ["later", "", "REJECT", 1, ["reject"]])
def test_a_bad_if_busy_is_422_and_records_nothing(stack: Stack, value: Any) -> None:
    first, thread, _ = parked(stack)
    before, busy = counts(stack.doors.store), snapshot(stack, first)
    body = chat(thread, run_id="busy-bad", if_busy=value)
    message = assert_error(stack.call("user-7", "POST", "/v1/runs", json=body), 422)
    assert "if_busy" in message
    assert stack.doors.store.find_run("busy-bad") is None
    assert counts(stack.doors.store) == before
    assert snapshot(stack, first) == busy
    cancel(stack, first)


def test_enqueue_the_default_is_201_queued_and_runs_after_the_turn(stack: Stack) -> None:
    first, thread, call_id = parked(stack)
    later = []
    for extra in ({}, {"if_busy": "enqueue"}, {"if_busy": None}):  # the default, said, null
        reply = stack.call("user-7", "POST", "/v1/runs", json=chat(thread, **extra))
        assert reply.status_code == 201, reply.text
        assert reply.json()["status"] == "queued"
        later.append(reply.json()["run_id"])

    # The worker's passes have held all three (Celery's lines for their tasks)...
    held = f": 'queued: thread {thread} busy: run {first}'"
    wait_for(lambda: stack.doors.logs().count(held) >= 3, "the worker to hold the three")
    # ...the turn has not ended: they wait for it (and begin only after it: the turns'
    # order below).
    for run_id in later:
        shown = stack.call("user-7", "GET", f"/v1/runs/{run_id}").json()
        assert shown["status"] == "queued", shown
        assert stack.doors.store.get_run(run_id).waiting_on == f"thread {thread} busy: run {first}"
    assert stack.doors.store.get_run(first).status == "awaiting_approval"

    approve(stack, first, call_id)
    for run_id in later:
        stack.doors.wait_status(run_id, "completed")
        assert stack.doors.store.get_run(run_id).output == CHAT
    log = turns(stack, thread)
    order = [first, *later]
    for one, then in itertools.pairwise(order):
        assert log.index((one, "turn/end")) < log.index((then, "turn/start")), log


# --- agent-jobs enqueue --if-busy -------------------------------------------------------------


def test_enqueue_if_busy_reject_on_the_command_line_exits_2_and_records_nothing(
    stack: Stack,
) -> None:
    first, thread, _ = parked(stack)
    before, busy = counts(stack.doors.store), snapshot(stack, first)
    args = ["enqueue", "and then?", "--agent", "chat", "--actor", "user-7", "--thread", thread]

    refused = cli(*args, "--run-id", "cli-busy-1", "--if-busy", "reject", env=stack.doors.env)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stdout == ""
    [line] = refused.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: ")
    assert f"thread {thread!r} is busy: run {first!r} has not ended" in line

    bad = cli(*args, "--run-id", "cli-busy-2", "--if-busy", "later", env=stack.doors.env)
    assert bad.returncode == 2 and "--if-busy" in bad.stderr, bad.stderr

    assert counts(stack.doors.store) == before
    assert snapshot(stack, first) == busy
    assert stack.doors.store.find_run("cli-busy-1") is None
    assert stack.doors.store.find_run("cli-busy-2") is None

    # --if-busy interrupt: the turn is cancelled as a user would, and this one runs.
    done = cli(*args, "--if-busy", "interrupt", "--json", env=stack.doors.env)
    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout)
    stack.doors.wait_status(first, "cancelled")
    assert stack.doors.store.get_run(first).cancel_cause == "user"
    stack.doors.wait_status(started["run_id"], "completed")
    assert stack.doors.store.get_run(started["run_id"]).thread_id == thread


# --- the inline server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Store]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('if-busy-inline') / 'agent_jobs.db'}"
    base = test_encryption.bare_environ()
    env = api_env({**base, "PYTHONPATH": str(ROOT), "AGENT_JOBS_DATABASE_URL": url})
    server = ApiServer(env, "serve-if-busy-inline").start()
    store = Store.from_url(url)
    try:
        yield Api(server), store
    finally:
        store.engine.dispose()
        server.stop()


def test_the_inline_server_rejects_and_interrupts_as_the_durable_one_does(
    inline: tuple[Api, Store],
) -> None:
    api, store = inline

    def status_of(run_id: str) -> str:
        reply = api.call("user-7", "GET", f"/v1/runs/{run_id}")
        assert reply.status_code == 200, reply.text
        return str(reply.json()["status"])

    first = api.start("user-7", text="refund it")
    wait_for(lambda: status_of(first) == "awaiting_approval", f"{first} to park")
    thread = store.get_run(first).thread_id
    before = counts(store)

    body = chat(thread, run_id="inline-busy-1", if_busy="reject")
    message = assert_error(api.call("user-7", "POST", "/v1/runs", json=body), 409, "ConflictError")
    assert f"run {first!r} has not ended" in message
    body = chat(thread, run_id="inline-busy-2", if_busy="interrupt")
    for actor in ("alice", "eve"):  # user-7's conversation: not theirs to continue
        assert_error(api.call(actor, "POST", "/v1/runs", json=body), 404, "UnknownThreadError")
    assert counts(store) == before
    assert status_of(first) == "awaiting_approval"

    reply = api.call("user-7", "POST", "/v1/runs", json=body)
    assert reply.status_code == 201, reply.text
    assert reply.json()["run_id"] == "inline-busy-2"
    wait_for(lambda: status_of("inline-busy-2") == "completed", "the interrupting run to end")
    ended = store.get_run(first)
    assert (ended.status, ended.cancel_cause) == ("cancelled", "user")
    assert store.get_run("inline-busy-2").output == CHAT
