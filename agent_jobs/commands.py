"""The commands on runs, written once for every door and both runners.

A command is one transaction over the domain function that checks and records it
(`approvals.record`, `reconciliation`, `runs`, `session`, `controls`), then a *wake*:
what the runner that drives the run does once the record is committed. The durable
runner's wake sends the broker a `coordinate` or the steps to run
(`agent_jobs.runners.durable.wake`); the inline runner's resolves the future or sets the
event its turn waits on (`agent_jobs.runners.inline`). The doors — the Python client, the
command line, the approvals listener, the HTTP API — parse, authenticate and call a
command; a refusal is one of the typed errors of `agent_jobs.errors`, which each door
maps to its status in one place.

Adding a command: a domain function, a method here (and on `Wake` if the runners must
act on it), a route, a command-line command.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from . import controls, session, timers
from .app import AgentApp
from .approvals.reconcile import Reconciliation, Recorded, record_reconciliation
from .approvals.record import record_answers, record_decision
from .checkpoints import Decision
from .runs import RunRequest, admit, post_message
from .store import Store
from .store.runs import RunStatus


class Wake(Protocol):
    """What a runner does after a command has committed. Every method is called after the
    transaction, so what it wakes finds the command recorded; each is harmless to repeat
    (a lost wake is made good by the durable runner's sweep, and by the inline runner's
    own look at the database)."""

    runner: Literal["durable", "inline"]  # the runner new runs of these commands go to
    new_status: RunStatus  # the status a run it starts is written with

    def admission(self, request: RunRequest | None) -> AbstractContextManager[None]:
        """Around writing a new run (a request, a fork): refuse it before anything is
        written when this runner cannot take it, and serialise what must be."""
        ...

    def started(self, run_id: str) -> None:
        """A run was written that may begin: drive it."""
        ...

    def stopping(self, run_ids: Sequence[str]) -> None:
        """Runs were asked to stop (a cancel, an interrupt): let them see it now."""
        ...

    def cancelled(self, run_id: str, affected: list[str]) -> list[str]:
        """A cancel of `run_id` was recorded (`affected`: the runs asked to stop): let them
        see it now; returns the runs it stops, the ones asked first."""
        ...

    def decided(self, run_id: str, key: str, value: Any) -> None:
        """A decision (`key`: the call) or answers (`key`: the request) were recorded."""
        ...

    def paused(self, run_ids: Sequence[str]) -> None:
        """Runs were asked to pause at their next step boundary."""
        ...

    def woken(self, run_id: str) -> None:
        """A sleeping run was sent a message for its next step: it wakes now."""
        ...

    def resumed(self, run_ids: Sequence[str]) -> None:
        """Paused runs may go on."""
        ...

    def retried(self, run_id: str, sends: Sequence[tuple[str, str]]) -> None:
        """A failed run's failed step runs again (`sends`: its rows, as tasks and steps)."""
        ...

    def reconciled(self, run_id: str, recorded: Recorded) -> None:
        """How a call whose outcome was unknown ended was recorded (`recorded.resend`: the
        step to send again, for `retry`)."""
        ...


