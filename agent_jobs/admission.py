"""Flow control: when a run may begin its turn (docs/operating.md, "Flow control: concurrency per
key, busy threads").

Two things hold a top-level run `queued`:

- its thread's turn. A thread runs one turn at a time: a run asked for on a thread whose
  turn has not ended waits for it (`if_busy="enqueue"`, the default), is refused
  (`"reject"`), or cancels it as a user would and runs once it has stopped
  (`"interrupt"`). Runs waiting for a thread begin in arrival order.
- its agent's concurrency key. With `app.agent(..., concurrency_key=…,
  max_concurrent=N)`, at most N runs of the agent with one key have begun and not ended;
  the others begin in arrival order as those end, across every worker.

A run's key is computed once, when the run is written (`place`), and stored with it. The
check that lets a queued run begin (`enter`) and the look for who comes next when a run
ends (`release`, in the transaction that records the end) read Postgres under the locks
that serialise them (store/places.py): two workers never both start the run one place is
left for, and an end either sees the run that waits or is seen by it. Whatever wake-up is
lost (the broker's), the sweep re-drives the first queued run of a thread or key, and that
run, once it begins, wakes those of its key that may begin too.

Delegated runs belong to their parent's turn: a key holds none of them back, and none
counts against a key (a parent waiting on a child its own key held would never end).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection

from . import session
from .errors import ConfigurationError, ThreadBusyError
from .store import RunView, places
from .store import runs as run_rows

if TYPE_CHECKING:
    from .app import AgentApp
    from .runs import RunRequest

IfBusy = Literal["enqueue", "reject", "interrupt"]
KeyFunction = Callable[["RunRequest"], "str | None"]
KEY_KINDS = ("actor", "thread")
MAX_KEY = 300  # the width of `runs.concurrency_key`


@dataclass(frozen=True)
class Concurrency:
    """An agent's limit: at most `limit` of its runs with one key have begun and not
    ended. `key` is "actor", "thread", or a function of the run request."""

    key: str | KeyFunction
    limit: int

    def key_of(self, request: RunRequest, thread_id: str) -> str | None:
        """The key of a new run (None: a key function's run that nothing holds back)."""
        if self.key == "actor":
            return request.actor
        if self.key == "thread":
            return thread_id
        assert callable(self.key)
        try:
            found = self.key(request.model_copy(update={"thread_id": thread_id}))
        except Exception as exc:
            raise ConfigurationError(
                f"agent {request.agent!r}: its concurrency_key function failed: {exc}"
            ) from exc
        if found is None:
            return None
        if not isinstance(found, str) or not 1 <= len(found) <= MAX_KEY:
            raise ConfigurationError(
                f"agent {request.agent!r}: a concurrency_key function must return a string "
                f"of 1 to {MAX_KEY} characters or None, not {found!r:.80}"
            )
        return found


def concurrency(
    agent: str, key: str | KeyFunction | None, max_concurrent: int | None
) -> Concurrency | None:
    """An agent's `concurrency_key` and `max_concurrent`, checked: both or neither."""
    if key is None and max_concurrent is None:
        return None
    if key is None:
        raise ConfigurationError(
            f"agent {agent!r}: max_concurrent needs a concurrency_key ('actor', 'thread' or "
            "a function of the run request)"
        )
    if not (callable(key) or key in KEY_KINDS):
        raise ConfigurationError(
            f"agent {agent!r}: concurrency_key must be 'actor', 'thread' or a function of "
            f"the run request, not {key!r}"
        )
    if max_concurrent is None:
        raise ConfigurationError(
            f"agent {agent!r}: a concurrency_key needs max_concurrent, how many runs of one "
            "key may run at once"
        )
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
        raise ConfigurationError(f"agent {agent!r}: max_concurrent must be an integer")
    if max_concurrent < 1:
        raise ConfigurationError(f"agent {agent!r}: max_concurrent must be at least 1")
    return Concurrency(key, max_concurrent)


def concurrency_of(app: AgentApp | None, agent: str) -> Concurrency | None:
    """The agent's limit as the app defines it now (None: no limit, or no such agent)."""
    spec = app.agents.get(agent) if app is not None else None
    return spec.concurrency if spec is not None else None


# --- a new run --------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a new run stands as it is written."""

    key: str | None = None  # its concurrency key
    waiting_on: str | None = None  # set: it waits for its thread's turn to end

    @property
    def held(self) -> bool:
        """Whether the run must pass `enter` before its turn begins (it is written queued)."""
        return self.key is not None or self.waiting_on is not None


def place(
    conn: Connection,
    app: AgentApp | None,
    request: RunRequest,
    *,
    run_id: str,
    thread_id: str,
    fresh: bool,
) -> Place | None:
    """Where a new top-level run stands: its key, and whether it waits for its thread's
    turn (decided under the thread's lock, unless the thread is `fresh`, made just now).
    None: a run with this id exists already, and nothing is decided again.

    On a busy thread, `if_busy="reject"` raises `ThreadBusyError` (the caller's
    transaction then records nothing).
    """
    spec = concurrency_of(app, request.agent)
    key = spec.key_of(request, thread_id) if spec is not None else None
    if fresh:
        return Place(key)
    busy = _live(places.thread_runs(conn, thread_id))
    if not busy:
        return Place(key)
    if run_rows.get_run(conn, run_id) is not None:
        return None
    turn = next((row for row in busy if row.status != "queued"), busy[0]).id
    if request.if_busy == "reject":
        raise ThreadBusyError(thread_id, turn)
    return Place(key, waiting_on=f"thread {thread_id} busy: run {turn}")


def interrupt(conn: Connection, request: RunRequest, run_id: str) -> list[str]:
    """`if_busy="interrupt"`: ask every unfinished run of the request's thread to stop, as
    a user's cancel (with their children), before the run is written behind them; returns
    the runs asked, none when the run exists already (a request sent again)."""
    if run_rows.get_run(conn, run_id) is not None:
        return []
    # Every run's row is locked before the thread's, as a pass and a queued run's entry
    # take them (the cancels' events take the thread's): the thread's lock comes after.
    rows = places.thread_runs(conn, request.thread_id or run_id, lock=False)
    return session.request_cancels(conn, [row.id for row in rows], "user")


# --- a queued run begins ----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """Whether a queued run may begin its turn now; if not, why it waits."""

    admitted: bool
    waiting_on: str | None = None
    woken: tuple[str, ...] = ()  # queued runs of its key that may begin now too

    def __bool__(self) -> bool:
        return self.admitted

    @property
    def outcome(self) -> str:
        """What the pass that held the run says (Flower's result)."""
        return f"queued: {self.waiting_on}"


def enter(conn: Connection, app: AgentApp, run: RunView) -> Entry:
    """Whether a queued run may begin its turn now: its thread's turn ended and none
    queued before it, a place of its key free and none of the key queued before it. The
    caller holds the run's lock; the thread's and the key's are taken here. A run that
    may not stays queued, its `waiting_on` saying why.

    A run with no `waiting_on` was written on a thread with no turn (`place`), so only
    its key is looked at; one that waited once looks at its thread each time.
    """
    if run.parent_run_id is not None:
        return Entry(True)
    waited = run.waiting_on is not None
    if waited:
        before = _thread_blocker(run, places.thread_runs(conn, run.thread_id))
        if before is not None:
            return _hold(conn, run, f"thread {run.thread_id} busy: run {before}")
    spec = concurrency_of(app, run.agent)
    if run.concurrency_key is None or spec is None:
        return Entry(True)
    # The thread's lock before the key's, always (a turn's end takes them in that order).
    running, queued = places.key_places(
        conn,
        run.agent,
        run.concurrency_key,
        spec.limit,
        thread_id=None if waited else run.thread_id,
    )
    free = spec.limit - running
    first = places.ids(queued)[: max(free, 0)]
    if run.run_id not in first:
        label = f"concurrency {run.agent}/{run.concurrency_key}: {running} of {spec.limit} running"
        return _hold(conn, run, label if free <= 0 else f"{label}, earlier runs first")
    after = queued[first.index(run.run_id) + 1 : free]
    return Entry(True, woken=tuple(row.id for row in after if row.runner == run.runner))


def _thread_blocker(run: RunView, rows: Sequence[Any]) -> str | None:
    """The run of the thread this one waits for, if any: one whose turn began, or one
    still queued that goes first (queued before it, or not yet looked at: such a run was
    written when the thread had no turn, so before every run that waits)."""
    for row in rows:
        if row.id == run.run_id:
            continue
        if row.status != "queued":
            return str(row.id)
        if row.cancel_cause is None and (row.waiting_on is None or places.ahead(row, run)):
            return str(row.id)
    return None


def _hold(conn: Connection, run: RunView, waiting_on: str) -> Entry:
    if waiting_on != run.waiting_on:
        run_rows.note_status(conn, run.run_id, "queued", waiting_on=waiting_on)
    return Entry(False, waiting_on)


# --- a run ends -------------------------------------------------------------------------


@dataclass(frozen=True)
class Released:
    """What a run's end leaves to others."""

    woken: tuple[str, ...] = ()  # queued runs that may begin now
    thread_waits: bool = False  # runs wait for the thread: they go before its next turn


def release(conn: Connection, app: AgentApp, run: RunView) -> Released:
    """Who may begin now that `run` has ended (recorded in `conn`): the first run queued on
    its thread, and the first runs queued on its key for the places free. Only runs of
    the run's own runner are woken (no other is driven where this one was)."""
    woken: list[str] = []
    waits = False
    if run.parent_run_id is None:
        live = [
            row for row in _live(places.thread_runs(conn, run.thread_id)) if row.id != run.run_id
        ]
        waits = bool(live)
        if live and all(row.status == "queued" for row in live):
            head = next((row for row in live if row.waiting_on is None), live[0])
            woken += [head.id] if head.runner == run.runner else []
    spec = concurrency_of(app, run.agent)
    if run.concurrency_key is not None and spec is not None:
        running, queued = places.key_places(conn, run.agent, run.concurrency_key, spec.limit)
        woken += [row.id for row in queued[: spec.limit - running] if row.runner == run.runner]
    return Released(tuple(dict.fromkeys(woken)), waits)


def _live(rows: Sequence[Any]) -> list[Any]:
    """Runs that hold or will take the thread's turn (a queued run cancelled never will)."""
    return [row for row in rows if row.status != "queued" or row.cancel_cause is None]
