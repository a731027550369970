"""A worker host cut off from the network in the middle of a transaction: Postgres keeps
that transaction, and its row locks, until it finds the peer gone. Recovery of the lost
host's runs must not wait on it (only the rows it locks wait), and every connection asks
both sides to find a silent peer gone within `AGENT_JOBS_DATABASE_KEEPALIVE` seconds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from agent_jobs.leases import SEP, Holder, Leases, session_name
from agent_jobs.runners.durable.recovery import recover_process
from agent_jobs.runners.durable.running import Running, heartbeat
from agent_jobs.steps import InvokeTool
from agent_jobs.store import Store, holds
from agent_jobs.store import journal as journal_rows
from agent_jobs.store.db import utcnow
from tests.support.builders import add_run
from tests.support.services import truncate_all, wait_for_a_lock
from tests.support.waiting import TIMEOUT, eventually

LOST = "lost-host:boot:1|4242|99"  # a process of another machine, taken for dead


class Sent:
    """What recovery sends, as a dispatcher."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, str]]]] = []

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        pass

    def steps(self, run_id: str, steps: list[tuple[str, str]], **_: Any) -> None:
        self.sent.append((run_id, steps))

    def steps_of(self, run_id: str) -> list[str]:
        return [step for run, sent in self.sent for _, step in sent if run == run_id]


@pytest.fixture(autouse=True)
def no_leases(redis_url: str) -> Iterator[None]:
    """The leases of this module's runs (r1, r2), gone before and after each test."""
    client = redis.Redis.from_url(redis_url)

    def clear() -> None:
        for key in client.scan_iter("agent_jobs:lease:r[12]:*"):
            client.delete(key)

    clear()
    yield
    clear()
    client.close()


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    store = Store.from_url(pg_url, auto_upgrade=True)
    truncate_all(store)
    yield store
    store.engine.dispose()


def intent(run_id: str) -> dict[str, Any]:
    call = {"id": "call_1", "name": "lookup", "arguments": {}}
    return InvokeTool(
        run_id=run_id, agent="a", actor="u", call=call, offered=["lookup"]
    ).model_dump()


def claimed_step(store: Store, run_id: str) -> None:
    """A run whose step `tool:call_1` the lost host claimed and runs."""
    add_run(store, run_id, runner="durable")
    with store.begin() as conn:
        journal_rows.insert_pending(
            conn, run_id=run_id, step="tool:call_1", seq=1, intent=intent(run_id), state="scheduled"
        )
        holds.mark_started(
            conn,
            run_id,
            "tool:call_1",
            attempt=1,
            started_at=utcnow(),
            lease=30,
            holder=f"{LOST}{SEP}token",
        )


def test_recovery_goes_past_a_run_whose_row_the_lost_host_still_locks(
    pg_store: Store, redis_url: str
) -> None:
    """Before, the healthy worker's recovery waited 10 s on the row the lost host's open
    transaction locked (and every run after it waited too)."""
    claimed_step(pg_store, "r1")
    claimed_step(pg_store, "r2")
    sent = Sent()
    dispatcher: Any = sent
    leases = Leases(redis.Redis.from_url(redis_url))
    lost = pg_store.engine.connect()  # the lost host's transaction, open, holding r1's row
    lost.begin()
    lost.execute(text("UPDATE journal SET state = 'started' WHERE run_id = 'r1'"))
    try:
        result: list[set[str]] = []
        recovering = threading.Thread(
            target=lambda: result.append(
                recover_process(pg_store, leases, dispatcher, LOST, {"r1", "r2"})
            ),
            daemon=True,
        )
        recovering.start()
        eventually(lambda: result, what="recovery to return while r1's row stays locked")
        assert result == [{"r1"}]  # for later
        assert sent.steps_of("r2") == ["tool:call_1"] and sent.steps_of("r1") == []
    finally:
        lost.rollback()  # as Postgres does once it finds the lost host gone
        lost.close()
    assert recover_process(pg_store, leases, dispatcher, LOST, {"r1"}) == set()
    assert sent.steps_of("r1") == ["tool:call_1"]


def test_a_lost_hosts_lock_is_waited_for_only_by_what_needs_its_row(pg_store: Store) -> None:
    """The bound is recovery's alone: any other transaction that needs the row waits for
    it as before (the first writer of a step's outcome must not fail for a lock)."""
    claimed_step(pg_store, "r1")
    lost = pg_store.engine.connect()
    lost.begin()
    lost.execute(text("UPDATE journal SET state = 'started' WHERE run_id = 'r1'"))
    done: list[bool] = []

    def complete() -> None:
        with pg_store.begin() as conn:
            done.append(journal_rows.complete(conn, "r1", "tool:call_1", state="done"))

    writer = threading.Thread(target=complete, daemon=True)
    writer.start()
    try:
        wait_for_a_lock(pg_store)
        assert done == []
    finally:
        lost.rollback()
        lost.close()
    eventually(lambda: done, what="the outcome to be written once the lock is let go")
    # Its connection goes back to the pool after `done` is set: wait for that, or the
    # store is disposed under it and the connection, left open, is found in a later test.
    writer.join(TIMEOUT)
    assert done == [True] and not writer.is_alive()


