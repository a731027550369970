"""`agent-jobs prune`: remove what old finished runs leave behind (agent_jobs/retention.py)."""

from __future__ import annotations

import click
import redis

from .. import retention
from .common import handle_errors, print_json, settings, store
from .text import stamp


@click.command()
@click.option(
    "--older-than",
    "days",
    required=True,
    type=click.FloatRange(min=0),
    metavar="DAYS",
    help="Prune the runs that ended more than DAYS days ago (fractions allowed).",
)
@click.option("--dry-run", is_flag=True, help="Count what would go; change nothing.")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Runs a transaction (default AGENT_JOBS_PRUNE_BATCH, 100).",
)
@click.option(
    "--rest",
    type=click.FloatRange(min=0),
    default=None,
    metavar="RATIO",
    help="After each batch, rest RATIO times as long as it took (default "
    "AGENT_JOBS_PRUNE_REST, 1; 0: full speed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def prune(days: float, dry_run: bool, batch: int | None, rest: float | None, as_json: bool) -> None:
    """Remove the journals, session-log events, live streams and delivered notifications
    of runs that ended more than DAYS days ago, in small batches. Run rows, thread
    messages, tool calls and usage stay."""
    config = settings()
    url = config.effective_redis_url
    # Short timeouts: a Redis that is down fails the batch (exit 5), it does not hang.
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10) if url else None
    try:
        report = retention.prune(
            store(),
            older_than=days,
            dry_run=dry_run,
            batch=batch or config.prune_batch,
            rest=config.prune_rest if rest is None else rest,
            redis_client=client,
        )
    finally:
        if client is not None:
            client.close()
    if as_json:
        print_json(report.as_dict())
        return
    cutoff = stamp(report.cutoff)
    click.echo(f"{report.summary()}, of runs that ended before {cutoff}")
    if report.batches:
        rate = f", {report.rows / report.elapsed:.0f} rows/s" if report.elapsed > 0 else ""
        click.echo(
            f"{report.batches} batch{'es' if report.batches > 1 else ''} in "
            f"{report.elapsed:.2f} s, the longest "
            f"{report.longest_batch * 1000:.0f} ms{rate}"
        )
    if client is None:
        click.echo("no Redis configured (AGENT_JOBS_REDIS_URL): no live streams to remove")
