"""`agent-jobs reconcile`: say how a call whose outcome is unknown ended."""

from __future__ import annotations

import json
from typing import Any

import click

from .. import client
from ..approvals.reconcile import Outcome
from .common import fail, handle_errors, out
from .text import visible

ONE_OF = "give exactly one of --succeeded JSON, --failed MESSAGE or --retry"


@click.command()
@click.argument("run_id")
@click.argument("call_id")
@click.option(
    "--succeeded",
    metavar="JSON",
    help="It took effect: JSON is its result, as the tool would have returned it.",
)
@click.option("--failed", metavar="MESSAGE", help="It did not: the model is told MESSAGE.")
@click.option("--retry", is_flag=True, help="Run it again: its handler runs a second time.")
@click.option(
    "--actor",
    default="cli",
    show_default=True,
    help="Who decides (an approver of the tool, or an actor with the role service).",
)
@handle_errors
def reconcile(
    run_id: str,
    call_id: str,
    succeeded: str | None,
    failed: str | None,
    retry: bool,
    actor: str,
) -> None:
    """Say how a call whose outcome is unknown ended: its worker died while its handler
    ran, so it was not run again and the run waits (awaiting_reconcile)."""
    given = [succeeded is not None, failed is not None, retry]
    if sum(given) != 1:
        fail(ONE_OF)
    outcome: Outcome = "retry"
    result: Any = None
    if succeeded is not None:
        outcome = "succeeded"
        try:
            result = json.loads(succeeded)
        except ValueError as exc:
            fail(f"--succeeded takes the call's result as JSON: {exc}")
    elif failed is not None:
        outcome = "failed"
    client.reconcile(run_id, call_id, outcome, actor=actor, result=result, error=failed)
    said = {
        "succeeded": "recorded as succeeded",
        "failed": "recorded as failed",
        "retry": "sent to run again",
    }[outcome]
    out.print(visible(f"{call_id} of run {run_id} {said}; the run goes on"))
