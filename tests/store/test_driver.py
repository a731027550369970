"""The hot statements on the driver (store/driver.py), on Postgres: the same rows as
SQLAlchemy gives, writes sent ahead that every later statement sees, that a rollback
discards and that fail the transaction as a whole, and a lost connection reported as
SQLAlchemy reports one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from agent_jobs import encryption
from agent_jobs.encryption.keyring import keyring, owner_key
from agent_jobs.errors import PayloadOwnerError
from agent_jobs.store import Store, driver, journal, runs
from agent_jobs.store.db import utcnow
from agent_jobs.store.payloads import Codecs
from agent_jobs.store.schema import runs as runs_table
from tests.support import encryption as test_encryption
from tests.support.builders import add_run
from tests.support.services import truncate_all
from tests.support.waiting import TIMEOUT


@pytest.fixture
def pg(pg_url: str) -> Iterator[Store]:
    s = Store.from_url(pg_url)
    truncate_all(s)
    yield s
    s.engine.dispose()


def _run(store: Store, run_id: str = "r1") -> None:
    add_run(store, run_id, runner="durable", metadata={"k": [1, {"x": None}]})
    with store.begin() as conn:
        journal.insert_many(
            conn,
            [
                journal.row(
                    run_id=run_id, step="s:1", seq=1, state="done", intent={"a": 1}, result=[1]
                ),
                journal.row(run_id=run_id, step="s:2", seq=2, state="scheduled", intent={}),
            ],
        )


def _statements(store: Store) -> list[str]:
    """The statements SQLAlchemy itself executes from now on."""
    seen: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    return seen


def test_the_driver_gives_the_rows_sqlalchemy_gives(pg: Store) -> None:
    _run(pg)
    with pg.begin() as conn:
        by_sqlalchemy = conn.execute(
            runs._LOCK_AND_TOUCH, {"b_run_id": "r1", "b_now": utcnow()}
        ).one()
        by_driver = runs.lock_and_touch(conn, "r1")
        assert by_driver is not None
        assert {k: v for k, v in by_driver._asdict().items() if k != "updated_at"} == {
            k: v for k, v in by_sqlalchemy._asdict().items() if k != "updated_at"
        }
        assert by_driver.metadata == {"k": [1, {"x": None}]}  # JSON, decoded
        assert by_driver.created_at.tzinfo is not None  # an aware datetime
        assert by_driver[0] == by_driver.id == by_driver._mapping["id"] == "r1"
        with pytest.raises(AttributeError):
            by_driver.no_such_column  # noqa: B018
        replayed = journal.load_for_replay(conn, "r1")
        assert [(r.step, r.seq, r.state, r.result) for r in replayed] == [
            ("s:1", 1, "done", [1]),
            ("s:2", 2, "scheduled", None),
        ]
        row = journal.get_with_run(conn, "r1", "s:2")
        assert row is not None and (row.run_status, row.intent) == ("running", {})
        assert journal.get_with_run(conn, "r1", "nope") is None


def test_a_pass_of_hot_statements_goes_around_sqlalchemy(pg: Store) -> None:
    """The statements a pass runs most are executed on psycopg, not by SQLAlchemy."""
    _run(pg)
    seen = _statements(pg)
    with pg.begin() as conn:
        runs.lock_and_touch(conn, "r1")
        journal.complete_and_load(conn, "r1", "s:2", state="done", result={"ok": True})
        runs.note_status(conn, "r1", "running", waiting_on=None)
        journal.insert_many(
            conn,
            [journal.row(run_id="r1", step="s:3", seq=3, state="done", intent={}, result=3)],
            [("t1", "r1", "e", {"n": 1})],
        )
    assert seen == []
    with pg.connect() as conn:
        assert [r.state for r in journal.load_for_replay(conn, "r1")] == ["done"] * 3


def test_the_run_lock_and_the_journal_are_read_in_one_batch(pg: Store) -> None:
    """`lock_and_load`: the run's row and its journal after a position, with a step's
    outcome written under the lock, and the thread's events of some types if asked; an
    unknown run gives nothing and writes nothing."""
    from agent_jobs.store import events as event_rows

    _run(pg)
    with pg.begin() as conn:
        event_rows.append(conn, [("t1", "r1", "a", {"n": 1}), ("t1", "r1", "b", {"n": 2})])
    with pg.begin() as conn:
        run, rows, inbox = journal.lock_and_load(
            conn, "r1", after=1, outcome={"step": "s:2", "state": "done", "result": {"n": 2}}
        )
        assert run is not None and run.id == "r1" and run.status == "running"
        assert [(r.step, r.state, r.result) for r in rows] == [("s:2", "done", {"n": 2})]
        assert inbox is None
        run, rows, inbox = journal.lock_and_load(conn, "r1", after=0, inbox=["b", "c"])
        assert [r.seq for r in rows] == [1, 2]
        assert inbox is not None and [(e.type, e.data) for e in inbox] == [("b", {"n": 2})]
        assert journal.lock_and_load(conn, "nope", after=0, inbox=["b"]) == (None, [], None)
        [first, second] = driver.batch(
            conn, [(select(runs_table.c.id), {}), (select(runs_table.c.agent), {})]
        )
        assert ([r.id for r in first], [r.agent for r in second]) == (["r1"], ["a"])


def test_a_write_sent_later_is_seen_by_every_later_statement(pg: Store) -> None:
    _run(pg)
    with pg.begin() as conn:
        runs.note_status(conn, "r1", "awaiting_approval", waiting_on="approval:c1")
        # Through the driver (sent in one pipeline with the read) ...
        row = runs.lock_and_touch(conn, "r1")
        assert row is not None and row.waiting_on == "approval:c1"
        runs.note_status(conn, "r1", "running", waiting_on="tool:c2")
        # ... and through SQLAlchemy (sent before it).
        waiting_on = conn.execute(select(runs_table.c.waiting_on)).scalar_one()
        assert waiting_on == "tool:c2"
        runs.note_status(conn, "r1", "running", waiting_on="tool:c3")  # goes with COMMIT
    with pg.connect() as conn:
        assert conn.execute(select(runs_table.c.waiting_on)).scalar_one() == "tool:c3"


def test_a_rollback_discards_the_writes_waiting(pg: Store) -> None:
    _run(pg)
    with pytest.raises(RuntimeError), pg.begin() as conn:
        runs.note_status(conn, "r1", "awaiting_approval", waiting_on="approval:c1")
        raise RuntimeError("the pass failed")
    # The next transaction on the pooled connection sends nothing left over.
    with pg.begin() as conn:
        assert runs.lock_and_touch(conn, "r1").waiting_on is None  # type: ignore[union-attr]
    with pg.connect() as conn:
        runs.note_status(conn, "r1", "awaiting_approval", waiting_on="never committed")
    with pg.connect() as conn:
        assert conn.execute(select(runs_table.c.waiting_on)).scalar_one() is None


def test_a_write_sent_later_that_fails_fails_the_whole_transaction(pg: Store) -> None:
    _run(pg)
    duplicate = journal.row(run_id="r1", step="s:1", seq=9, state="done", intent={}, result=1)
    with pytest.raises(IntegrityError), pg.begin() as conn:
        runs.note_status(conn, "r1", "awaiting_approval", waiting_on="approval:c1")
        journal.insert_many(conn, [duplicate])  # s:1 exists: fails with the COMMIT
    with pytest.raises(IntegrityError), pg.begin() as conn:
        journal.insert_many(conn, [duplicate])
        runs.lock_and_touch(conn, "r1")  # fails with the statement it went with
    with pg.connect() as conn:
        assert conn.execute(select(runs_table.c.waiting_on)).scalar_one() is None
        assert len(journal.load_for_replay(conn, "r1")) == 2


@pytest.fixture(params=["clear", "sealed"])
def sealing(request: pytest.FixtureRequest) -> Iterator[bool]:
    """This process as the settings have it, or sealing with the suite's master key."""
    before, ring = Codecs.installed, keyring()
    if request.param == "sealed":
        encryption.configure(test_encryption.KEYS_JSON, test_encryption.KEY_ID, settings=False)
    yield keyring().encrypting
    Codecs.installed = before
    encryption.set_keyring(ring)


