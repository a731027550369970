"""`agent-jobs approve`, `reject`, `approvals pending|listen|stats`: decisions on actions."""

from __future__ import annotations

import logging
import signal
from typing import Literal, cast

import click
import redis

from .. import client
from ..approvals.listener import ApprovalsListener, ListenerSettings
from ..logs import LogFormat, configure_logging
from .common import EXIT_ALREADY_DECIDED, fail, handle_errors, out, print_json, settings, store
from .text import json_text, visible


def _decide(
    run_id: str,
    call_id: str,
    decision: Literal["approve", "reject"],
    actor: str,
    reason: str | None,
) -> None:
    recorded = client.decide(run_id, call_id, decision, actor=actor, reason=reason)
    verb = "approved" if decision == "approve" else "rejected"
    if not recorded:  # a script must tell a late decision from one that counted
        call = store().tool_call(run_id, call_id)
        by = f" by {call['decided_by']}" if call and call["decided_by"] else ""
        fail(
            f"{call_id} of run {run_id} was already decided{by}; nothing changed",
            EXIT_ALREADY_DECIDED,
        )
    out.print(visible(f"{verb} {call_id} of run {run_id}"))


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
    asked = store().open_questions()
    if not calls and not asked:
        out.print("nothing is waiting for a decision")
    for c in calls:
        ids = visible(f"{c['run_id']} {c['call_id']} {c['name']} ")
        out.print(f"{ids}{json_text(c['args'])}" + visible(f" (actor {c['actor']})"))
    for q in asked:
        ids = visible(f"{q['run_id']} {q['request_id']} {q['tool']} asks ")
        out.print(ids + json_text(q["questions"]))


@approvals.command("listen")
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Accept unsigned decisions when AGENT_JOBS_APPROVAL_SECRET is unset (trusted Redis only).",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), help="Default: text.")
@click.option("--log-level", help="Default: INFO.")
@click.option("--health-file", help="Touched every second while both doors are served.")
@handle_errors
def listen(
    allow_unsigned: bool, log_format: str | None, log_level: str | None, health_file: str | None
) -> None:
    """Record decisions posted to the approvals channel and stream, then wake the runs.

    Subscribes to AGENT_JOBS_APPROVALS_CHANNEL (pub/sub, at-most-once) and reads the
    Redis Stream of the same name through a consumer group (at-least-once). Runs until
    SIGTERM or Ctrl-C; bad messages are logged and counted, never fatal.
    """
    configure_logging(cast(LogFormat | None, log_format), log_level)
    overrides = ListenerSettings()
    if health_file:
        overrides = overrides.model_copy(update={"listener_health_file": health_file})
    listener = ApprovalsListener.from_settings(
        settings(), allow_unsigned=allow_unsigned, listener_settings=overrides
    )
    if listener.secret is None:
        logging.getLogger(__name__).warning(
            "no AGENT_JOBS_APPROVAL_SECRET: unsigned decisions are accepted"
        )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: listener.stop())
    listener.serve()


@approvals.command("stats")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def stats(as_json: bool) -> None:
    """The listener's counters by outcome, and what waits in its stream."""
    config = settings()
    url = config.effective_redis_url
    if not url:
        fail("set AGENT_JOBS_REDIS_URL or AGENT_JOBS_BROKER_URL")
    channel = config.approvals_channel
    client = redis.Redis.from_url(url)
    try:
        raw: dict[bytes, bytes] = client.hgetall(f"{channel}:counters")  # type: ignore[assignment]
        counters = {k.decode(): int(v) for k, v in raw.items()}
        doc = {
            "channel": channel,
            "counters": counters,
            "stream_length": client.xlen(channel),
            "dead_letters": client.xlen(f"{channel}:dead"),
        }
    finally:
        client.close()
    if as_json:
        print_json(doc)
        return
    shown = " ".join(f"{k}={v}" for k, v in sorted(counters.items())) or "none yet"
    out.print(f"channel {channel}: {shown}")
    out.print(f"waiting in the stream: {doc['stream_length']}  dead letters: {doc['dead_letters']}")
