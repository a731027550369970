"""`agent-jobs enqueue`: hand a run to the workers and print its id."""

from __future__ import annotations

import json
from typing import Any

import click

from ..admission import IfBusy
from ..runs import RunRequest
from .common import agent_named, durable_client, fail, handle_errors, print_json

IF_BUSY = click.option(
    "--if-busy",
    type=click.Choice(["enqueue", "reject", "interrupt"]),
    default="enqueue",
    show_default=True,
    help="On a thread whose turn has not ended: run after it, refuse, or cancel it.",
)


def _metadata(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        fail(f"--metadata must be a JSON object: {exc}")
    if not isinstance(value, dict):
        fail(f"--metadata must be a JSON object, not a JSON {type(value).__name__}")
    return value


@click.command()
@click.argument("text")
@click.option("--agent", help="The agent to run (default: the app's only one, or support).")
@click.option("--actor", default="cli", show_default=True, help="Who asks (roles, quota).")
@click.option("--thread", "thread_id", help="Continue this thread.")
@click.option("--persona", help="Run under this persona.")
@click.option("--run-id", help="Idempotency key: the same id twice starts one run.")
@click.option("--metadata", help="A JSON object kept with the run, e.g. '{\"ticket\": 7}'.")
@IF_BUSY
@click.option("--json", "as_json", is_flag=True, help='Print {"run_id", "status"}.')
@handle_errors
def enqueue(
    text: str,
    agent: str | None,
    actor: str,
    thread_id: str | None,
    persona: str | None,
    run_id: str | None,
    metadata: str | None,
    if_busy: IfBusy,
    as_json: bool,
) -> None:
    """Start a durable run of AGENT on TEXT and print its id (needs AGENT_JOBS_BROKER_URL).

    Follow it with `agent-jobs tail RUN_ID`; the same --run-id twice starts one run.
    """
    client = durable_client()
    request = RunRequest.of(
        agent_named(agent, client.app),
        text,
        actor=actor,
        thread_id=thread_id,
        run_id=run_id,
        persona=persona,
        metadata=_metadata(metadata),
        if_busy=if_busy,
    )
    run_id, created = client.admit(request)
    if as_json:
        # What this command wrote (a new run is queued), not a status read back after the
        # send, which a worker may already have moved on; a run id taken: as it stands.
        status = "queued" if created else client.get_run(run_id).status
        print_json({"run_id": run_id, "status": status})
    else:
        click.echo(run_id)