def _owner() -> str | None:
    """The id of the data key this context's writes are sealed under, if any."""
    try:
        key = owner_key()
    except PayloadOwnerError:
        return None
    return key.id if key is not None else None


def test_a_connection_lost_mid_transaction_is_invalidated_like_sqlalchemys(
    sealing: bool, pg: Store
) -> None:
    _run(pg)
    owner_before = _owner() if sealing else None
    with pytest.raises(DBAPIError) as lost, pg.begin() as conn:
        runs.lock_and_touch(conn, "r1")
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with psycopg.connect(driver_url(pg), autocommit=True) as admin:
            # With a timeout, Postgres returns once the backend has exited (not merely been
            # signalled): the next statement surely meets a lost connection.
            ended = admin.execute(
                "SELECT pg_terminate_backend(%s, %s)", (pid, int(TIMEOUT * 1000))
            ).fetchone()
            assert ended == (True,), f"backend {pid} did not exit"
        journal.load_for_replay(conn, "r1")
    assert lost.value.connection_invalidated
    if sealing:  # the owner the lost transaction set is let go with it
        assert _owner() == owner_before
    with pg.begin() as conn:  # the pool gave a new connection
        assert runs.lock_and_touch(conn, "r1") is not None


def test_sqlalchemys_own_statements_still_run_in_the_transaction(pg: Store) -> None:
    """The psycopg connections run in autocommit mode: the BEGIN is ours, and it goes
    before SQLAlchemy's statements too, so they commit and roll back with the rest."""
    _run(pg)
    with pytest.raises(RuntimeError), pg.begin() as conn:
        conn.execute(runs_table.update().values(waiting_on="rolled back"))
        assert driver.first(conn, select(runs_table.c.waiting_on), {}).waiting_on == ("rolled back")
        raise RuntimeError
    with pg.begin() as conn:
        runs.lock_and_touch(conn, "r1")
        conn.execute(runs_table.update().values(waiting_on="committed"))
    with pg.connect() as conn:
        assert conn.execute(select(runs_table.c.waiting_on)).scalar_one() == "committed"


