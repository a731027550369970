"""The runs list (store/listing.py) on both databases: every filter, the search, keyset
pages that stay put while runs are added, typed refusals of bad input, a reader's runs;
and, on Postgres, each filter's index."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, text

from agent_jobs import encryption
from agent_jobs.encryption.keyring import Keyring, keyring, own
from agent_jobs.errors import InvalidRequestError
from agent_jobs.store import Store, threads
from agent_jobs.store.listing import Reader, RunFilter, RunPage, Trees, encode_cursor
from agent_jobs.store.payloads import Codecs
from agent_jobs.store.schema import SEARCH_INDEX
from agent_jobs.store.schema import runs as runs_table
from agent_jobs.store.schema import tool_calls as calls_table
from tests.support import encryption as test_encryption
from tests.support.services import truncate_all

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class Run:
    id: str
    minute: int  # created T0 + this many minutes
    agent: str = "support"
    actor: str = "u"
    status: str = "completed"
    thread_id: str = "t1"
    input: str = "hello"
    metadata: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    root: str | None = None

    @property
    def created_at(self) -> datetime:
        return T0 + timedelta(minutes=self.minute)


def add(store: Store, *rows: Run) -> None:
    """The runs, straight into the table; each row's payloads its actor's (sealed when
    the suite runs with encryption on, as the store would write them)."""
    with store.begin() as conn:
        for thread_id in sorted({r.thread_id for r in rows}):
            threads.ensure_thread(conn, thread_id)
        for r in rows:
            own(conn, r.actor, r.id)
            conn.execute(
                insert(runs_table),
                {
                    "id": r.id,
                    "thread_id": r.thread_id,
                    "agent": r.agent,
                    "actor": r.actor,
                    "input": r.input,
                    "status": r.status,
                    "metadata": r.metadata,
                    "runner": "durable",
                    "parent_run_id": r.parent,
                    "root_run_id": r.root or r.parent or r.id,
                    "depth": 0 if r.parent is None else 1,
                    "day": r.created_at.date().isoformat(),
                    "created_at": r.created_at,
                    "updated_at": r.created_at,
                },
            )


def call(store: Store, run: Run, name: str, *, kind: str = "action") -> None:
    with store.begin() as conn:
        own(conn, run.actor, run.id)
        conn.execute(
            insert(calls_table).values(
                run_id=run.id,
                call_id=f"c-{run.id}-{name}",
                thread_id=run.thread_id,
                name=name,
                kind=kind,
                args={},
                status="approved",
                created_at=run.created_at,
                updated_at=run.created_at,
            )
        )


RUNS = [
    Run("r01", 1, status="queued", input="Where is my order 1234?"),
    Run("r02", 2, status="running", agent="billing", actor="v", thread_id="t2"),
    Run("r03", 3, status="failed", input="refund 100% please"),
    Run("r04", 4, status="awaiting_approval", agent="billing", metadata={"ticket": "ZX-42"}),
    Run("r05", 5, status="paused", actor="v", thread_id="t2", input="a_b"),
    Run("r06", 6, input="axb"),
    Run("r07", 7, agent="billing", actor="w", thread_id="t3", status="failed"),
    Run("r08", 8, parent="r07", actor="w", thread_id="t3", input="child of seven"),
    Run("r09", 9, status="cancelled", input="back\\slash"),
    Run("r10", 10, status="running", actor="w", thread_id="t3"),
    Run("r11", 10, status="queued", actor="w", thread_id="t3"),  # same moment as r10
    Run("r12", 12, agent="billing", input="SHOUTING order"),
]
BY_ID = {r.id: r for r in RUNS}


@pytest.fixture
def listed(store: Store) -> Store:
    add(store, *RUNS)
    return store


def newest_first(runs: list[Run]) -> list[str]:
    return [r.id for r in sorted(runs, key=lambda r: (r.created_at, r.id), reverse=True)]


def ids(page: RunPage) -> list[str]:
    return [r.run_id for r in page.runs]


def everything(store: Store, where: RunFilter, limit: int = 50, **kw: Any) -> list[str]:
    """Every page of the list, its cursors followed."""
    found: list[str] = []
    cursor = None
    while True:
        page = store.runs_page(where, limit=limit, cursor=cursor, **kw)
        found.extend(ids(page))
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


FILTERS: dict[str, tuple[RunFilter, Callable[[Run], bool]]] = {
    "none": (RunFilter(), lambda r: True),
    "status": (RunFilter(statuses=("failed",)), lambda r: r.status == "failed"),
    "statuses": (
        RunFilter(statuses=("running", "queued", "running")),
        lambda r: r.status in ("running", "queued"),
    ),
    "agent": (RunFilter(agent="billing"), lambda r: r.agent == "billing"),
    "actor": (RunFilter(actor="w"), lambda r: r.actor == "w"),
    "thread": (RunFilter(thread_id="t2"), lambda r: r.thread_id == "t2"),
    "parent": (RunFilter(parent_run_id="r07"), lambda r: r.parent == "r07"),
    "root": (RunFilter(root_run_id="r07"), lambda r: (r.root or r.parent or r.id) == "r07"),
    "since": (RunFilter(since=T0 + timedelta(minutes=9)), lambda r: r.minute >= 9),
    "until": (RunFilter(until=T0 + timedelta(minutes=3)), lambda r: r.minute < 3),
    "a day": (
        RunFilter(since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=5)),
        lambda r: 2 <= r.minute < 5,
    ),
    "agent and status": (
        RunFilter(agent="billing", statuses=("failed", "running")),
        lambda r: r.agent == "billing" and r.status in ("failed", "running"),
    ),
    "actor, thread and since": (
        RunFilter(actor="w", thread_id="t3", since=T0 + timedelta(minutes=8)),
        lambda r: r.actor == "w" and r.thread_id == "t3" and r.minute >= 8,
    ),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_each_filter_lists_its_runs_newest_first(listed: Store, name: str) -> None:
    where, keeps = FILTERS[name]
    expected = newest_first([r for r in RUNS if keeps(r)])
    assert expected, "a filter that keeps nothing proves little"
    page = listed.runs_page(where)
    assert ids(page) == expected and page.next_cursor is None


def test_a_run_holds_what_the_list_shows(listed: Store) -> None:
    [run] = listed.runs_page(RunFilter(parent_run_id="r07")).runs
    assert (run.run_id, run.agent, run.actor, run.status, run.thread_id) == (
        "r08",
        "support",
        "w",
        "completed",
        "t3",
    )
    assert (run.parent_run_id, run.root_run_id, run.input) == ("r07", "r07", "child of seven")
    # SQLite keeps times without their zone, in UTC (as the store writes them)
    assert run.created_at.replace(tzinfo=UTC) == BY_ID["r08"].created_at


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("order", ["r12", "r01"]),  # in the input, any case
        ("ORDER", ["r12", "r01"]),
        ("zx-42", ["r04"]),  # in the metadata
        ("ticket", ["r04"]),
        ("r05", ["r05"]),  # a run id
        ("100%", ["r03"]),  # % is itself, not any text
        ("0% p", ["r03"]),
        ("a_b", ["r05"]),  # _ is itself: "axb" is not found
        ("back\\slash", ["r09"]),
        ("\\", ["r09"]),
        ("%", ["r03"]),
        ("_", ["r05"]),
        ("nowhere at all", []),
    ],
)
def test_the_search_finds_ids_inputs_and_metadata_literally(
    listed: Store, q: str, expected: list[str]
) -> None:
    if test_encryption.enabled():  # by design, a sealed run is found by its id only
        expected = [q] if q in BY_ID else []
    assert ids(listed.runs_page(RunFilter(q=q))) == expected


def test_the_search_goes_with_the_other_filters(listed: Store) -> None:
    if test_encryption.enabled():  # a sealed run is found by its id only
        assert ids(listed.runs_page(RunFilter(q="r12", agent="billing"))) == ["r12"]
        assert ids(listed.runs_page(RunFilter(q="r12", agent="support"))) == []
        return
    assert ids(listed.runs_page(RunFilter(q="order", agent="billing"))) == ["r12"]
    assert ids(listed.runs_page(RunFilter(q="order", statuses=("failed",)))) == []


def test_a_time_with_an_offset_or_none_is_taken_as_the_same_moment(listed: Store) -> None:
    plus_two = (T0 + timedelta(minutes=9)).astimezone(UTC).replace(tzinfo=None)
    naive = ids(listed.runs_page(RunFilter(since=plus_two)))
    from datetime import timezone

    shifted = (T0 + timedelta(minutes=9)).astimezone(timezone(timedelta(hours=2)))
    assert naive == ids(listed.runs_page(RunFilter(since=shifted)))
    assert naive == newest_first([r for r in RUNS if r.minute >= 9])


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 11, 12, 13])
def test_the_pages_followed_are_the_whole_list(listed: Store, limit: int) -> None:
    assert everything(listed, RunFilter(), limit=limit) == newest_first(RUNS)
    assert everything(listed, RunFilter(actor="w"), limit=limit) == newest_first(
        [r for r in RUNS if r.actor == "w"]
    )


def test_a_full_last_page_says_there_is_no_more(listed: Store) -> None:
    page = listed.runs_page(RunFilter(), limit=len(RUNS))
    assert len(page.runs) == len(RUNS) and page.next_cursor is None
    page = listed.runs_page(RunFilter(), limit=len(RUNS) - 1)
    assert page.next_cursor is not None
    assert ids(listed.runs_page(RunFilter(), cursor=page.next_cursor)) == ["r01"]


def test_runs_added_between_pages_shift_no_later_page(listed: Store) -> None:
    """Runs started while a reader pages (newer, and one as old as the cursor's with a
    greater id) never push a run onto the next page again, nor past it."""
    seen: list[str] = []
    page = listed.runs_page(RunFilter(), limit=4)
    seen.extend(ids(page))
    added = 0
    while page.next_cursor is not None:
        added += 1
        add(listed, Run(f"new{added}", 100 + added), Run(f"r12-{added}", 12))
        page = listed.runs_page(RunFilter(), limit=4, cursor=page.next_cursor)
        seen.extend(ids(page))
    assert seen == newest_first(RUNS)
    assert added >= 2


def test_a_cursor_outlives_the_run_it_names(listed: Store) -> None:
    page = listed.runs_page(RunFilter(), limit=3)
    with listed.begin() as conn:
        conn.execute(runs_table.delete().where(runs_table.c.id == page.runs[-1].run_id))
    rest = ids(listed.runs_page(RunFilter(), cursor=page.next_cursor))
    assert rest == newest_first(RUNS)[3:]


BAD_CURSORS = [
    "",
    "not base64 at all!",
    "e30",  # {}
    encode_cursor(T0, "r01")[:-3],
    "W10",  # []
    "eyJ0Ijoibm90IGEgdGltZSIsImlkIjoicjAxIn0",  # {"t":"not a time","id":"r01"}
    "eyJ0IjoxLCJpZCI6InIwMSJ9",  # {"t":1,"id":"r01"}
    "é",
]


@pytest.mark.parametrize("cursor", BAD_CURSORS)
def test_a_bad_cursor_is_a_typed_error_that_changes_nothing(listed: Store, cursor: str) -> None:
    before = everything(listed, RunFilter())
    with pytest.raises(InvalidRequestError, match=r"^invalid request: cursor: "):
        listed.runs_page(RunFilter(), cursor=cursor)
    assert everything(listed, RunFilter()) == before


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"where": RunFilter(statuses=("done",))}, "invalid request: status: 'done'"),
        ({"where": RunFilter(agent="a\x00b")}, "invalid request: agent: "),
        ({"where": RunFilter(q="x\x00")}, "invalid request: q: "),
        ({"where": RunFilter(q="x" * 501)}, "invalid request: q: "),
        ({"where": RunFilter(), "limit": 0}, "invalid request: limit: "),
        ({"where": RunFilter(), "limit": 501}, "invalid request: limit: "),
    ],
)
def test_bad_filters_are_typed_errors(listed: Store, kw: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        listed.runs_page(kw["where"], limit=kw.get("limit", 50))
    assert str(refused.value).startswith(says)


# --- a reader who may not read every run --------------------------------------------------

TREES = [
    Run("mine", 1, actor="me"),
    Run("mine-child", 2, actor="helper", parent="mine"),  # delegated, another actor
    Run("theirs", 3, actor="other"),
    Run("theirs-child", 4, actor="other", parent="theirs"),
    Run("refunded", 5, actor="other", thread_id="t2"),  # a refund was called in it
    Run("refunded-child", 6, actor="other", thread_id="t2", parent="refunded"),
    Run("refunded-deep", 7, actor="other", parent="refunded-child", root="refunded"),
    Run("looked-up", 8, actor="other", thread_id="t3"),  # only a read tool of that name
    Run("shipped", 9, actor="other", thread_id="t3"),  # an action the reader may not decide
    Run("mine-late", 10, actor="me", status="failed"),
    Run("foreign-parent", 11, actor="other", thread_id="t4"),
    Run("mine-under-theirs", 12, actor="me", thread_id="t4", parent="foreign-parent"),
]


@pytest.fixture
def trees(store: Store) -> Store:
    add(store, *TREES)
    by_id = {r.id: r for r in TREES}
    call(store, by_id["refunded-child"], "refund")
    call(store, by_id["looked-up"], "refund", kind="read")
    call(store, by_id["shipped"], "ship")
    return store


def test_a_reader_gets_their_runs_their_runs_trees_and_the_trees_of_calls_they_decide(
    trees: Store,
) -> None:
    reader = Reader("me", frozenset({"refund"}))
    expected = [
        "mine-under-theirs",  # their own run, in someone else's tree
        "mine-late",
        "refunded-deep",  # the whole tree of a run that called refund
        "refunded-child",
        "refunded",
        "mine-child",  # delegated from their run, whoever it runs as
        "mine",
    ]
    assert ids(trees.runs_page(RunFilter(), reader=reader)) == expected
    for limit in (1, 2, 3, 7):
        assert everything(trees, RunFilter(), limit=limit, reader=reader) == expected


def test_a_reader_with_no_tools_gets_their_own_and_their_trees(trees: Store) -> None:
    reader = Reader("me", frozenset())
    found = ids(trees.runs_page(RunFilter(), reader=reader))
    assert found == ["mine-under-theirs", "mine-late", "mine-child", "mine"]
    assert ids(trees.runs_page(RunFilter(), reader=Reader("nobody", frozenset()))) == []


def test_a_readers_runs_are_filtered_too(trees: Store) -> None:
    reader = Reader("me", frozenset({"refund", "ship"}))
    assert ids(trees.runs_page(RunFilter(statuses=("failed",)), reader=reader)) == ["mine-late"]
    assert ids(trees.runs_page(RunFilter(thread_id="t3"), reader=reader)) == ["shipped"]
    # A sealed run is found by its whole id only (encryption on), a clear one by a piece
    q = "refunded-child" if test_encryption.enabled() else "refunded-c"
    assert ids(trees.runs_page(RunFilter(q=q), reader=reader)) == ["refunded-child"]


# --- Postgres: each filter can use its index ----------------------------------------------


@pytest.fixture
def postgres(pg_url: str) -> Iterator[Store]:
    store = Store.from_url(pg_url)
    truncate_all(store)
    # Clear rows even with the suite's encryption on: the plans are the query's, and at
    # a dozen rows the planner's costs follow the rows' widths (ciphertext is wider).
    ring = keyring()
    encryption.set_keyring(Keyring({}, None))
    try:
        add(store, *RUNS)
    finally:
        encryption.set_keyring(ring)
    yield store
    store.engine.dispose()


PLANS: dict[str, tuple[RunFilter, Reader | None, set[str]]] = {
    "none": (RunFilter(), None, {"ix_runs_created"}),
    "status": (RunFilter(statuses=("failed",)), None, {"ix_runs_status_created"}),
    "agent": (RunFilter(agent="billing"), None, {"ix_runs_agent_created"}),
    "actor": (RunFilter(actor="w"), None, {"ix_runs_actor_created"}),
    "thread": (RunFilter(thread_id="t2"), None, {"ix_runs_thread_created"}),
    "parent": (RunFilter(parent_run_id="r07"), None, {"ix_runs_parent"}),
    "root": (RunFilter(root_run_id="r07"), None, {"ix_runs_root"}),
    "since": (RunFilter(since=T0), None, {"ix_runs_created"}),
    "q": (RunFilter(q="order"), None, {SEARCH_INDEX, "runs_pkey"}),
    "reader": (
        RunFilter(),
        Reader("me", frozenset({"refund"})),
        {"ix_runs_actor_created", "ix_runs_root", "ix_tool_calls_action"},
    ),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_each_filter_can_use_its_index(postgres: Store, name: str) -> None:
    """With sequential scans made dear, each filter's query names its index. The tables
    here are too small for the planner to prefer an index on its own: the real plans, at
    1,000,000 runs, are what `python -m bench.runs_list` prints."""
    from agent_jobs.store import listing

    where, reader, indexes = PLANS[name]
    statement = listing.list_runs_query(where, reader=reader, limit=50)
    compiled = statement.compile(postgres.engine, compile_kwargs={"render_postcompile": True})
    with postgres.begin() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        found = conn.exec_driver_sql(f"EXPLAIN {compiled.string}", compiled.params)
        plan = "\n".join(found.scalars())
        conn.rollback()
    used = {index for index in indexes if index in plan}
    assert used == indexes, plan
    assert "Seq Scan" not in plan, plan


def test_the_search_has_its_trigram_index_where_pg_trgm_is(postgres: Store) -> None:
    with postgres.connect() as conn:
        found = conn.execute(
            select(text("indexdef"))
            .select_from(text("pg_indexes"))
            .where(text("indexname = :name")),
            {"name": SEARCH_INDEX},
        ).scalar()
    assert found is not None and "gin_trgm_ops" in found and "USING gin" in found


def test_the_trees_of_a_page_are_read_at_once(trees: Store) -> None:
    """Who started each tree and the action calls made in it: what deciding who may read
    the runs of a page needs (a read tool's call is no decision; a root nobody has, none)."""
    found = trees.trees(["refunded", "looked-up", "shipped", "mine", "refunded", "gone"])
    assert found.owners == {
        "refunded": "other",
        "looked-up": "other",
        "shipped": "other",
        "mine": "me",
    }
    names = {root: [(c["run_id"], c["name"]) for c in calls] for root, calls in found.calls.items()}
    assert names == {
        "refunded": [("refunded-child", "refund")],
        "looked-up": [],
        "shipped": [("shipped", "ship")],
        "mine": [],
        "gone": [],
    }
    [refund] = found.calls["refunded"]
    assert refund["kind"] == "action" and not refund["escalated"] and refund["approvers"] is None
    assert trees.trees([]) == Trees({}, {})


@pytest.fixture
def sealing() -> Iterator[None]:
    """This process seals with the suite's master key; as before afterwards."""
    before, ring = Codecs.installed, keyring()
    encryption.configure(test_encryption.KEYS_JSON, test_encryption.KEY_ID, settings=False)
    yield
    Codecs.installed = before
    encryption.set_keyring(ring)


def test_a_sealed_run_is_found_by_its_id_and_by_no_piece_of_its_ciphertext(
    store: Store, sealing: None
) -> None:
    add(store, Run("s1", 1, input="Where is my order?"), Run("s2", 2, actor="v"))
    with store.connect() as conn:
        stored = conn.execute(text("SELECT input FROM runs WHERE id = 's1'")).scalar_one()
        key_id = conn.execute(text("SELECT id FROM data_keys WHERE actor = 'u'")).scalar()
    assert stored.startswith("$enc$") and key_id is not None
    assert ids(store.runs_page(RunFilter(q="s1"))) == ["s1"]
    for q in ("order", "enc", "$", key_id, stored[-12:], "s"):
        assert ids(store.runs_page(RunFilter(q=q))) == [], q
