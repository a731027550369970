"""`agent-jobs pause`, `resume`, `retry`, `fork`: the operator's controls of a run.

Pause and resume are recorded in the database, where whichever runner drives the run
reads them (a durable run is woken to act on them at once). Retry and fork hand the run
to the workers with `AGENT_JOBS_BROKER_URL` set; without it, this process drives it with
the inline runner and follows it to its end, as `agent-jobs run` does. Each control is
recorded with who asked (`--actor`). Exit codes: 2 when the control does not apply to the
run (it has ended, is not paused, did not fail on a step, a step it cannot fork at), 3
for an unknown run; a run driven here exits 0 when it completes and 1 otherwise.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..client import Client
from ..controls import Forked
from ..runners import InlineRunner
from ..store import RunView
from ..streams.base import Frame
from .common import (
    EXIT_FAILED,
    app,
    handle_errors,
    inline_runner,
    out,
    print_json,
    settings,
    store,
)
from .frames import follow
from .inspect import run_document
from .prompt import tell_how_to_answer, tell_how_to_decide
from .text import visible
from .waiting import Waiting

ACTOR = click.option(
    "--actor",
    default="cli",
    show_default=True,
    help="Who asks: recorded with the control in the run's session log.",
)
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")


def _client() -> Client:
    """A client that records controls, and wakes durable runs when a broker is set."""
    config = settings()
    if config.broker_url:
        return Client.from_settings(config)
    return Client(store(), app(), config)


def _inline() -> InlineRunner | None:
    """The inline runner of this process when there is no broker (it drives the run)."""
    return None if settings().broker_url else inline_runner()


@click.command()
@click.argument("run_id")
@ACTOR
@AS_JSON
@handle_errors
def pause(run_id: str, actor: str, as_json: bool) -> None:
    """Pause a run (and the runs it delegated to) at its next step boundary: it is then
    `paused` and holds no worker until `agent-jobs resume RUN_ID`."""
    asked = _client().pause(run_id, actor=actor)
    if as_json:
        print_json({"pausing": asked})
        return
    out.print(visible(f"pausing {', '.join(asked)} at the next step boundary (by {actor})"))


@click.command()
@click.argument("run_id")
@ACTOR
@AS_JSON
@handle_errors
def resume(run_id: str, actor: str, as_json: bool) -> None:
    """Let a paused run (and the runs it delegated to) go on from where it stopped."""
    resumed = _client().resume(run_id, actor=actor)
    if as_json:
        print_json({"resuming": resumed})
        return
    out.print(visible(f"resuming {', '.join(resumed)} (by {actor})"))


@click.command()
@click.argument("run_id")
@ACTOR
@AS_JSON
@handle_errors
def retry(run_id: str, actor: str, as_json: bool) -> None:
    """Run the failed step of a run that failed on it (a dead letter, a step's error)
    again, with a fresh attempt count; the run's error is cleared and it goes on."""
    runner = _inline()
    retried = (runner or _client()).retry(run_id, actor=actor)
    answer = {"run_id": retried.run_id, "retrying": retried.steps}
    if not as_json:
        again = ", ".join(retried.steps) or "the step it failed on"
        out.print(visible(f"retrying run {run_id}: {again} runs again (by {actor})"))
    _finish(runner, run_id, answer, as_json)


@click.command()
@click.argument("run_id")
@click.option("--at", "step", required=True, help="The step to fork at (agent-jobs journal).")
@click.option(
    "--keep-decisions",
    is_flag=True,
    help="Keep the decisions made before STEP on calls that run again, as your own "
    "(you must be able to make each); without it they are asked again.",
)
@ACTOR
@AS_JSON
@handle_errors
def fork(run_id: str, step: str, keep_decisions: bool, actor: str, as_json: bool) -> None:
    """Fork a run at STEP: a new run on a new thread that reuses the journal before STEP
    and runs on from there. Prints the steps with side effects that will run again and
    the calls a person is asked about again: a fork inherits no decision."""
    runner = _inline()
    forked = (runner or _client()).fork(run_id, step, actor=actor, keep_decisions=keep_decisions)
    if not as_json:
        _tell(forked)
    _finish(runner, forked.run_id, forked.as_json(), as_json)


def _finish(
    runner: InlineRunner | None, run_id: str, answer: dict[str, Any], as_json: bool
) -> None:
    """The workers drive the run: done here. This process drives it (no broker): follow it
    to its end (`--json`: the answer with the run as `status --json` prints it)."""
    if runner is None:
        if as_json:
            print_json(answer)
        return
    view = _drive_here(runner, run_id, quiet=as_json)
    if as_json:
        print_json({**answer, "run": run_document(runner.store, view)})
    elif view.status != "completed":
        out.print(visible(f"run {run_id} {view.status}: {view.error}"))
    if view.status != "completed":
        sys.exit(EXIT_FAILED)


def _tell(forked: Forked) -> None:
    out.print(
        visible(
            f"forked run {forked.source} at {forked.at}: run {forked.run_id} "
            f"on thread {forked.thread_id}"
        )
    )
    if not forked.runs_again:
        out.print("no step with side effects runs again")
    for again in forked.runs_again:
        out.print(visible(f"runs again: {again.step} {again.tool} (call {again.call_id})"))
    for asked in forked.asked_again:
        out.print(visible(f"asked again: {asked.tool} (call {asked.call_id})"))
    for kept in forked.kept_decisions:
        out.print(visible(f"decision kept as yours: {kept.tool} (call {kept.call_id})"))


def _drive_here(runner: InlineRunner, run_id: str, *, quiet: bool) -> RunView:
    """Follow a run this process drives to its end; a decision or answers it waits for
    are given from another shell (printed here)."""
    waiting = Waiting(runner.store, runner.store.get_run(run_id).root_run_id)

    def on_approval(frame: Frame) -> None:
        if (call := waiting.call(frame)) is not None and call.waiting:
            tell_how_to_decide(call, None, runner.app)

    def on_question(frame: Frame) -> None:
        if (asked := waiting.question(frame)) is not None and not asked.answered:
            tell_how_to_answer(asked)

    follow(runner.frames(run_id), on_approval, on_question, quiet=quiet)
    return runner.wait(run_id)


__all__ = ["fork", "pause", "resume", "retry"]