def test_every_connection_asks_both_sides_to_find_a_silent_peer_gone(
    pg_store: Store, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    with pg_store.engine.connect() as conn:
        shown = {
            name: conn.execute(text(f"SHOW {name}")).scalar()
            for name in (
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
                "idle_in_transaction_session_timeout",
            )
        }
        raw: Any = conn.connection.dbapi_connection
        client = raw.info.get_parameters()
    # The default: a peer silent 4 s is gone, on the server's side (shown) and libpq's.
    assert shown == {
        "tcp_keepalives_idle": "1",
        "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "4000",
        "idle_in_transaction_session_timeout": "1min",
    }
    assert (client["keepalives"], client["keepalives_idle"], client["tcp_user_timeout"]) == (
        "1",
        "1",
        "4000",
    )
    monkeypatch.setenv("AGENT_JOBS_DATABASE_KEEPALIVE", "12")
    monkeypatch.setenv("AGENT_JOBS_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT", "5")
    from agent_jobs.settings import get_settings

    get_settings.cache_clear()
    try:
        other = Store.from_url(pg_url)
        with other.engine.connect() as conn:
            idle = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
            user_timeout = conn.execute(text("SHOW tcp_user_timeout")).scalar()
        other.engine.dispose()
    finally:
        get_settings.cache_clear()
    assert (idle, user_timeout) == ("5s", "12000")


def test_the_sessions_of_a_process_taken_for_dead_are_ended_so_its_locks_go(
    pg_store: Store, redis_url: str, pg_url: str
) -> None:
    """Postgres would keep the lost host's transaction until it found the peer gone
    (`AGENT_JOBS_DATABASE_KEEPALIVE`): every session is named after its process, and
    recovery ends those of the process it took for dead, so the locked run is recovered
    on its next try, not seconds later."""
    claimed_step(pg_store, "r1")
    sent = Sent()
    dispatcher: Any = sent
    leases = Leases(redis.Redis.from_url(redis_url))
    url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
    as_lost = create_engine(url, connect_args={"application_name": session_name(LOST)})
    lost = as_lost.connect()
    lost.begin()
    lost.execute(text("UPDATE agent_jobs.journal SET state = 'started' WHERE run_id = 'r1'"))
    try:
        assert recover_process(pg_store, leases, dispatcher, LOST, {"r1"}) == {"r1"}
        assert sent.steps_of("r1") == []
        # Its session was ended: its transaction rolled back, the row free.
        assert recover_process(pg_store, leases, dispatcher, LOST, {"r1"}) == set()
        assert sent.steps_of("r1") == ["tool:call_1"]
        with pytest.raises(OperationalError):
            lost.execute(text("SELECT 1"))
    finally:
        lost.close()
        as_lost.dispose()


def test_a_step_a_live_delivery_took_over_is_left_to_it(pg_store: Store, redis_url: str) -> None:
    """Two recoveries of one death: the first sent the step, a delivery took it (its
    lease, the step's epoch as it was), then the second recovery came. It moved the epoch
    on and sent the step again, so the live delivery's outcome was refused and the step
    sent anew found the lease taken: the run waited for the sweep (found in CI). A step
    whose lease a live delivery holds is that delivery's: left as it is."""
    claimed_step(pg_store, "r1")
    sent = Sent()
    dispatcher: Any = sent
    leases = Leases(redis.Redis.from_url(redis_url))
    delivery = Holder("another-host:boot:1", 77, "1", "token")  # alive, elsewhere
    assert leases.take("r1", "tool:call_1", delivery, 30)
    assert recover_process(pg_store, leases, dispatcher, LOST, {"r1"}) == set()
    assert sent.steps_of("r1") == []
    [row] = [r for r in pg_store.journal("r1") if r["step"] == "tool:call_1"]
    assert row["fence"] == 0  # the delivery's outcome will be written
    assert leases.held("r1", ["tool:call_1"]) == {"tool:call_1"}  # still its lease


def test_a_heartbeat_whose_row_is_locked_holds_up_no_other_steps_lease(
    pg_store: Store, redis_url: str
) -> None:
    """One thread beats for every step of a process. A step's row held by another
    transaction (a lost host's, still open) made its heartbeat wait on the lock, and
    every other step's lease of the process went unrenewed meanwhile."""
    claimed_step(pg_store, "r1")
    claimed_step(pg_store, "r2")
    leases = Leases(redis.Redis.from_url(redis_url))
    started = utcnow()
    me = Holder.me()
    running = {
        run: Running(run, "tool:call_1", "agent_jobs.invoke_tool", me, claimed=False)
        for run in ("r1", "r2")
    }
    for run in running:
        assert leases.take(run, "tool:call_1", me, 3.0)
    lost = pg_store.engine.connect()  # r1's row, locked by a transaction left open
    lost.begin()
    lost.execute(text("UPDATE journal SET state = 'started' WHERE run_id = 'r1'"))
    ttl = leases.client.pttl
    try:
        with (
            heartbeat(leases, pg_store, 3.0, running["r1"], 1, started),
            heartbeat(leases, pg_store, 3.0, running["r2"], 1, started),
        ):
            first = ttl("agent_jobs:lease:r2:tool:call_1")
            # r2's lease is renewed (a beat a second) while r1's row stays locked.
            eventually(
                lambda: ttl("agent_jobs:lease:r2:tool:call_1") > first,
                what="r2's lease to be renewed while r1's row is locked",
            )
    finally:
        lost.rollback()
        lost.close()
