"""How a run's frames are shown on a terminal: tokens as they arrive, tool calls, approvals."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click
from rich.markup import escape

from ..stream import Frame
from .common import out


def follow(
    frames: Iterable[Frame],
    decide: Callable[[Frame], None],
    *,
    quiet: bool,
    answer: Callable[[Frame], None] | None = None,
) -> None:
    """Print frames as they arrive; hand approval requests to `decide` and questions to
    `answer`."""
    at_line_start = True
    for frame in frames:
        kind = frame["type"]
        if kind == "approval_request" or (kind == "question" and answer is not None):
            if not at_line_start:
                _echo("\n", quiet)
                at_line_start = True
            if kind == "question" and answer is not None:
                answer(frame)
            else:
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
        elif kind == "question":
            asked = "; ".join(
                f"{q.get('question', q)} ({q.get('id')})" for q in frame.get("questions") or []
            )
            asking = f"? {frame.get('tool')} asks: {asked} (request {frame.get('request_id')})"
            out.print(f"[yellow]{escape(asking)}[/yellow]", markup=True)
        elif kind == "status" and frame.get("status") == "retrying":
            out.print(
                f"[yellow]… {frame.get('step')} is retried (attempt {frame.get('attempt')}); "
                "what it streamed before may repeat[/yellow]",
                markup=True,
            )
        elif kind == "done":
            out.print(f"[green]✓ done[/green] [dim]{frame['run_id']}[/dim]", markup=True)


def ask(frame: Frame) -> bool:
    """Show an approval request and ask `approve? [y/N]` on the terminal."""
    out.print(
        f"[yellow]? {frame['tool']}({_args(frame['args'])}) needs approval[/yellow]", markup=True
    )
    return click.confirm("approve?", default=False, err=True)


def ask_answers(frame: Frame) -> dict[str, Any]:
    """Ask each of a tool's questions on the terminal; the answers by question id."""
    out.print(f"[yellow]? {frame.get('tool')} has questions[/yellow]", markup=True)
    return {
        str(q.get("id")): click.prompt(str(q.get("question", q)), err=True)
        for q in frame.get("questions") or []
    }


def _echo(text: str, quiet: bool) -> None:
    if not quiet:
        click.echo(text, nl=False)
        sys.stdout.flush()


def _args(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= 120 else text[:117] + "..."
