"""`agent-jobs status`, `runs`, `journal`: what is stored about runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, get_args

import click
from rich.cells import cell_len
from rich.text import Text

from ..documents import run_document, steps_document
from ..errors import InvalidRequestError
from ..store import RunView
from ..store import runs as run_rows
from ..store.listing import MAX_LIMIT, RunFilter
from ..store.retention import PRUNED
from .common import app, handle_errors, out, print_json, settings, store
from .shapes import count_shapes, describe
from .text import json_text, stamp, visible

__all__ = ["journal", "run_document", "runs", "status"]
# What `runs --since/--until` take: a day, or a moment (UTC unless it gives an offset).
DATE_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S"]


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def status(run_id: str, as_json: bool) -> None:
    """Show a run: its status, output or error, usage and pending decisions."""
    db = store()
    run = db.get_run(run_id)
    doc = run_document(db, run)
    if as_json:
        print_json(doc)
        return
    out.print(Text.assemble((visible(run.run_id), "bold"), f"  {run.status}"))
    out.print(
        visible(
            f"agent {run.agent}  actor {run.actor}  thread {run.thread_id}  runner {run.runner}"
        )
    )
    if run.waiting_on:
        out.print(visible(f"waiting on: {run.waiting_on}"))
    for call in doc["pending_calls"]:
        out.print(visible(f"pending: {call['call_id']} {call['tool']} ") + json_text(call["args"]))
    for asked in doc["pending_questions"]:
        shown = json_text(asked["questions"])
        out.print(visible(f"question: {asked['request_id']} {asked['tool']} ") + shown)
    for line in decisions(db.tool_calls(run.run_id)):
        out.print(line)
    usage = doc["usage"]
    cost = f"  cost {usage['cost']:.6f}" if usage["cost"] is not None else ""
    read, written = usage.get("cache_read_tokens", 0), usage.get("cache_write_tokens", 0)
    cached = f" ({read} read from the cache, {written} written to it)" if read or written else ""
    out.print(
        f"tokens in {usage['input_tokens']}{cached} out {usage['output_tokens']} "
        f"over {usage['model_calls']} model calls{cost}"
    )
    if run.output is not None:
        out.print("output: " + visible(run.output, keep="\n\t"))
    if run.error is not None:
        out.print(visible(f"error ({run.error_type}): {run.error}"))


@click.command()
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(get_args(run_rows.RunStatus)),
    help="Only runs with this status (may repeat: either of them).",
)
@click.option("--agent", help="Only runs of this agent.")
@click.option("--actor", help="Only runs of this actor.")
@click.option("--thread", "thread_id", help="Only runs of this thread.")
@click.option("--parent", "parent_run_id", help="Only the runs this run delegated to.")
@click.option("--schedule", help="Only the runs this schedule started (app.schedule).")
@click.option(
    "--search", "-q", "q", help="Only runs with this text in their id, input or metadata."
)
@click.option(
    "--since", type=click.DateTime(DATE_FORMATS), help="Only runs created at or after (UTC)."
)
@click.option("--until", type=click.DateTime(DATE_FORMATS), help="Only runs created before (UTC).")
@click.option("--unfinished", is_flag=True, help="Only runs that have not ended.")
@click.option(
    "--by-shape",
    is_flag=True,
    help="Count every unfinished run by loop shape (the patches it took, those it refused).",
)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, MAX_LIMIT))
@click.option(
    "--cursor", help="Go on after the page whose `next_cursor` this is (--json prints it)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def runs(
    statuses: tuple[str, ...],
    unfinished: bool,
    by_shape: bool,
    limit: int,
    cursor: str | None,
    as_json: bool,
    **filters: Any,
) -> None:
    """List runs, newest first, with the filters of `GET /v1/runs`; or count the
    unfinished ones by loop shape."""
    if statuses and (unfinished or by_shape):
        raise InvalidRequestError("--status goes with neither --unfinished nor --by-shape")
    if by_shape:
        _by_shape(filters["thread_id"], as_json)
        return
    if unfinished:
        statuses = tuple(s for s in run_rows.RUN_STATUSES if s not in run_rows.TERMINAL)
    given: dict[str, Any] = {
        k: _utc(v) if isinstance(v, datetime) else v for k, v in filters.items()
    }
    where = RunFilter(statuses, **given)
    page = store().runs_page(where, limit=limit, cursor=cursor)
    if as_json:
        print_json([r.model_dump(mode="json") for r in page.runs])
        return
    if not page.runs:
        filtered = statuses or cursor or any(v is not None for v in filters.values())
        out.print("no runs match" if filtered else "no runs yet")
        return
    _print_runs(page.runs)
    if page.next_cursor is not None:
        click.echo(f"more: --cursor {page.next_cursor}")


def _utc(moment: datetime) -> datetime:
    """A time given on the command line: UTC unless it says otherwise."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _by_shape(thread_id: str | None, as_json: bool) -> None:
    db = store()
    with db.connect() as conn:
        found_runs = run_rows.unfinished_journals(conn, thread_id=thread_id)
        counted = count_shapes(
            app(), settings(), ((RunView.from_row(r), rows) for r, rows in found_runs)
        )
    if as_json:
        print_json(counted.as_dict())
    else:
        for line in describe(counted):
            click.echo(visible(line))


