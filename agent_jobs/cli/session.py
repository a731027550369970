"""`agent-jobs events`, `say`, `model`, `cancel`, `answer`: the session runtime from the
terminal."""

from __future__ import annotations

import json

import click

from ..client import Client
from ..runners import end_abandoned
from ..session import CANCEL_CAUSES, TARGETS, Event, ModelSelection, fold_inbox, fold_status
from .common import EXIT_ALREADY_DECIDED, fail, handle_errors, out, print_json, settings, store
from .text import stamp, visible


def _client() -> Client:
    """A client for reading and posting; it wakes durable runs when a broker is set."""
    from .common import app

    config = settings()
    if config.broker_url:
        return Client.from_settings(config)
    return Client(store(), app(), config)


@click.command()
@click.argument("run_or_thread")
@click.option("--json", "as_json", is_flag=True, help="Print the events as JSON.")
@handle_errors
def events(run_or_thread: str, as_json: bool) -> None:
    """Print a thread's session log (give a run id or a thread id)."""
    client = _client()
    log = client.events(run_or_thread)
    if as_json:
        print_json([e.model_dump(mode="json") for e in log])
        return
    for e in log:
        run = (e.run_id or "-")[:12]
        data = json.dumps(e.data, ensure_ascii=False, separators=(", ", ": "))
        out.print(visible(f"{e.seq:>5} {stamp(e.created_at)} {run:<12} {e.type:<20} {data}"))
    inbox = fold_inbox(log)
    out.print(
        f"agent {_now(client, log)}; inbox: {len(inbox.next_step)} for the next step, "
        f"{len(inbox.next_turn)} for the next turn"
    )


def _now(client: Client, log: list[Event]) -> str:
    """What the thread's agent is doing: idle, running, or what its turn waits for (the
    session log says `running` all through a turn; the run's row says it is parked)."""
    folded = fold_status(log)
    thread_id = log[-1].thread_id if log else None
    if folded != "running" or thread_id is None:
        return folded
    going = [r for r in client.store.list_runs(thread_id=thread_id, limit=5) if not r.finished]
    if going and going[0].status != "running":
        return f"{going[0].status} (run {going[0].run_id})"
    return folded


@click.command()
@click.argument("run_or_thread")
@click.argument("text")
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="next-step",
    show_default=True,
    help="next-step steers the running turn; next-turn becomes the next request.",
)
@handle_errors
def say(run_or_thread: str, text: str, target: str) -> None:
    """Post a message to a thread's inbox."""
    thread_id = _client().post_message(run_or_thread, text, target=target)
    out.print(visible(f"queued for the {target.replace('-', ' ')} of thread {thread_id}"))


@click.command()
@click.argument("run_or_thread")
@click.option("--model", "model_id", help="The provider's model id, e.g. gpt-4.1.")
@click.option("--provider", help="The provider, e.g. openai or anthropic.")
@click.option(
    "--reasoning-effort", help="The reasoning effort; left out, it clears the thread's own."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def model(
    run_or_thread: str,
    model_id: str | None,
    provider: str | None,
    reasoning_effort: str | None,
    as_json: bool,
) -> None:
    """Switch a thread's model (give a run id or a thread id) from its next step that
    assembles a prompt; a step already sent keeps the model it was sent with."""
    selection = ModelSelection(provider=provider, model=model_id, reasoning_effort=reasoning_effort)
    thread_id = _client().commands.select_model(run_or_thread, selection)
    if as_json:
        print_json({"thread_id": thread_id, **selection.model_dump()})
        return
    named = ":".join(part for part in (provider, model_id) if part)
    out.print(visible(f"thread {thread_id} uses {named} from its next step"))


@click.command()
@click.argument("run_id")
@click.option("--cause", type=click.Choice(CANCEL_CAUSES), default="user", show_default=True)
@click.option("--keep-inbox", is_flag=True, help="Keep queued messages for a later turn.")
@handle_errors
def cancel(run_id: str, cause: str, keep_inbox: bool) -> None:
    """Cancel a run (and its children); it stops at its next boundary."""
    client = _client()
    stopped = client.cancel(run_id, cause, keep_inbox=keep_inbox)
    # An embedded run whose process is gone has none to see the cancel: it ends here (one
    # cancelled before too: its cancel was recorded, and nothing saw it).
    ended = end_abandoned(client.store, client.app, [run_id, *stopped])
    stopped += [target for target in ended if target not in stopped]
    if stopped:
        out.print(visible(f"cancelling {', '.join(stopped)} ({cause})"))
    else:
        out.print(visible(f"run {run_id} has already ended; nothing to cancel"))


@click.command()
@click.argument("run_id")
@click.argument("request_id")
@click.argument("answers")
@click.option("--actor", default="cli", show_default=True, help="Who answers.")
@handle_errors
def answer(run_id: str, request_id: str, answers: str, actor: str) -> None:
    """Answer a tool's questions: ANSWERS is a JSON object, e.g. '{"q1": "Friday"}'."""
    try:
        parsed = json.loads(answers)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ANSWERS") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object", param_hint="ANSWERS")
    if not _client().answer(run_id, request_id, parsed, actor=actor):
        fail(
            f"{request_id} of run {run_id} was already answered; nothing changed",
            EXIT_ALREADY_DECIDED,
        )
    out.print(visible(f"answered {request_id} of run {run_id}"))
