"""`agent-jobs status`, `runs`, `journal`: what is stored about runs."""

from __future__ import annotations

import json
from typing import Any, get_args

import click
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from ..documents import run_document
from ..errors import InvalidRequestError
from ..store import RunView
from ..store import runs as run_rows
from ..store.retention import PRUNED
from .common import app, handle_errors, out, print_json, settings, store
from .shapes import count_shapes, describe
from .text import json_text, stamp, visible

__all__ = ["journal", "run_document", "runs", "status"]


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
    out.print(
        f"tokens in {usage['input_tokens']} out {usage['output_tokens']} "
        f"over {usage['model_calls']} model calls{cost}"
    )
    if run.output is not None:
        out.print("output: " + visible(run.output, keep="\n\t"))
    if run.error is not None:
        out.print(visible(f"error ({run.error_type}): {run.error}"))


@click.command()
@click.option(
    "--status",
    "status_filter",
    type=click.Choice(get_args(run_rows.RunStatus)),
    help="Only runs with this status.",
)
@click.option("--thread", "thread_id", help="Only runs of this thread.")
@click.option("--unfinished", is_flag=True, help="Only runs that have not ended.")
@click.option(
    "--by-shape",
    is_flag=True,
    help="Count every unfinished run by loop shape (the patches it took, those it refused).",
)
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def runs(
    status_filter: str | None,
    thread_id: str | None,
    unfinished: bool,
    by_shape: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List recent runs, newest first; or count the unfinished ones by loop shape."""
    if status_filter is not None and (unfinished or by_shape):
        raise InvalidRequestError("--status goes with neither --unfinished nor --by-shape")
    if by_shape:
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
        return
    with store().connect() as conn:
        listed = run_rows.list_runs(
            conn, limit=limit, status=status_filter, thread_id=thread_id, unfinished=unfinished
        )
    found = [RunView.from_row(row) for row in listed]
    if as_json:
        print_json([r.model_dump(mode="json") for r in found])
        return
    if not found:
        filtered = status_filter or thread_id or unfinished
        out.print("no runs match" if filtered else "no runs yet")
        return
    # Plain columns, not a table: a table fits itself to the terminal (80 columns when
    # piped) by cutting cells, and a run id is no use cut.
    rows = [("run", "status", "agent", "actor", "created", "input")]
    rows += [
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
    widths = [max(cell_len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        padded = [
            cell + " " * (width - cell_len(cell))
            for cell, width in zip(row[:-1], widths, strict=True)
        ]
        click.echo("  ".join([*padded, row[-1]]).rstrip())


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
    table = Table("seq", "step", "state", "attempts", "error", box=None)
    for row in rows:
        cells = (row["seq"], row["step"], row["state"], row["attempts"], row["error"] or "")
        table.add_row(*(Text(visible(cell)) for cell in cells))
    out.print(table)
    for line in decisions(db.tool_calls(run_id)):
        out.print(line)


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
