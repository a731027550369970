"""`agent-jobs tail`: follow a durable run's live stream, resumable from an entry id."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import click
from rich.markup import escape

from ..redis_streams import RedisStreams
from ..store import Store
from ..stream import END_TYPES, Frame
from .common import EXIT_FAILED, fail, handle_errors, out, redis_streams, store
from .frames import follow

# How long the stream may stay quiet before the run's row is checked for its end.
IDLE_CHECK = 2.0


def live_frames(
    streams: RedisStreams, db: Store, run_id: str, after: str | None = None
) -> Iterator[tuple[str, Frame]]:
    """(entry id, frame) of the run's stream after `after`, live, until the run ends.

    The stream ends with the run's `done` or `error` frame. Should that frame never come
    (the stream expired, or Redis lost it), the run's row says when to stop.
    """
    last = after
    while True:
        for entry_id, frame in streams.read(run_id, last, block=IDLE_CHECK):
            last = entry_id
            yield entry_id, frame
            if frame.get("type") in END_TYPES and frame.get("run_id") == run_id:
                return
        run = db.find_run(run_id)
        if run is None or run.finished:
            # The end frame is written just after the commit: give it a moment.
            for entry_id, frame in streams.read(run_id, last, block=0.5):
                last = entry_id
                yield entry_id, frame
            return


def exit_code(db: Store, run_id: str, last: Frame | None) -> int:
    """0 when the run completed, else 1; from the end frame, or else the run's row."""
    if last is not None and last.get("run_id") == run_id and last.get("type") in END_TYPES:
        return 0 if last["type"] == "done" else EXIT_FAILED
    run = db.find_run(run_id)
    return 0 if run is not None and run.status == "completed" else EXIT_FAILED


@click.command()
@click.argument("run_id")
@click.option("--after", "after", help="Resume after this entry id (from an earlier --json).")
@click.option("--json", "as_json", is_flag=True, help='One {"id", "frame"} object a line.')
@handle_errors
def tail(run_id: str, after: str | None, as_json: bool) -> None:
    """Follow a durable run's live stream to its end: tokens, tool calls, approvals.

    Exits 0 when the run completed, 1 when it failed or was cancelled.
    """
    db = store()
    run = db.get_run(run_id)
    if run.runner != "durable":
        fail(
            f"run {run_id} ran on the {run.runner} runner: its stream lived in that process; "
            "`agent-jobs status` shows how it ended"
        )
    streams = redis_streams()
    last: Frame | None = None
    try:
        if as_json:
            for entry_id, frame in live_frames(streams, db, run.root_run_id, after):
                click.echo(json.dumps({"id": entry_id, "frame": frame}, ensure_ascii=False))
                sys.stdout.flush()
                last = frame
        else:

            def frames() -> Iterator[Frame]:
                nonlocal last
                for _, frame in live_frames(streams, db, run.root_run_id, after):
                    last = frame
                    yield frame

            follow(frames(), _point_to_approve, quiet=False)
    finally:
        streams.client.close()
    sys.exit(exit_code(db, run.root_run_id, last))


def _point_to_approve(frame: Frame) -> None:
    hint = (
        f"? {frame['tool']} ({frame['call_id']}) of run {frame['run_id']} needs approval: "
        f"agent-jobs approve {frame['run_id']} {frame['call_id']}"
    )
    out.print(f"[yellow]{escape(hint)}[/yellow]", markup=True)
