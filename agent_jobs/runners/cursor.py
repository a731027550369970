"""The journal cursor: which recorded row answers the step the loop asks for now.

Both runners replay a run's journal the same way: the pure loop is driven from its start,
a step the journal holds returns its recorded result, a step it lacks runs. A row records
the step's name and its position (`seq`), and the cursor follows the loop through them:

- Outside a fan-out the loop's next request is the row at the next position, which must
  be the step asked for. Another step there, or the step recorded at another position,
  raises `NonDeterminismError`: the code replaying the run takes another path than the
  code that recorded it, and would go on with results that belong to other steps.
- Retry rows (`retry:<k>:<step>`, `agent-jobs retry`) are written after the journal's last
  row, and read in their failed step's place (`attempt`); the positions step over them.
- A fan-out's rows are found by name: their order says how far each member got, not the
  fan-out's shape. The steps after the fan-out follow its last row.
- A patch question (`hooks.patched`) is answered by the next position too (`patched`).

A step the journal lacks takes the position the cursor stands at: after the journal's
last row, or a hole a fork left (a decision it asks again); in a fan-out, the next free
one. The cursor is shared by the threads of an inline fan-out: it hands each position out
once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .. import checkpoints as names
from ..errors import NonDeterminismError
from ..store.journal import ReplayRow

# A row a runner wrote while driving the loop, as the cursor's later requests see it: in
# the shape of the rows `journal.load_for_replay` reads.
Marker = ReplayRow


@dataclass(frozen=True)
class Slot:
    """Where the step the loop asks for stands: its recorded row, or None for a step the
    journal lacks; and its position, the row's or the one a new row takes."""

    seq: int
    row: ReplayRow | None


class JournalCursor:
    """A replay's place in one run's journal: rows as `journal.load_for_replay` reads
    them (`step`, `seq`, `state`, `result`, `error`)."""

    def __init__(self, rows: Iterable[ReplayRow] = ()) -> None:
        self.by_seq: dict[int, ReplayRow] = {}
        self.by_name: dict[str, ReplayRow] = {}
        self.pos = 0  # the position of the loop's latest request
        self.last = 0  # the highest position recorded or handed out
        self.in_block = False  # inside a fan-out: steps are found by name
        self.block_end = 0  # the last position a fan-out's steps took
        self._lock = threading.Lock()
        self.read(rows)

    def read(self, rows: Iterable[ReplayRow]) -> None:
        """Know `rows`: the journal as loaded, or rows that changed since."""
        for row in rows:
            self.put(row)

    def put(self, row: ReplayRow) -> None:
        """A row at its position and under its name: one written, or as it stands now."""
        with self._lock:
            self.by_seq[row.seq] = self.by_name[row.step] = row
            self.last = max(self.last, row.seq)

    # --- the loop's requests -------------------------------------------------------------

    def take(self, name: str) -> Slot:
        """Step `name`, asked for now: its recorded row, checked against the position it
        is asked at (`NonDeterminismError`); or the position a new row of it takes."""
        with self._lock:
            row = self._in_block(name) if self.in_block else self._in_order(name)
            return Slot(self.pos if row is None else row.seq, row)

    def earlier(self, name: str) -> Slot:
        """Step `name`, asked for again where the journal holds it at an earlier position
        (a decision requested with its turn's other calls, then awaited): its row if
        recorded, found by name; no position is taken (0: none recorded)."""
        row = self.by_name.get(name)
        return Slot(0 if row is None else row.seq, row)

    def _in_order(self, name: str) -> ReplayRow | None:
        """Outside a fan-out: the row at the next position, which must be `name`'s."""
        self._past_retries()
        self.pos += 1
        self.last = max(self.last, self.pos)
        row = self.by_seq.get(self.pos)
        if row is not None:
            if row.step != name:
                raise NonDeterminismError(self.pos, row.step, name)
            return row
        if name in self.by_name:
            raise NonDeterminismError(self.pos, None, name)
        return None

    def _in_block(self, name: str) -> ReplayRow | None:
        """A fan-out member's row, found by its name.

        How far each member got decided the order the members' rows were written in (a
        durable pass stops a member at its first unfinished step and goes on to the next
        member; the inline runner's members run at once), so positions inside a fan-out
        say nothing about its shape; names do, being unique per call. A new row takes the
        next free position.
        """
        row = self.by_name.get(name)
        if row is not None:
            self.block_end = max(self.block_end, row.seq)
            return row
        self.last += 1
        self.pos = self.block_end = self.last
        return None

    def _past_retries(self) -> None:
        """Step over retry rows: the loop reads one in its failed step's place (`attempt`)."""
        while (row := self.by_seq.get(self.pos + 1)) and row.step.startswith(names.RETRY):
            self.pos += 1

    def attempt(self, name: str, row: ReplayRow) -> ReplayRow:
        """A failed step's last retry row (`agent-jobs retry`) if it has one, else `row`."""
        k = 1
        while row.state == "failed" and (again := self.by_name.get(names.retry(name, k))):
            row, k = again, k + 1
        return row

    def done(self, name: str, row: ReplayRow | None) -> ReplayRow | None:
        """The last attempt of step `name`'s recorded `row` if it is done, else None."""
        if row is None:
            return None
        last = self.attempt(name, row)
        return last if last.state == "done" else None

    @contextmanager
    def fan_out(self, start: int | None = None) -> Iterator[None]:
        """Inside, the members' steps are found by name; after it, the steps that follow
        take the positions after its last row. `start`: where it began (the position
        before its first row), for a fan-out driven again."""
        with self._lock:
            self.in_block, self.block_end = True, self.pos if start is None else start
        try:
            yield
        finally:
            with self._lock:
                self.in_block = False
                self.pos = self.block_end

    def patched(self, name: str) -> bool | None:
        """How the journal answers a patch question asked now (`name`: the patch's row):
        True where the run took the patch (its row at the next position, or earlier), False
        where it recorded other history there before the patch existed, None at the
        frontier: the caller takes the patch and records its row at `pos`."""
        with self._lock:
            marker = self.by_name.get(name)
            if marker is not None and marker.seq <= self.pos:
                return True  # the run took the new shape earlier; asking again costs nothing
            self._past_retries()
            row = self.by_seq.get(self.pos + 1)
            if row is not None:
                if row.step == name:
                    self.pos += 1
                    return True
                return False  # the run recorded history here before the patch existed
            # At the frontier nothing recorded depends on the old shape: take the new one.
            self.pos += 1
            self.last = max(self.last, self.pos)
            return None
