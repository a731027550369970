"""`agent-jobs tail`: follow a durable run's live stream, resumable from an entry id."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import click

from ..app import AgentApp
from ..loading import load_app
from ..store import Store
from ..streams.base import Frame
from ..streams.follow import live_frames as follow_stream
from ..streams.redis_streams import RedisStreams
from .common import EXIT_FAILED, err, fail, handle_errors, out, redis_streams, settings, store
from .frames import Screen, follow
from .prompt import command, decide_commands, deciders
from .text import json_text, visible
from .waiting import Waiting


def live_frames(
    streams: RedisStreams,
    db: Store,
    run_id: str,
    after: str | None = None,
    *,
    before_warning: Callable[[], None] | None = None,
) -> Iterator[tuple[str, Frame]]:
    """(entry id, frame) of the run's stream after `after`, live, until the run's row says
    it has ended (`agent_jobs.streams.follow.live_frames`); a frame that is skipped is a
    warning on stderr. `before_warning` is called before a warning goes there (see
    `Screen.aside`)."""

    def ignored(entry_id: str, why: str) -> None:
        _ignored(entry_id, why, before_warning)

    return follow_stream(streams, db, run_id, after, on_ignored=ignored)


def _ignored(entry_id: str, why: str, before: Callable[[], None] | None) -> None:
    if before is not None:
        before()
    err.print(visible(f"warning: ignored the frame {entry_id}: {why}"), style="yellow")


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
            # The app says who may decide (its model is not needed here: not strict).
            pointer = _Pointer(Waiting(db, run.root_run_id), load_app(settings().app))
            frames = (frame for _, frame in live)
            follow(frames, pointer.to_approve, pointer.to_answer, quiet=False, screen=screen)
    finally:
        streams.client.close()
    sys.exit(exit_code(db, run.root_run_id))


class _Pointer:
    """Says how to decide what the run waits for, as the store has it."""

    def __init__(self, waiting: Waiting, app: AgentApp) -> None:
        self.waiting = waiting
        self.app = app

    def to_approve(self, frame: Frame) -> None:
        call = self.waiting.call(frame)
        if call is None:
            return
        approve, _ = decide_commands(call, None, self.app)
        hint = f"? {call.tool} ({call.call_id}) of run {call.run_id} needs approval: {approve}"
        out.print(visible(hint), style="yellow")
        who = deciders(self.app, call).says()
        out.print(visible(f"  who may decide: {who}"), style="yellow")
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
