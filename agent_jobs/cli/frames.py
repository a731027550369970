"""How a run's frames are shown on a terminal: tokens as they arrive, tool calls, results.

Frames are for display only, and shown as text: what a run waits for is handed to the
callers' handlers, which look it up in the store (see `waiting`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import click
from rich.text import Text

from ..streams.base import Frame
from .common import out
from .text import json_text, visible


def follow(
    frames: Iterable[Frame],
    on_approval: Callable[[Frame], None],
    on_question: Callable[[Frame], None],
    *,
    quiet: bool,
) -> None:
    """Print frames as they arrive; hand approval requests to `on_approval` and
    questions to `on_question`."""
    at_line_start = True
    for frame in frames:
        kind = frame.get("type")
        if kind in ("approval_request", "question"):
            if not at_line_start:
                _echo("\n", quiet)
                at_line_start = True
            (on_approval if kind == "approval_request" else on_question)(frame)
            continue
        if quiet:
            continue
        if kind == "text_delta":
            text = str(frame.get("text", ""))
            _echo(visible(text, keep="\n\t"), quiet)
            at_line_start = text.endswith("\n")
            continue
        if not at_line_start:
            _echo("\n", quiet)
            at_line_start = True
        _show(frame)


def _show(frame: Frame) -> None:
    kind = frame.get("type")
    tool = visible(frame.get("tool", ""))
    status = visible(frame.get("status", ""))
    if kind == "tool_call":
        out.print(f"→ {tool}({json_text(frame.get('args'))}) {status}", style="dim")
    elif kind == "tool_result":
        error = frame.get("error")
        shown = visible(error) if error else json_text(frame.get("result"))
        out.print(f"← {tool} {status}: {shown}", style="dim")
    elif kind == "error":
        failed = f"run failed ({frame.get('error_type')}): {frame.get('error')}"
        out.print(visible(failed), style="red")
    elif kind == "status" and frame.get("status") == "retrying":
        out.print(
            visible(
                f"… {frame.get('step')} is retried (attempt {frame.get('attempt')}); "
                "what it streamed before may repeat"
            ),
            style="yellow",
        )
    elif kind == "done":
        out.print(
            Text.assemble(("✓ done", "green"), " ", (visible(frame.get("run_id", "")), "dim"))
        )


def _echo(text: str, quiet: bool) -> None:
    if not quiet:
        click.echo(text, nl=False)
        sys.stdout.flush()
