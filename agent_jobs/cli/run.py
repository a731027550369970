"""`agent-jobs run`: start a run and follow it to the end, answering approvals and
questions here."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import click

from ..admission import IfBusy
from ..app import AgentApp
from ..store import Store
from ..streams.base import Frame
from .common import (
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_WAITING,
    REDIS_ERRORS,
    agent_named,
    durable_client,
    err,
    fail,
    handle_errors,
    inline_runner,
    out,
    print_json,
    redis_streams,
    settings,
    unreachable,
)
from .enqueue import IF_BUSY
from .frames import Screen, follow
from .inspect import run_document
from .prompt import (
    NoTerminal,
    Terminal,
    may_decide,
    show_call,
    show_questions,
    tell_how_to_answer,
    tell_how_to_decide,
)
from .tail import live_frames
from .text import visible
from .waiting import StoredCall, StoredQuestion, Waiting, stored_call, stored_question

DEFAULT_DECIDER = "cli"  # the --actor default of `approve` and `reject`


@click.command()
@click.argument("text")
@click.option("--agent", help="The agent to run (default: the app's only one, or support).")
@click.option("--actor", default="cli", show_default=True, help="Who asks (roles, quota).")
@click.option("--approver", help="Who decides at the prompt (default: the actor).")
@click.option("--thread", "thread_id", help="Continue this thread.")
@click.option("--persona", help="Run under this persona.")
@click.option("--run-id", help="Idempotency key: the same id twice starts one run.")
@IF_BUSY
@click.option("--yes", "-y", "approve_all", is_flag=True, help="Approve every action.")
@click.option("--json", "as_json", is_flag=True, help="Print the finished run as JSON.")
@handle_errors
def run(
    text: str,
    agent: str | None,
    actor: str,
    approver: str | None,
    thread_id: str | None,
    persona: str | None,
    run_id: str | None,
    if_busy: IfBusy,
    approve_all: bool,
    as_json: bool,
) -> None:
    """Start a run of AGENT on TEXT and follow it: tokens, tool calls, approvals, answer.

    With AGENT_JOBS_BROKER_URL set the run goes to the workers (the durable runner) and
    this command follows its live stream in Redis; otherwise it runs in this process.

    With no terminal to ask on (stdin at its end), a decision the run needs is printed
    with the command that makes it. The durable runner then exits 4 and the run waits;
    in this process the run waits for that command from elsewhere.
    """
    config = settings()
    request = RunArgs(agent, text, actor, approver or actor, thread_id, persona, run_id, if_busy)
    if config.durable:
        code = _run_durable(request, approve_all, as_json)
    else:
        code = _run_inline(request, approve_all, as_json)
    if code:
        sys.exit(code)


@dataclass(frozen=True)
class RunArgs:
    agent: str | None  # None: the app's only agent, or support (`agent_named`)
    text: str
    actor: str
    decider: str
    thread_id: str | None
    persona: str | None
    run_id: str | None
    if_busy: IfBusy = "enqueue"


Verdict = tuple[Literal["approve", "reject"], str | None]


class _Asker:
    """Asks at the terminal about what the followed run waits for, as the store has it.

    With no terminal, it says how to decide elsewhere; when `parks` (the durable
    runner), it raises `NoTerminal` instead, for the command to exit.
    """

    def __init__(
        self,
        db: Store,
        root_run_id: str,
        args: RunArgs,
        *,
        approve_all: bool,
        parks: bool,
        quiet: bool,
        app: AgentApp,
    ) -> None:
        self.app = app
        self.waiting = Waiting(db, root_run_id)
        self.terminal = Terminal()
        self.args = args
        self.approve_all = approve_all
        self.parks = parks
        self.quiet = quiet

    @property
    def decider(self) -> str | None:
        """The --actor the printed commands need (none for the default one)."""
        return None if self.args.decider == DEFAULT_DECIDER else self.args.decider

    def verdict(self, frame: Frame) -> tuple[StoredCall, Verdict] | None:
        call = self.waiting.call(frame)
        if call is None:
            return None
        if not call.waiting:
            self.note(f"{call.call_id} of run {call.run_id} was already decided")
            return None
        if self.approve_all:  # asked for: refused if the decider may not (exit 2)
            return call, ("approve", None)
        if not may_decide(self.app, call, self.args.decider):
            # Nobody is asked who cannot decide: say who can, and follow the run on.
            tell_how_to_decide(call, self.decider, self.app)
            err.print(
                visible(
                    f"{self.args.decider} may not decide it: following run {call.run_id} "
                    "until someone who may does"
                )
            )
            return None
        show_call(call)
        try:
            approved = self.terminal.confirm("approve?")
        except NoTerminal:
            if self.parks:
                raise
            tell_how_to_decide(call, self.decider, self.app)
            return None
        return call, ("approve", None) if approved else ("reject", "rejected at the terminal")

    def answers(self, frame: Frame) -> tuple[StoredQuestion, dict[str, Any]] | None:
        question = self.waiting.question(frame)
        if question is None:
            return None
        if question.answered:
            self.note(f"request {question.request_id} of run {question.run_id} was answered")
            return None
        show_questions(question)
        try:
            given = {qid: self.terminal.text(visible(text)) for qid, text in question.questions}
        except NoTerminal:
            if self.parks:
                raise
            tell_how_to_answer(question)
            return None
        return question, given

    def note(self, text: str) -> None:
        if not self.quiet:
            out.print(visible(text), style="dim")


def _handlers(
    asker: _Asker,
    args: RunArgs,
    decide: Callable[..., bool],
    answer: Callable[..., bool],
) -> tuple[Callable[[Frame], None], Callable[[Frame], None]]:
    """What to do with an approval request and a question, given the runner's own
    `decide` (`signal` inline) and `answer`: the stored call, bound to its arguments."""

    def on_approval(frame: Frame) -> None:
        found = asker.verdict(frame)
        if found is None:
            return
        call, (decision, reason) = found
        recorded = decide(
            call.run_id,
            call.call_id,
            decision,
            actor=args.decider,
            reason=reason,
            args_sha256=call.args_sha256,
        )
        if not recorded:
            asker.note(f"{call.call_id} was already decided elsewhere")

    def on_question(frame: Frame) -> None:
        found = asker.answers(frame)
        if found is None:
            return
        question, given = found
        if not answer(question.run_id, question.request_id, given, actor=args.actor):
            asker.note(f"{question.request_id} was already answered elsewhere")

    return on_approval, on_question


def _run_inline(args: RunArgs, approve_all: bool, as_json: bool) -> int:
    """Run the turn in this process; a decision made elsewhere (`agent-jobs approve`)
    reaches it through the database."""
    runner = inline_runner()
    agent = agent_named(args.agent, runner.app)  # once the database answered
    args = replace(args, agent=agent)
    run_id = runner.start(
        agent,
        args.text,
        actor=args.actor,
        thread_id=args.thread_id,
        run_id=args.run_id,
        persona=args.persona,
        if_busy=args.if_busy,
    )
    root = _tell_if_queued(runner.store, run_id)
    asker = _Asker(
        runner.store,
        root,
        args,
        approve_all=approve_all,
        parks=False,
        quiet=as_json,
        app=runner.app,
    )
    on_approval, on_question = _handlers(asker, args, runner.signal, runner.answer)
    follow(runner.frames(run_id), on_approval, on_question, quiet=as_json)
    view = runner.wait(run_id)
    if as_json:
        print_json(run_document(runner.store, view))
    return 0 if view.status == "completed" else EXIT_FAILED


def _run_durable(args: RunArgs, approve_all: bool, as_json: bool) -> int:
    """Enqueue, then follow the run's Redis stream and answer approvals at the prompt."""
    client = durable_client()
    agent = agent_named(args.agent, client.app)  # once the database answered
    args = replace(args, agent=agent)
    run_id = client.enqueue_run(
        agent,
        args.text,
        actor=args.actor,
        thread_id=args.thread_id,
        run_id=args.run_id,
        persona=args.persona,
        if_busy=args.if_busy,
    )
    root = _tell_if_queued(client.store, run_id)
    asker = _Asker(
        client.store,
        root,
        args,
        approve_all=approve_all,
        parks=True,
        quiet=as_json,
        app=client.app,
    )
    on_approval, on_question = _handlers(asker, args, client.decide, client.answer)
    streams = redis_streams()
    try:
        screen = Screen()
        live = live_frames(streams, client.store, run_id, before_warning=screen.aside)
        frames = (frame for _, frame in live)
        follow(frames, on_approval, on_question, quiet=as_json, screen=screen)
    except NoTerminal:
        _tell_what_waits(client.store, root, asker.decider, client.app)
        if as_json:
            print_json(run_document(client.store, client.get_run(run_id)))
        return EXIT_WAITING
    except KeyboardInterrupt:
        err.print(f"\nstopped following; the run goes on: agent-jobs tail {run_id}")
        return 130
    except REDIS_ERRORS as exc:
        fail(
            f"cannot follow run {run_id}: {unreachable(exc)}; the run is recorded and goes "
            f"on: agent-jobs status {run_id}",
            EXIT_UNAVAILABLE,
        )
    finally:
        streams.client.close()
    view = client.wait(run_id, timeout=10)
    if as_json:
        print_json(run_document(client.store, view))
    return 0 if view.status == "completed" else EXIT_FAILED


def _tell_if_queued(db: Store, run_id: str) -> str:
    """Say so when the run must wait for its place (its thread's turn, its key's places)
    before it begins; the run's root run id."""
    view = db.get_run(run_id)
    if view.status == "queued" and view.waiting_on:
        err.print(
            visible(
                f"run {run_id} is queued ({view.waiting_on}); it begins when that ends "
                f"(agent-jobs cancel {run_id} stops it)"
            )
        )
    return view.root_run_id


def _tell_what_waits(db: Store, root_run_id: str, decider: str | None, app: AgentApp) -> None:
    """Every decision and answer the run (and the runs it delegated to) waits for, each
    with the command that gives it, as one who may."""
    for run_id in db.run_tree(root_run_id):
        for row in db.pending_calls(run_id):
            tell_how_to_decide(stored_call(row), decider, app)
        for row in db.open_questions(run_id):
            tell_how_to_answer(stored_question(row))
