"""What a process already read of its runs' journals, so a pass reads only what is new.

A row that is `done` or `failed` never changes again: its result was written once (the
first writer wins) and nothing rewrites it. So a process may keep, for each run it
drives, the longest prefix of its journal (positions 1…n, none missing) whose rows are
all final, and a pass reads from the database only the rows after that prefix: the
steps in flight, the ones another process added, the one this pass completes. A run
that moved on in another process is read as far as it got; no version or validation is
needed, since nothing the cache holds can have changed.

Entries are keyed by the run and its creation time (a run id written again, after a
database was emptied, is another run), dropped when the run ends, and the oldest is
evicted beyond `capacity` runs. Beside it, the whole request of the last model step a
pass here scheduled for each run: the next model step's is journaled against it
(store/model_requests.py), and the journal holds it only in part.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...checkpoints import model_prefix
from ...session import INBOX
from ...store import journal as journal_rows
from ...store.journal import ReplayRow

FINAL = frozenset({"done", "failed"})


class JournalCache:
    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        # run id -> (its creation time, its final prefix)
        self._runs: OrderedDict[str, tuple[datetime, list[ReplayRow]]] = OrderedDict()
        self._models: OrderedDict[tuple[str, datetime], tuple[str, Any]] = OrderedDict()

    def last_model(self, run_id: str, created_at: datetime) -> tuple[str, Any] | None:
        """(step, whole intent) of the last model step a pass here scheduled for the run."""
        with self._lock:
            return self._models.get((run_id, created_at))

    def keep_model(self, run_id: str, created_at: datetime, step: str, intent: Any) -> None:
        key = (run_id, created_at)
        with self._lock:
            self._models[key] = (step, intent)
            self._models.move_to_end(key)
            while len(self._models) > self.capacity:
                self._models.popitem(last=False)

    def prefix(self, run_id: str, created_at: datetime) -> list[ReplayRow]:
        """The run's final rows at positions 1…n as known here ([] when none)."""
        known = self.latest(run_id)
        return known[1] if known is not None and known[0] == created_at else []

    def latest(self, run_id: str) -> tuple[datetime, list[ReplayRow]] | None:
        """(creation time, final prefix) of the run id as known here, before its row is
        read (a pass reads the rows after it with the run's; the creation time then
        tells whether it is the same run)."""
        with self._lock:
            known = self._runs.get(run_id)
            if known is None:
                return None
            self._runs.move_to_end(run_id)
            return known[0], list(known[1])

    def keep(
        self,
        run_id: str,
        created_at: datetime,
        rows: Iterable[ReplayRow],
        known: Sequence[ReplayRow] = (),
    ) -> None:
        """Remember the longest final prefix of `known` (a final prefix already: positions
        1…n) and then `rows` (any order; each with `seq` and `state`)."""
        by_seq = {row.seq: row for row in rows}
        final = list(known)
        seq = len(final) + 1
        while (row := by_seq.get(seq)) is not None and row.state in FINAL:
            final.append(row)
            seq += 1
        with self._lock:
            if not final:
                self._runs.pop(run_id, None)
                return
            self._runs[run_id] = (created_at, final)
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.capacity:
                self._runs.popitem(last=False)

    def drop(self, run_id: str, created_at: datetime) -> None:
        with self._lock:
            known = self._runs.get(run_id)
            if known is not None and known[0] == created_at:
                del self._runs[run_id]
            self._models.pop((run_id, created_at), None)


def after(prefix: Sequence[ReplayRow]) -> int:
    """The last position the prefix covers: a pass reads the rows after it."""
    return prefix[-1].seq if prefix else 0


@dataclass(frozen=True)
class Read:
    """What a pass read: the run's row (locked; None for an unknown run), the final
    prefix of its journal this process knew, and the rows read after it."""

    run: Any | None
    known: list[ReplayRow]
    loaded: list[ReplayRow]
    inbox: list[Any] | None = None  # the thread's inbox events, if read with them

    @property
    def rows(self) -> list[ReplayRow]:
        return [*self.known, *self.loaded]


def lock_and_read(cache: JournalCache, conn: Any, run_id: str, completion: Any | None) -> Read:
    """The run's row, locked, and its journal with a step's `completion` written first
    (runners/durable/completion.py), in one round trip: the final rows `cache` knows, and
    from the database only the rows after them."""

    outcome = None if completion is None else {"step": completion.step, **completion.outcome}
    latest = cache.latest(run_id)
    known = latest[1] if latest is not None else []
    # A pass that may reach a step boundary (all but a model step's) reads the thread's
    # inbox with the rest: the boundary then needs no round trip of its own.
    boundary = completion is None or not completion.step.startswith(model_prefix())
    row, rows, inbox = journal_rows.lock_and_load(
        conn, run_id, after=after(known), outcome=outcome, inbox=INBOX if boundary else None
    )
    if row is None:
        return Read(None, [], [])
    if latest is not None and latest[0] != row.created_at:  # another run, the same id
        return Read(row, [], journal_rows.load_for_replay(conn, run_id))
    return Read(row, known, rows, None if inbox is None else list(inbox))
