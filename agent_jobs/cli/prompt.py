"""Asking the person at the terminal, and telling them how to decide elsewhere.

No terminal is an answer too: stdin at its end (closed, /dev/null, a pipe that has said
all it had) means no one here can decide, and the run waits for someone who can.
Answers piped in (`yes | agent-jobs run …`) are read like typed ones.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

import click
from rich.text import Text

from ..app import AgentApp
from ..approvals.record import decider_roles
from ..approvals.record import may_decide as decides
from .common import err, out
from .text import json_text, visible
from .waiting import StoredCall, StoredQuestion

# Stands for an actor the command cannot name (the app's roles are a function).
SOMEONE = "ACTOR"


class NoTerminal(Exception):
    """stdin is at its end: no one here can answer."""


class Terminal:
    """Questions on stderr, answers from stdin; once stdin has ended, it stays ended."""

    def __init__(self) -> None:
        self.ended = False

    def confirm(self, question: str) -> bool:
        """`question [y/N]`: True for y or yes; an empty answer is no."""
        while True:
            reply = self._line(f"{question} [y/N]: ").strip().lower()
            if reply in ("y", "yes"):
                return True
            if reply in ("", "n", "no"):
                return False
            click.echo("Error: invalid input", err=True)

    def text(self, question: str) -> str:
        """Ask until the answer is not empty."""
        while True:
            reply = self._line(f"{question}: ").strip()
            if reply:
                return reply

    def _line(self, prompt: str) -> str:
        if self.ended:
            raise NoTerminal
        click.echo(prompt, nl=False, err=True)
        try:
            return input()
        except EOFError:
            self.ended = True
            click.echo(err=True)
            raise NoTerminal from None


def show_call(call: StoredCall) -> None:
    """The call as stored: its tool, and its whole arguments, one member a line."""
    out.print(
        Text.assemble(
            ("? ", "yellow"),
            (visible(call.tool), "bold yellow"),
            (" needs approval", "yellow"),
            visible(f" (call {call.call_id} of run {call.run_id}), with the arguments:"),
        )
    )
    out.print(json_text(call.args, indent=2))


def show_questions(question: StoredQuestion) -> None:
    out.print(
        visible(
            f"? {question.tool} has questions "
            f"(request {question.request_id} of run {question.run_id})"
        ),
        style="yellow",
    )


def command(*words: str) -> str:
    """A command line to copy: each word quoted for a POSIX shell."""
    return " ".join(shlex.quote(w) for w in ("agent-jobs", *words))


@dataclass(frozen=True)
class Deciders:
    """Who may decide a call now: its roles (None: anyone), and, when the app's roles
    are a table, the actors that hold one of them."""

    roles: tuple[str, ...] | None
    actors: tuple[str, ...] | None

    def says(self) -> str:
        if self.roles is None:
            return "anyone"
        held = f" ({', '.join(self.actors)})" if self.actors else ""
        if self.actors == ():
            held = " (no actor of the app holds it)"
        return f"an actor with the role {' or '.join(self.roles)}{held}"


def deciders(app: AgentApp, call: StoredCall) -> Deciders:
    """Who may decide `call` now, as a decision on it is judged."""
    roles = decider_roles(app, call.tool, call.escalated_to)
    if roles is None:
        return Deciders(None, None)
    holders = app.roles.holders(roles)
    return Deciders(roles, tuple(holders) if holders is not None else None)


def may_decide(app: AgentApp, call: StoredCall, actor: str) -> bool:
    return decides(app, actor, call.tool, call.escalated_to)


def decide_commands(
    call: StoredCall, actor: str | None = None, app: AgentApp | None = None
) -> tuple[str, str]:
    """The `agent-jobs approve …` and `agent-jobs reject …` lines for `call`, as `actor`
    if they may decide it; else (knowing the app) as one who may, or `ACTOR`."""
    if app is not None and not may_decide(app, call, actor or "cli"):
        found = deciders(app, call)
        actor = found.actors[0] if found.actors else SOMEONE
    who = ("--actor", actor) if actor else ()
    return (
        command("approve", call.run_id, call.call_id, *who),
        command("reject", call.run_id, call.call_id, *who),
    )


def tell_how_to_decide(
    call: StoredCall, actor: str | None = None, app: AgentApp | None = None
) -> None:
    """On stderr: what the run waits for, who may decide it, and exactly how."""
    approve, reject = decide_commands(call, actor, app)
    err.print(
        visible(
            f"run {call.run_id} waits for a decision on call {call.call_id}: {call.tool} "
            "with the arguments"
        )
    )
    err.print(json_text(call.args, indent=2))
    if app is not None:
        found = deciders(app, call)
        err.print(visible(f"  who may decide: {found.says()}"))
    err.print(visible(f"  approve it: {approve}"))
    err.print(visible(f"  reject it:  {reject}"))


def tell_how_to_answer(question: StoredQuestion) -> None:
    """On stderr: the questions a run waits on, and exactly how to answer them."""
    err.print(
        visible(
            f"run {question.run_id} waits for answers to request {question.request_id} "
            f"({question.tool} asks):"
        )
    )
    for qid, asked in question.questions:
        err.print(visible(f"  {qid}: {asked}"))
    template = json.dumps({qid: "…" for qid, _ in question.questions}, ensure_ascii=False)
    answer = command("answer", question.run_id, question.request_id, template)
    err.print(visible(f"  answer them: {answer}"))
