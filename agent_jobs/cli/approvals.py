"""`agent-jobs approve`, `reject`, `approvals pending`: decisions on action calls."""

from __future__ import annotations

from typing import Literal

import click

from .. import client
from .common import handle_errors, out, print_json, store


def _decide(
    run_id: str,
    call_id: str,
    decision: Literal["approve", "reject"],
    actor: str,
    reason: str | None,
) -> None:
    recorded = client.decide(run_id, call_id, decision, actor=actor, reason=reason)
    verb = "approved" if decision == "approve" else "rejected"
    if recorded:
        out.print(f"{verb} {call_id} of run {run_id}")
    else:
        out.print(f"{call_id} of run {run_id} was already decided; nothing changed")


@click.command()
@click.argument("run_id")
@click.argument("call_id")
@click.option(
    "--actor", default="cli", show_default=True, help="Who decides (needs an approver role)."
)
@click.option("--reason", help="Why, for the record.")
@handle_errors
def approve(run_id: str, call_id: str, actor: str, reason: str | None) -> None:
    """Approve a pending action call."""
    _decide(run_id, call_id, "approve", actor, reason)


@click.command()
@click.argument("run_id")
@click.argument("call_id")
@click.option(
    "--actor", default="cli", show_default=True, help="Who decides (needs an approver role)."
)
@click.option("--reason", help="Why, for the record (the model sees it).")
@handle_errors
def reject(run_id: str, call_id: str, actor: str, reason: str | None) -> None:
    """Reject a pending action call; the model is told."""
    _decide(run_id, call_id, "reject", actor, reason)


@click.group()
def approvals() -> None:
    """Pending decisions and the approvals listener."""


@approvals.command("pending")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def pending(as_json: bool) -> None:
    """List calls waiting for a decision."""
    calls = store().pending_calls()
    if as_json:
        print_json(calls)
        return
    if not calls:
        out.print("nothing is waiting for a decision")
    for c in calls:
        out.print(f"{c['run_id']} {c['call_id']} {c['name']} {c['args']} (actor {c['actor']})")
