"""`agent-jobs run`: start a run and follow it to the end, answering approvals here."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click

from ..runners.inline import InlineRunner
from ..stream import Frame
from .common import EXIT_FAILED, app, fail, handle_errors, out, print_json, settings, store
from .inspect import run_document

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
    """Start a run of AGENT on TEXT and follow it: tokens, tool calls, approvals, answer."""
    config = settings()
    if config.durable:
        fail("`run` follows durable runs once the live stream lands; unset AGENT_JOBS_BROKER_URL")
    runner = InlineRunner(app(), store(), settings=config)
    run_id = runner.start(
        agent, text, actor=actor, thread_id=thread_id, run_id=run_id, persona=persona
    )
    decider = approver or actor

    def decide(frame: Frame) -> None:
        approved = approve_all or _ask(frame)
        runner.signal(
            frame["run_id"],
            frame["call_id"],
            "approve" if approved else "reject",
            actor=decider,
            reason=None if approved else "rejected at the terminal",
        )

    follow(runner.frames(run_id), decide, quiet=as_json)
    view = runner.wait(run_id)
    if as_json:
        print_json(run_document(runner.store, view))
    if view.status != "completed":
        sys.exit(EXIT_FAILED)


def follow(frames: Iterable[Frame], decide: Callable[[Frame], None], *, quiet: bool) -> None:
    """Print frames as they arrive and hand approval requests to `decide`."""
    at_line_start = True
    for frame in frames:
        kind = frame["type"]
        if kind == "approval_request":
            if not at_line_start:
                _echo("\n", quiet)
                at_line_start = True
            decide(frame)
            continue
        if quiet:
            continue
        if kind == "text_delta":
            _echo(frame["text"], quiet)
            at_line_start = frame["text"].endswith("\n")
            continue
        if not at_line_start:
            _echo("\n", quiet)
            at_line_start = True
        if kind == "tool_call":
            out.print(
                f"[dim]→ {frame['tool']}({_args(frame['args'])}) {frame['status']}[/dim]",
                markup=True,
            )
        elif kind == "tool_result":
            shown = frame.get("error") or _args(frame.get("result"))
            out.print(f"[dim]← {frame['tool']} {frame['status']}: {shown}[/dim]", markup=True)
        elif kind == "error":
            out.print(
                f"[red]run failed ({frame.get('error_type')}): {frame['error']}[/red]", markup=True
            )
        elif kind == "done":
            out.print(f"[green]✓ done[/green] [dim]{frame['run_id']}[/dim]", markup=True)


def _ask(frame: Frame) -> bool:
    out.print(
        f"[yellow]? {frame['tool']}({_args(frame['args'])}) needs approval[/yellow]", markup=True
    )
    return click.confirm("approve?", default=False, err=True)


def _echo(text: str, quiet: bool) -> None:
    if not quiet:
        click.echo(text, nl=False)
        sys.stdout.flush()


def _args(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= 120 else text[:117] + "..."
