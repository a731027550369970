"""Following a run's live stream to its end, the run's row saying when that is.

`agent-jobs tail`, `agent-jobs run` and the HTTP API's event stream read through here.
Frames are untrusted (anyone who can write to Redis can add one): an end frame ends the
reading only when the run's row in the store has ended the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from ..store import Store
from .base import END_TYPES, Frame, StreamBackend

# How long the stream may stay quiet before the run's row is checked for its end.
IDLE_CHECK = 2.0
# Once the row says the run has ended: how long to wait for the frames still to come.
SETTLE = 0.5
# With a `stop` to watch: the longest a read waits before looking at it.
WAKE = 0.25

# Told of each frame that is skipped: (entry id, why).
Ignored = Callable[[str, str], None]


def live_frames(
    streams: StreamBackend,
    db: Store,
    run_id: str,
    after: str | None = None,
    *,
    on_ignored: Ignored | None = None,
    stop: threading.Event | None = None,
    wake: float = WAKE,
) -> Iterator[tuple[str, Frame]]:
    """(entry id, frame) of the run's stream after `after`, live, until the run ends.

    The store says when the run has ended, not the stream. An end frame counts only when
    the run's row has ended the same way; any other is skipped (`on_ignored` is told).
    Should the end frame never come (the stream expired, or Redis lost it), the row
    alone ends the reading a moment later. With `stop`, reads wait at most `wake`
    seconds at a time, and the reading ends at the first look after `stop` is set: a
    reader that went away is let go of within `wake` seconds. The row is looked at
    after `IDLE_CHECK` quiet seconds either way.
    """
    last = after
    ended = False
    quiet_for = 0.0
    while stop is None or not stop.is_set():
        wait = SETTLE if ended else IDLE_CHECK
        block = wait if stop is None else min(wait, wake)
        quiet = True
        for entry_id, frame in streams.read(run_id, last, block=block):
            last, quiet = entry_id, False
            if not isinstance(frame, dict):
                _ignore(on_ignored, entry_id, "it is not a JSON object")
                break  # the reader would stumble on it: read on after it afresh
            if frame.get("type") in END_TYPES and frame.get("run_id") == run_id:
                if is_the_end(db, run_id, frame):
                    yield entry_id, frame
                    return
                why = f"run {run_id} has not ended as its {frame.get('type')} says"
                _ignore(on_ignored, entry_id, why)
                continue
            yield entry_id, frame
        # A read returns after `block` quiet seconds (or at an end frame): the stream has
        # been quiet that long, and longer if the reads before were quiet too.
        quiet_for = quiet_for + block if quiet else block
        if quiet_for < wait:
            continue  # short reads, to look at `stop` between them: read on
        quiet_for = 0.0
        if ended and quiet:
            return
        if not ended:
            # The end frame is written just after the commit: once the row says the run
            # has ended, what is left of the stream gets a moment to arrive.
            run = db.find_run(run_id)
            ended = run is None or run.finished


def _ignore(on_ignored: Ignored | None, entry_id: str, why: str) -> None:
    if on_ignored is not None:
        on_ignored(entry_id, why)


def is_the_end(db: Store, run_id: str, frame: Frame) -> bool:
    """Whether the run's row ended as this end frame says."""
    run = db.find_run(run_id)
    if run is None:
        return True  # no row to wait on
    if not run.finished:
        return False
    if frame.get("type") == "done":
        return run.status == "completed" and frame.get("output") == run.output
    return run.status != "completed" and frame.get("error") == run.error
