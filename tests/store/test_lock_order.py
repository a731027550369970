"""Two transactions that take the same rows take them in one order: a run's row before
its thread's, a run's row before its calls' and questions'. Each test holds one of them
open at the point where the other used to cut in (found under load: a deadlock failed the
run, or the caller's request), lets the other run until Postgres shows it waiting for a
lock, then lets the first go on: both must succeed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent_jobs import InlineRunner
from agent_jobs.admission import enter
from agent_jobs.approvals import deadlines
from agent_jobs.client import Client
from agent_jobs.store import RunView
from agent_jobs.store import runs as run_rows
from tests.support import apps
from tests.support.apps import executed
from tests.support.harness import InlineHarness
from tests.support.services import inline_on, wait_for_a_lock
from tests.support.waiting import TIMEOUT


@pytest.fixture
def runner(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[InlineRunner]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    with inline_on(apps.app, pg_url) as runner:
        yield runner


class Pause:
    """Holds the thread that reaches it until `release`; says when one has."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self.args: tuple[Any, ...] = ()

    def hold(self, *args: Any) -> None:
        self.args = args
        self.reached.set()
        assert self.go.wait(TIMEOUT), "never released"

    def release(self) -> None:
        self.go.set()


class Outcome:
    """A call on a thread of its own: what it returned, or what it raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.value = call()
            except BaseException as exc:  # the test reports it
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> Any:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.value


def test_a_decision_while_the_inline_run_parks_on_it(
    runner: InlineRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run parks in one transaction: the request on the call's row, its journal row,
    the run's status. A decision takes the run's row, then the call's. Held after the
    call's row was written, the park used to deadlock with the decision."""
    pause = Pause()
    request = deadlines.request

    def held(*args: Any) -> Any:
        deadline = request(*args)
        pause.hold(*args)
        return deadline

    monkeypatch.setattr(deadlines, "request", held)
    run_id = runner.start("support", "Where is order 42?", actor="user-7")
    assert pause.reached.wait(TIMEOUT), runner.store.get_run(run_id)
    _conn, _app, _run, call_id, _tool, _now = pause.args
    client = Client(runner.store, runner.app, runner.settings)
    decided = Outcome(lambda: client.decide(run_id, call_id, "approve", actor="alice"))
    wait_for_a_lock(runner.store)  # the decision waits for the park
    pause.release()

    assert decided.result() is True
    run = runner.wait(run_id, timeout=TIMEOUT)
    assert run.status == "completed", run.error
    assert [what for what, _ in executed(run_id) if what == "refund"] == ["refund"]


def test_an_interrupt_while_a_queued_run_of_the_thread_looks_at_it(
    runner: InlineRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt cancels the thread's runs: it takes their rows, and the cancels'
    events take the thread's. A queued run's entry takes its own row, then the thread's.
    The interrupt used to take the first run's row, the thread's (with its event), then
    the queued run's, and deadlocked with an entry that had taken the queued run's row."""
    store = runner.store
    first = runner.start("gated", "one", actor="user-7")
    thread_id = InlineHarness(runner).wait_status(first, "awaiting_approval").thread_id
    second = runner.start("gated", "two", actor="user-7", thread_id=thread_id)
    assert store.get_run(second).status == "queued"

    before_second = Pause()  # the interrupt, about to take the queued run's row
    record_cancel = run_rows.record_cancel
    interrupter: list[int] = []
    backend: list[int] = []  # the interrupt's session

    def held(conn: Any, run_id: str, *args: Any, **kwargs: Any) -> Any:
        if run_id == second and threading.get_ident() in interrupter:
            backend.append(conn.connection.dbapi_connection.info.backend_pid)  # no statement
            before_second.hold()
        return record_cancel(conn, run_id, *args, **kwargs)

    monkeypatch.setattr(run_rows, "record_cancel", held)

    def interrupt() -> str:
        interrupter.append(threading.get_ident())
        return runner.start(
            "gated", "three", actor="user-7", thread_id=thread_id, if_busy="interrupt"
        )

    third = Outcome(interrupt)
    assert before_second.reached.wait(TIMEOUT), third.result()

    own_row = Pause()  # the entry, holding the queued run's row, before the thread's

    def entry() -> bool:  # as a queued run's pass looks at its thread
        with store.begin() as conn:
            row = run_rows.lock_run(conn, second)
            own_row.hold()
            return bool(enter(conn, runner.app, RunView.from_row(row)))

    entered = Outcome(entry)
    assert own_row.reached.wait(TIMEOUT), entered.result()
    before_second.release()
    wait_for_a_lock(store, backend[0])  # the interrupt waits for the run's row
    own_row.release()

    third_id = third.result()
    entered.result()  # it stays queued, or goes on once the cancelled turns ended
    assert runner.wait(first, timeout=TIMEOUT).status == "cancelled"
    assert runner.wait(second, timeout=TIMEOUT).status == "cancelled"
    assert InlineHarness(runner).wait_status(third_id, "awaiting_approval").thread_id == thread_id
    runner.cancel(third_id)  # nothing left running when the test's database goes
    assert runner.wait(third_id, timeout=TIMEOUT).status == "cancelled"
