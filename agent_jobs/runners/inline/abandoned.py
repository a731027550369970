"""Inline runs whose process is gone.

The inline runner drives a run on a thread of the process that started it, and nothing
else can: a run left unfinished when that process exited (an `agent-jobs run` killed
while it waited for an approval) would keep its conversation thread busy, and its
concurrency key's place taken, for good. So each inline run records the process that
drives it (`runs.driver`: host, pid and the process's start time, so that a reused pid
is not taken for it), and a process that meets such a run in its way — a run asked for
on its thread, a queued run waiting for its thread or its key, a cancel — ends it:
`cancelled` if a cancel was asked for, else `failed` with `RunAbandonedError`. Its
delegated runs end with it. Nothing of it runs again (the inline runner keeps no
durable position to resume from; that is the durable runner's part).

Only a process on the same host can tell that another is gone: a run driven from
another host is never ended here.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, and_, or_, select

from ...app import AgentApp
from ...errors import RunAbandonedError
from ...executor import StepEnv
from ...processes import describe, gone
from ...store import RunView, Store
from ...store import runs as run_rows
from ...store.schema import runs
from ...streams.base import MemoryStreams, RunStream
from ..turn import Ending, announce_end, finish_turn


def in_the_way(
    conn: Connection,
    *,
    thread_id: str | None,
    agent: str | None = None,
    key: str | None = None,
    but: str | None = None,
) -> list[str]:
    """The unfinished inline runs that a run on `thread_id`, or of `agent` and `key`,
    may wait for: the thread's top-level runs, the key's runs that have begun."""
    places = []
    if thread_id is not None:
        places.append(and_(runs.c.thread_id == thread_id, runs.c.parent_run_id.is_(None)))
    if agent is not None and key is not None:
        places.append(
            and_(runs.c.agent == agent, runs.c.concurrency_key == key, runs.c.status != "queued")
        )
    if not places:
        return []
    query = select(runs.c.id).where(or_(*places), *_DRIVEN)
    if but is not None:
        query = query.where(runs.c.id != but)
    return list(conn.execute(query).scalars())


# An unfinished inline run with a driver recorded.
_DRIVEN = (
    runs.c.runner == "inline",
    runs.c.driver.is_not(None),
    runs.c.status.not_in(run_rows.TERMINAL),
)


def end_in_the_way(
    store: Store,
    app: AgentApp,
    *,
    thread_id: str | None,
    agent: str | None = None,
    key: str | None = None,
    but: str | None = None,
    streams: MemoryStreams | None = None,
) -> list[str]:
    """End the abandoned runs in the way of a run on `thread_id` (or of `agent` and
    `key`), with their delegated runs; returns the ids ended."""
    with store.connect() as conn:
        found = in_the_way(conn, thread_id=thread_id, agent=agent, key=key, but=but)
    return end(store, app, found, streams=streams) if found else []


def end(
    store: Store,
    app: AgentApp,
    run_ids: Sequence[str],
    *,
    streams: MemoryStreams | None = None,
) -> list[str]:
    """End each of these runs, with its delegated runs, that is an unfinished inline run
    whose driver is gone; returns the ids ended, delegated runs first."""
    with store.connect() as conn:
        query = select(runs.c.id, runs.c.driver).where(runs.c.id.in_(list(run_ids)), *_DRIVEN)
        dead = [row.id for row in conn.execute(query) if gone(row.driver)]
        tree: list[str] = []
        for run_id in dead:
            tree += [t for t in run_rows.run_tree_ids(conn, run_id) if t not in tree]
    ended: list[str] = []
    for target in reversed(tree):  # the delegated runs first: their parent waits on them
        if _end_one(store, app, target, streams or MemoryStreams()):
            ended.append(target)
    return ended


def _end_one(store: Store, app: AgentApp, run_id: str, streams: MemoryStreams) -> bool:
    with store.begin() as conn:
        row = run_rows.lock_run(conn, run_id)
        if row is None or row.status in run_rows.TERMINAL or row.runner != "inline":
            return False
        if not gone(row.driver):
            return False
        run = RunView.from_row(row)
        stream = RunStream(streams, run.root_run_id, run.run_id)
        env = StepEnv(app=app, stream=stream)
        if run.cancel_cause is not None:
            ending = Ending.cancelled(run.cancel_cause, run.cancel_keep_inbox)
        else:
            ending = Ending.failed(RunAbandonedError(run.run_id, describe(row.driver)))
        # A queued run this lets begin is begun by the process that waits with it.
        finish_turn(conn, env, app, run, ending)
    env.flush()
    announce_end(stream, ending)
    return True
