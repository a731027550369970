"""`agent-jobs keys` and `agent-jobs forget`: encryption at rest's keys and data
(agent_jobs/encryption/maintenance.py; docs/security.md, "Encryption at rest")."""

from __future__ import annotations

import click

from ..encryption import maintenance
from .common import handle_errors, print_json, store


@click.group()
def keys() -> None:
    """Manage the keys of encryption at rest."""


@keys.command("rotate")
@click.option(
    "--batch", type=click.IntRange(min=1), default=100, metavar="N", help="Keys a transaction."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def keys_rotate(batch: int, as_json: bool) -> None:
    """Re-wrap every data key under AGENT_JOBS_ENCRYPTION_KEY_ID (the old master key
    must still be in AGENT_JOBS_ENCRYPTION_KEYS). Safe while workers run; run it again
    after a stop to go on. Then the old master key may be removed."""
    done = maintenance.rotate(store(), batch=batch)
    if as_json:
        print_json({"rewrapped": done})
        return
    click.echo(f"{done} data key{'' if done == 1 else 's'} re-wrapped")


@keys.command("encrypt-existing")
@click.option(
    "--batch", type=click.IntRange(min=1), default=500, metavar="N", help="Rows a transaction."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def keys_encrypt_existing(batch: int, as_json: bool) -> None:
    """Seal every payload stored clear (written before encryption was on), N rows a
    transaction, while workers run; run it again after a stop to go on."""
    sealed = maintenance.encrypt_existing(store(), batch=batch)
    if as_json:
        print_json({"sealed": sealed, "total": sum(sealed.values())})
        return
    for table, count in sealed.items():
        click.echo(f"{table}: {count} row{'' if count == 1 else 's'} sealed")


@click.command()
@click.argument("actor")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def forget(actor: str, as_json: bool) -> None:
    """Destroy ACTOR's data keys: every payload of their runs becomes unreadable, in
    the database and in its backups. Their runs stay listed, with ids and statuses;
    other actors are not touched."""
    found = maintenance.forget(store(), actor)
    if as_json:
        print_json({"actor": actor, "keys": found.keys, "unreadable_payloads": found.payloads})
        return
    if not found.keys:
        click.echo(f"actor {actor!r} has no data key: nothing to forget")
        return
    click.echo(
        f"forgot actor {actor!r}: {len(found.keys)} data key(s) destroyed, "
        f"{found.payloads} stored payload(s) now unreadable"
    )