def columns(rows: Sequence[tuple[str, ...]]) -> None:
    """Plain columns, not a table: a table fits itself to the terminal (80 columns when
    piped) by cutting cells, and a run id or a step's name is no use cut. The last column
    runs on as long as it is."""
    widths = [max(cell_len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        padded = [
            cell + " " * (width - cell_len(cell))
            for cell, width in zip(row[:-1], widths, strict=True)
        ]
        click.echo("  ".join([*padded, row[-1]]).rstrip())


def _print_runs(found: list[RunView]) -> None:
    columns(
        [("run", "status", "agent", "actor", "created", "input")]
        + [
            (
                visible(r.run_id),
                r.status,
                visible(r.agent),
                visible(r.actor),
                stamp(r.created_at),
                visible(r.input[:40]),
            )
            for r in found
        ]
    )
    for r in found:
        if r.status == "failed" and r.error:
            click.echo(visible(f"failed: {r.run_id} ({r.error_type}): {r.error[:200]}"))


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, intents and results included.")
@handle_errors
def journal(run_id: str, as_json: bool) -> None:
    """Show a run's journal: each checkpointed step, in the order the loop asked for it."""
    db = store()
    db.get_run(run_id)
    rows = db.journal(run_id)
    if as_json:
        print_json(rows)
        return
    mark = next((r["result"] for r in rows if r["state"] == PRUNED), None)
    if isinstance(mark, dict):  # its journal is gone: say so, not a table of its mark
        out.print(
            visible(
                f"the journal of run {run_id} was pruned at {mark.get('pruned_at')} "
                f"(agent-jobs prune): {mark.get('journal_rows')} checkpoints and "
                f"{mark.get('events')} session-log events removed"
            )
        )
        return
    lines = [("seq", "step", "kind", "state", "attempts", "took", "by", "error")]
    lines += [
        (
            str(step["seq"]),
            visible(step["step"]),
            step["kind"],
            step["state"],
            str(step["attempts"]),
            took(step["duration_ms"]),
            visible(step["decided_by"] or ""),
            visible(step["error"] or ""),
        )
        for step in steps_document(db, run_id)["steps"]
    ]
    columns(lines)
    for line in decisions(db.tool_calls(run_id)):
        out.print(line)


def took(ms: float | None) -> str:
    """A step's duration as a person reads it: `340 ms`, `2.1 s`, `3 min 5 s`."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def decisions(calls: list[dict[str, Any]]) -> list[str]:
    """Who decided each decided call, when and why: `decided: call_3 refund approved by
    alice at 2026-…Z: "looks right"`."""
    found = []
    for call in calls:
        if call.get("decision") is None:
            continue
        verb = "approved" if call["decision"] == "approve" else "rejected"
        when = f" at {stamp(call['decided_at'])}" if call.get("decided_at") else ""
        why = f": {json.dumps(call['decision_reason'], ensure_ascii=False)}"
        line = f"decided: {call['call_id']} {call['name']} {verb} by {call['decided_by']}{when}"
        found.append(visible(line + (why if call.get("decision_reason") else "")))
    return found
