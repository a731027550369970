"""`agent-jobs tail`: follow a durable run's live stream, resumable from an entry id."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import click

from ..store import Store
from ..streams.base import END_TYPES, Frame
from ..streams.redis_streams import RedisStreams
from .common import EXIT_FAILED, err, fail, handle_errors, out, redis_streams, store
from .frames import Screen, follow
from .prompt import command, decide_commands
from .text import json_text, visible
from .waiting import Waiting

# How long the stream may stay quiet before the run's row is checked for its end.
IDLE_CHECK = 2.0
# Once the row says the run has ended: how long to wait for the frames still to come.
SETTLE = 0.5


def live_frames(
    streams: RedisStreams,
    db: Store,
    run_id: str,
    after: str | None = None,
    *,
    before_warning: Callable[[], None] | None = None,
) -> Iterator[tuple[str, Frame]]:
    """(entry id, frame) of the run's stream after `after`, live, until the run ends.

    The store says when the run has ended, not the stream: anyone who can write to Redis
    can add a `done` frame. An end frame counts only when the run's row has ended the
    same way; any other is skipped with a warning. Should the end frame never come (the
    stream expired, or Redis lost it), the row alone ends the stream a moment later.
    `before_warning` is called before a warning goes to stderr (see `Screen.aside`).
    """
    last = after
    ended = False
    while True:
        quiet = True
        for entry_id, frame in streams.read(run_id, last, block=SETTLE if ended else IDLE_CHECK):
            last, quiet = entry_id, False
            if not isinstance(frame, dict):
                _ignored(entry_id, "it is not a JSON object", before_warning)
                break  # the reader would stumble on it: read on after it afresh
            if frame.get("type") in END_TYPES and frame.get("run_id") == run_id:
                if _is_the_end(db, run_id, frame):
                    yield entry_id, frame
                    return
                why = f"run {run_id} has not ended as its {frame.get('type')} says"
                _ignored(entry_id, why, before_warning)
                continue
            yield entry_id, frame
        if ended and quiet:
            return
        if not ended:
            # The end frame is written just after the commit: once the row says the run
            # has ended, what is left of the stream gets a moment to arrive.
            run = db.find_run(run_id)
            ended = run is None or run.finished


def _ignored(entry_id: str, why: str, before: Callable[[], None] | None) -> None:
    if before is not None:
        before()
    err.print(visible(f"warning: ignored the frame {entry_id}: {why}"), style="yellow")


def _is_the_end(db: Store, run_id: str, frame: Frame) -> bool:
    """Whether the run's row ended as this end frame says."""
    run = db.find_run(run_id)
    if run is None:
        return True  # no row to wait on
    if not run.finished:
        return False
    if frame.get("type") == "done":
        return run.status == "completed" and frame.get("output") == run.output
    return run.status != "completed" and frame.get("error") == run.error


def exit_code(db: Store, run_id: str) -> int:
    """0 when the run's row says it completed, else 1."""
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
    try:
        if as_json:
            for entry_id, frame in live_frames(streams, db, run.root_run_id, after):
                click.echo(json.dumps({"id": entry_id, "frame": frame}, ensure_ascii=False))
                sys.stdout.flush()
        else:
            screen = Screen()
            live = live_frames(streams, db, run.root_run_id, after, before_warning=screen.aside)
            pointer = _Pointer(Waiting(db, run.root_run_id))
            frames = (frame for _, frame in live)
            follow(frames, pointer.to_approve, pointer.to_answer, quiet=False, screen=screen)
    finally:
        streams.client.close()
    sys.exit(exit_code(db, run.root_run_id))


class _Pointer:
    """Says how to decide what the run waits for, as the store has it."""

    def __init__(self, waiting: Waiting) -> None:
        self.waiting = waiting

    def to_approve(self, frame: Frame) -> None:
        call = self.waiting.call(frame)
        if call is None:
            return
        approve, _ = decide_commands(call)
        hint = f"? {call.tool} ({call.call_id}) of run {call.run_id} needs approval: {approve}"
        out.print(visible(hint), style="yellow")
        out.print(f"  arguments: {json_text(call.args)}", style="yellow")
        if call.decision is not None:
            out.print(visible(f"  decided: {call.decision} by {call.decided_by}"), style="dim")

    def to_answer(self, frame: Frame) -> None:
        question = self.waiting.question(frame)
        if question is None:
            return
        asked = "; ".join(f"{text} ({qid})" for qid, text in question.questions)
        answer = command("answer", question.run_id, question.request_id, "ANSWERS")
        hint = f"? {question.tool} asks: {asked} (request {question.request_id}): {answer}"
        out.print(visible(hint), style="yellow")