class Commands:
    """The commands of one deployment: its store, its app, and the wake of the runner
    that drives its new runs."""

    def __init__(self, store: Store, app: AgentApp, wake: Wake) -> None:
        self.store = store
        self.app = app
        self.wake = wake

    # --- runs ----------------------------------------------------------------------------

    def admit(self, request: RunRequest) -> tuple[str, bool]:
        """Write the run (or find it, by its run id) and drive it: (run id, whether new).

        On a thread whose turn has not ended the request waits for it, is refused
        (`ThreadBusyError`, nothing written) or interrupts it, as its `if_busy` says.
        """
        with self.wake.admission(request):
            made = admit(
                self.store, self.app, request, runner=self.wake.runner, status=self.wake.new_status
            )
        self.wake.stopping(made.interrupted)  # asked to stop: a parked one must hear it
        if made.created:
            self.wake.started(made.run_id)
        return made.run_id, made.created

    def post_message(self, run_or_thread: str, text: str, *, target: str = "next-step") -> str:
        """Queue a message on a thread's inbox (by run or thread id); returns the thread.
        A `next-turn` message to an idle thread starts its next turn at once."""
        with self.store.begin() as conn:
            # A run asleep on a `wait` call wakes for its next step's message (timers.py).
            sleeper = timers.sleeper(conn, run_or_thread) if target == "next-step" else None
            thread_id, next_run = post_message(
                conn, self.app, run_or_thread, text, target=target, runner=self.wake.runner
            )
        if next_run is not None:
            self.wake.started(next_run)
        if sleeper is not None:
            self.wake.woken(sleeper)
        return thread_id

    def cancel(self, run_id: str, cause: str = "user", *, keep_inbox: bool = False) -> list[str]:
        """Ask a run and its children to stop at their next boundary; the ids asked (none
        when the run has ended)."""
        with self.store.begin() as conn:
            affected = session.request_cancel(conn, run_id, cause, keep_inbox=keep_inbox)
        return self.wake.cancelled(run_id, affected)

    def select_model(self, run_or_thread: str, selection: session.ModelSelection) -> str:
        """Switch a thread's model (by run or thread id) from the next step that assembles
        a prompt; returns the thread. Nothing is woken: the next prompt reads it."""
        with self.store.begin() as conn:
            thread_id, _ = session.resolve_thread(conn, run_or_thread)
            session.select_model(conn, thread_id, selection)
        return thread_id

    # --- people's decisions --------------------------------------------------------------

    def decide(
        self,
        run_id: str,
        call_id: str,
        decision: Literal["approve", "reject"],
        *,
        actor: str,
        reason: str | None = None,
        args_sha256: str | None = None,
    ) -> bool:
        """Record a decision on a pending call, then release the run; False if another
        decision came first. Refusals: `agent_jobs.approvals.record.record_decision`."""
        verdict = Decision(decision=decision, actor=actor, reason=reason)
        with self.store.begin() as conn:
            outcome = record_decision(
                conn, self.app, run_id, call_id, verdict, expected_args_sha256=args_sha256
            )
        if outcome != "recorded":
            return False
        self.wake.decided(run_id, call_id, verdict)
        return True

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        """Record a person's answers to a tool's questions, then release the run; False
        when they were answered already (the first answers win)."""
        with self.store.begin() as conn:
            outcome = record_answers(conn, run_id, request_id, answers, actor=actor)
        if outcome != "recorded":
            return False
        self.wake.decided(run_id, request_id, answers)
        return True

    def reconcile(self, run_id: str, call_id: str, decision: Reconciliation) -> bool:
        """Record how a call whose outcome is unknown ended, then wake the run (`retry`:
        its step is sent again). Refusals: `reconciliation.record_reconciliation`."""
        with self.store.begin() as conn:
            recorded = record_reconciliation(conn, self.app, run_id, call_id, decision)
        self.wake.reconciled(run_id, recorded)
        return True

    # --- operator controls ---------------------------------------------------------------

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        """Ask a run and its delegated runs to pause at their next step boundary; the ids."""
        with self.store.begin() as conn:
            asked = controls.pause(conn, run_id, actor)
        self.wake.paused(asked)  # a run waiting for a person pauses now, not once it goes on
        return asked

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        """Let a paused run and its delegated runs go on; the ids resumed."""
        with self.store.begin() as conn:
            resumed = controls.resume(conn, run_id, actor)
        self.wake.resumed(resumed)
        return resumed

    def retry(self, run_id: str, *, actor: str) -> controls.Retried:
        """Run the failed step of a run that failed on it again, with a fresh attempt
        count; the run's error is cleared and it goes on."""
        with self.wake.admission(None), self.store.begin() as conn:
            retried = controls.retry(conn, run_id, actor, runner=self.wake.runner)
        self.wake.retried(run_id, retried.sends)
        return retried

    def fork(
        self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False
    ) -> controls.Forked:
        """A new run on a new thread from the run's journal before step `at`
        (`agent_jobs.controls.fork` says what it copies, asks again and refuses)."""
        with self.wake.admission(None), self.store.begin() as conn:
            forked = controls.fork(
                conn,
                self.app,
                run_id,
                at,
                actor,
                runner=self.wake.runner,
                status=self.wake.new_status,
                keep_decisions=keep_decisions,
            )
        self.wake.started(forked.run_id)
        return forked
