"""`agent-jobs run`: start a run and follow it to the end, answering approvals and
questions here."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

import click

from ..runners.inline import InlineRunner
from ..stream import Frame
from .common import (
    EXIT_FAILED,
    app,
    durable_client,
    err,
    handle_errors,
    out,
    print_json,
    redis_streams,
    settings,
    store,
)
from .frames import ask, ask_answers, follow
from .inspect import run_document
from .tail import live_frames

DEFAULT_AGENT = "support"


@click.command()
@click.argument("text")
@click.option("--agent", default=DEFAULT_AGENT, show_default=True, help="The agent to run.")
@click.option("--actor", default="cli", show_default=True, help="Who asks (roles, quota).")
@click.option("--approver", help="Who decides at the prompt (default: the actor).")
@click.option("--thread", "thread_id", help="Continue this thread.")
@click.option("--persona", help="Run under this persona.")
@click.option("--run-id", help="Idempotency key: the same id twice starts one run.")
@click.option("--yes", "-y", "approve_all", is_flag=True, help="Approve every action.")
@click.option("--json", "as_json", is_flag=True, help="Print the finished run as JSON.")
@handle_errors
def run(
    text: str,
    agent: str,
    actor: str,
    approver: str | None,
    thread_id: str | None,
    persona: str | None,
    run_id: str | None,
    approve_all: bool,
    as_json: bool,
) -> None:
    """Start a run of AGENT on TEXT and follow it: tokens, tool calls, approvals, answer.

    With AGENT_JOBS_BROKER_URL set the run goes to the workers (the durable runner) and
    this command follows its live stream in Redis; otherwise it runs in this process.
    """
    config = settings()
    request = RunArgs(agent, text, actor, approver or actor, thread_id, persona, run_id)
    if config.durable:
        code = _run_durable(request, approve_all, as_json)
    else:
        code = _run_inline(request, approve_all, as_json)
    if code:
        sys.exit(code)


@dataclass(frozen=True)
class RunArgs:
    agent: str
    text: str
    actor: str
    decider: str
    thread_id: str | None
    persona: str | None
    run_id: str | None


def _verdict(approve_all: bool, frame: Frame) -> tuple[Literal["approve", "reject"], str | None]:
    if approve_all or ask(frame):
        return "approve", None
    return "reject", "rejected at the terminal"


def _run_inline(args: RunArgs, approve_all: bool, as_json: bool) -> int:
    runner = InlineRunner(app(), store(), settings=settings())
    run_id = runner.start(
        args.agent,
        args.text,
        actor=args.actor,
        thread_id=args.thread_id,
        run_id=args.run_id,
        persona=args.persona,
    )

    def decide(frame: Frame) -> None:
        decision, reason = _verdict(approve_all, frame)
        runner.signal(
            frame["run_id"], frame["call_id"], decision, actor=args.decider, reason=reason
        )

    def answer(frame: Frame) -> None:
        runner.answer(frame["run_id"], frame["request_id"], ask_answers(frame), actor=args.actor)

    follow(runner.frames(run_id), decide, quiet=as_json, answer=answer)
    view = runner.wait(run_id)
    if as_json:
        print_json(run_document(runner.store, view))
    return 0 if view.status == "completed" else EXIT_FAILED


def _run_durable(args: RunArgs, approve_all: bool, as_json: bool) -> int:
    """Enqueue, then follow the run's Redis stream and answer approvals at the prompt."""
    client = durable_client()
    run_id = client.enqueue_run(
        args.agent,
        args.text,
        actor=args.actor,
        thread_id=args.thread_id,
        run_id=args.run_id,
        persona=args.persona,
    )

    def decide(frame: Frame) -> None:
        decision, reason = _verdict(approve_all, frame)
        recorded = client.decide(
            frame["run_id"],
            frame["call_id"],
            decision,
            actor=args.decider,
            reason=reason,
            args_sha256=frame.get("args_sha256"),
        )
        if not recorded and not as_json:
            out.print(f"[dim]{frame['call_id']} was already decided elsewhere[/dim]", markup=True)

    def answer(frame: Frame) -> None:
        client.answer(frame["run_id"], frame["request_id"], ask_answers(frame), actor=args.actor)

    streams = redis_streams()
    try:
        frames = (frame for _, frame in live_frames(streams, client.store, run_id))
        follow(frames, decide, quiet=as_json, answer=answer)
    except KeyboardInterrupt:
        err.print(f"\nstopped following; the run goes on: agent-jobs tail {run_id}")
        return 130
    finally:
        streams.client.close()
    view = client.wait(run_id, timeout=10)
    if as_json:
        print_json(run_document(client.store, view))
    return 0 if view.status == "completed" else EXIT_FAILED