def test_a_connection_for_reads_reads_in_read_only_transactions(pg: Store) -> None:
    """`Store.connect`: a statement on the driver runs in a read-only transaction of its
    own, committed in the same round trip (nothing is left open for the close); a write
    there fails, through the driver or through SQLAlchemy."""
    _run(pg)
    with pg.connect() as conn:
        assert len(journal.load_for_replay(conn, "r1")) == 2
        assert journal.get_with_run(conn, "r1", "s:1") is not None
        raw = conn.connection.driver_connection
        assert raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with pytest.raises(DBAPIError, match="read-only transaction"):
            runs.lock_and_touch(conn, "r1")
    with pg.connect() as conn, pytest.raises(DBAPIError, match="read-only transaction"):
        conn.execute(runs_table.update().values(waiting_on="never"))
    with pg.connect() as conn:
        assert conn.execute(select(runs_table.c.waiting_on)).scalar_one() is None


def test_a_delivered_model_step_known_here_reads_no_earlier_intents(
    pg: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model step journaled against the one before is made whole from that step's
    whole intent when this process scheduled it, with no read of the run's intents."""
    from agent_jobs.store import model_requests

    _run(pg)
    first = {
        "type": "model_turn",
        "request": {"messages": [{"m": 1}], "system": "s", "tools": ["t"]},
    }
    second = {
        "type": "model_turn",
        "request": {"messages": [{"m": 1}, {"m": 2}], "system": "s", "tools": ["t"]},
    }
    slim = model_requests.slim(second, ("model:1", first))
    assert "since" in slim
    with pg.begin() as conn:
        journal.insert_many(
            conn,
            [
                journal.row(run_id="r1", step="model:1", seq=3, state="done", intent=first),
                journal.row(run_id="r1", step="model:2", seq=4, state="scheduled", intent=slim),
            ],
        )
    with pg.connect() as conn:
        read = journal.get_with_whole_intent(conn, "r1", "model:2")
        assert read is not None and read.intent == second
        created = read.run_created_at
        monkeypatch.setattr(journal, "_model_intents", _no_read)
        known = {created: ("model:1", first)}.get  # the step before
        assert journal.get_with_whole_intent(conn, "r1", "model:2", known).intent == second
        known = {created: ("model:2", second)}.get  # the step itself, scheduled here
        assert journal.get_with_whole_intent(conn, "r1", "model:2", known).intent == second
        with pytest.raises(AssertionError, match="read"):  # known for another run
            journal.get_with_whole_intent(conn, "r1", "model:2", {}.get)


def _no_read(*_: Any, **__: Any) -> Any:
    raise AssertionError("the run's model intents were read")


def test_a_statement_with_values_bound_at_each_execution_is_refused(pg: Store) -> None:
    with pg.connect() as conn, pytest.raises(TypeError, match="expanding"):
        driver.rows(conn, select(runs_table).where(runs_table.c.status.in_(["a", "b"])), {})


def driver_url(store: Store) -> str:
    return store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def _communications(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each time psycopg's pipeline talks to the server (sends what it holds, reads what
    came back), the number of statements it still held to send."""
    import psycopg._pipeline_base as base

    seen: list[int] = []
    real = base.pipeline_communicate

    def counted(pgconn: Any, commands: Any) -> Any:
        seen.append(len(commands))
        return real(pgconn, commands)

    monkeypatch.setattr(base, "pipeline_communicate", counted)
    return seen


def _numbered(count: int) -> list[tuple[Any, dict[str, Any]]]:
    return [(text(f"SELECT {n} AS n, CAST(:v AS text) AS v"), {"v": f"v{n}"}) for n in range(count)]


def test_a_pipelines_statements_go_out_together_at_its_sync(
    pg: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg talks to the server after each statement of a pipeline (a send a
    statement); the driver's statements wait in libpq's buffer and go out at the sync, the
    one time the pipeline talks to the server. Without the one write (psycopg's own path)
    the rows are the same."""
    seen = _communications(monkeypatch)
    with pg.begin() as conn:
        found = driver.batch(conn, _numbered(6))
    assert [[(r.n, r.v) for r in rows] for rows in found] == [[(n, f"v{n}")] for n in range(6)]
    assert seen == [1]  # once, at the sync, which is all it still holds to send

    seen.clear()
    monkeypatch.setattr(driver, "_ONE_WRITE", False)
    with pg.begin() as conn:
        again = driver.batch(conn, _numbered(6))
    assert [[(r.n, r.v) for r in rows] for rows in again] == [[(n, f"v{n}")] for n in range(6)]
    assert len(seen) == 1 + 6 + 1  # the BEGIN, each statement, the sync


def test_a_large_batch_against_large_results_does_not_deadlock(pg: Store) -> None:
    """The statements held until the sync can be larger than the socket's buffers while
    the server answers with results larger still: libpq reads while it writes."""
    big = "x" * (1 << 20)
    statements = [
        (text(f"SELECT {n} AS n, repeat(CAST(:v AS text), 3) AS v"), {"v": big}) for n in range(24)
    ]
    with pg.begin() as conn:
        found = driver.batch(conn, statements)
    assert [rows[0].n for rows in found] == list(range(24))
    assert all(len(rows[0].v) == 3 << 20 for rows in found)
