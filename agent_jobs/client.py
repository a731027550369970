"""`agent_jobs.client`: start runs, read them, decide on their actions — from any process.

The module-level functions use a default `Client` built from the settings
(`AGENT_JOBS_DATABASE_URL`, `AGENT_JOBS_BROKER_URL`, `AGENT_JOBS_APP`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

from . import controls, session, startup
from .admission import IfBusy
from .app import AgentApp
from .approvals.reconcile import Outcome, Reconciliation
from .commands import Commands
from .dispatch import CeleryDispatcher, celery_client
from .errors import UnknownRunError
from .loading import load_app
from .runners import DurableWake
from .runs import RunRequest
from .settings import Settings, get_settings
from .store import RunView, Store


class Client:
    """A handle on one deployment: its store, its app, and (when durable) its broker.

    Its commands are `agent_jobs.commands`' with the durable runner's wake: recorded,
    then the broker is told (runs other processes drive inline are left to them).
    """

    def __init__(
        self,
        store: Store,
        app: AgentApp,
        settings: Settings | None = None,
        dispatcher: CeleryDispatcher | None = None,
    ) -> None:
        self.store = store
        self.app = app
        self.settings = settings or get_settings()
        self.dispatcher = dispatcher
        self.waker = DurableWake(store, dispatcher)
        self.commands = Commands(store, app, self.waker)

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Client:
        settings = settings or get_settings()
        dispatcher = (
            CeleryDispatcher(celery_client(settings.broker_url, settings.queue))
            if settings.broker_url
            else None
        )
        app = load_app(settings.app)
        store = Store.from_url(settings.database_url)
        startup.start(store, settings, deliver=False)  # after the app, as tracing needs
        return cls(store, app, settings, dispatcher)

    def enqueue_run(
        self,
        agent: str,
        input: str,
        *,
        actor: str = "anonymous",
        thread_id: str | None = None,
        run_id: str | None = None,
        persona: str | None = None,
        metadata: dict[str, Any] | None = None,
        if_busy: IfBusy | None = None,
    ) -> str:
        """Start a durable run; returns its id. The same `run_id` twice starts one run.

        On a thread whose turn has not ended (`thread_id`), the run waits for it
        (`if_busy="enqueue"`, the default), is refused with `ThreadBusyError` and nothing
        recorded (`"reject"`), or cancels it as a user would and runs next (`"interrupt"`).

        The run row is written here, before the message is sent, so `get_run` works at
        once. A broker that cannot be reached is a logged warning, and the id is still
        returned: the run is recorded and queued and the sweep starts it, where an error
        would invite a retry that records the same request twice.
        """
        self.waker.broker()  # no broker: refused before the request is looked at
        request = RunRequest.of(
            agent,
            input,
            actor=actor,
            thread_id=thread_id,
            run_id=run_id,
            persona=persona,
            metadata=metadata,
            if_busy=if_busy,
        )
        return self.admit(request)[0]

    def admit(self, request: RunRequest) -> tuple[str, bool]:
        """`enqueue_run` for a request already validated: (run id, whether it is new).

        A run id that is taken finds the run already there: nothing is written or sent.
        """
        return self.commands.admit(request)

    def wake(self, run_id: str) -> None:
        """Ask a worker to re-drive the run (durable runs only; harmless to repeat).

        A broker that cannot be reached is logged, not raised: what woke the run is
        recorded, and the sweep re-drives a run whose decision or answers came in.
        """
        self.waker.wake(run_id)

    def get_run(self, run_id: str) -> RunView:
        return self.store.get_run(run_id)

    def wait(self, run_id: str, timeout: float | None = None, *, poll: float = 0.1) -> RunView:
        """Block until the run has finished (or `timeout` seconds pass); returns its view."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.store.get_run(run_id)
            if run.finished or (deadline is not None and time.monotonic() >= deadline):
                return run
            time.sleep(poll)

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
        """Record a decision on a pending call; False if another decision came first.

        Raises `UnknownRunError`, `UnknownCallError` or a `DecisionRefusedError` saying why
        (`NotAnApproverError`, `RunEndedError`, `ArgumentsChangedError`, …) and then
        records nothing.
        """
        return self.commands.decide(
            run_id, call_id, decision, actor=actor, reason=reason, args_sha256=args_sha256
        )

    def approve(self, run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
        return self.decide(run_id, call_id, "approve", actor=actor, reason=reason)

    def reject(self, run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
        return self.decide(run_id, call_id, "reject", actor=actor, reason=reason)

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        """Record a person's answers to a tool's questions, then wake the run.

        Returns False when the question was already answered (the first answers win).
        """
        return self.commands.answer(run_id, request_id, answers, actor=actor)

    def reconcile(
        self,
        run_id: str,
        call_id: str,
        outcome: Outcome,
        *,
        actor: str,
        result: Any = None,
        error: str | None = None,
    ) -> bool:
        """Say how a call whose outcome is unknown ended (its worker died while its handler
        ran: docs/humans.md, "Outcome unknown: no blind retry"), then wake the run.

        `succeeded`: `result` is recorded as the call's result; `failed`: the model is told
        `error`; `retry`: the handler runs again. Returns True once recorded; raises
        `InvalidRequestError`, `UnknownRunError`, `UnknownCallError` or
        `ReconcileRefusedError` (the actor may not decide, the call is not waiting for a
        decision: the first decision wins), and then records nothing.
        """
        decision = Reconciliation(outcome, actor, result, error)
        return self.commands.reconcile(run_id, call_id, decision)

    # --- the session runtime -----------------------------------------------------------

    def post_message(self, run_or_thread: str, text: str, *, target: str = "next-step") -> str:
        """Queue a message on a thread's inbox (by run or thread id); returns the thread.

        `next-step` steers the running turn at its next step boundary; `next-turn`
        becomes the next request when the turn ends, or starts a turn at once on an idle
        thread (durable threads: this process enqueues it).
        """
        return self.commands.post_message(run_or_thread, text, target=target)

    def cancel(self, run_id: str, cause: str = "user", *, keep_inbox: bool = False) -> list[str]:
        """Cancel a run and its children; each stops at its next boundary.

        Returns the ids of the runs asked to stop (none when the run already ended).
        """
        return self.commands.cancel(run_id, cause, keep_inbox=keep_inbox)

    # --- operator controls (agent_jobs/controls) ---------------------------------------

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        """Ask a run (and the runs it delegated to) to pause at its next step boundary:
        then it is `paused`, and nothing of it runs or holds a worker until `resume`.
        Returns the ids asked. Raises `UnknownRunError`, or `ControlRefusedError` for a
        run that has ended, is being cancelled, or is paused already (nothing changes)."""
        return self.commands.pause(run_id, actor=actor)

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        """Let a paused run (and its delegated runs) go on from where it stopped; returns
        the ids resumed. Raises `ControlRefusedError` for a run that is not paused."""
        return self.commands.resume(run_id, actor=actor)

    def retry(self, run_id: str, *, actor: str) -> controls.Retried:
        """Run the failed step of a run that failed on it (a dead letter, a step's error)
        again, with a fresh attempt count; the run's error is cleared and it goes on.
        Raises `ControlRefusedError` for any other run (nothing changes)."""
        return self.commands.retry(run_id, actor=actor)

    def fork(
        self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False
    ) -> controls.Forked:
        """A new run on a new thread that reuses run `run_id`'s journal before step `at`
        and goes on from there; `runs_again` lists the steps with side effects it will run
        again, `asked_again` the `action` calls a person is asked about again: a fork
        inherits no decision, unless `actor` may make it and `keep_decisions` keeps it as
        theirs (`kept_decisions`). Raises `InvalidRequestError` for a step it cannot fork
        at (not in the journal, inside a fan-out, …), `NotAnApproverError` for a
        decision `actor` may not keep, and `ControlRefusedError` (nothing is written)."""
        return self.commands.fork(run_id, at, actor=actor, keep_decisions=keep_decisions)

    def select_model(
        self,
        run_or_thread: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        reasoning_effort: str | None = None,
    ) -> str:
        """Switch a thread's model: it applies from the next step that assembles a prompt."""
        selection = session.ModelSelection(
            provider=provider, model=model, reasoning_effort=reasoning_effort
        )
        return self.commands.select_model(run_or_thread, selection)

    def events(self, run_or_thread: str) -> list[session.Event]:
        """The session log of a thread (or of the thread a run belongs to)."""
        with self.store.begin() as conn:
            thread_id, _ = session.resolve_thread(conn, run_or_thread)
            return session.thread_events(conn, thread_id)

    def status(self, run_or_thread: str) -> str:
        """`idle` or `running`: the thread's agent, folded from its session log."""
        with self.store.begin() as conn:
            thread_id, _ = session.resolve_thread(conn, run_or_thread)
            return session.fold_status(
                session.thread_events(conn, thread_id, types=[session.STATUS])
            )

    def when_idle(
        self, run_or_thread: str, timeout: float | None = None, *, poll: float = 0.05
    ) -> bool:
        """Block until the thread's agent is idle; at once if it is. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.status(run_or_thread) != "idle":
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True


_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client built from the settings on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client.from_settings()
        return _default


def enqueue_run(agent: str, input: str, **kwargs: Any) -> str:
    return default_client().enqueue_run(agent, input, **kwargs)


def get_run(run_id: str) -> RunView:
    return default_client().get_run(run_id)


def wait(run_id: str, timeout: float | None = None) -> RunView:
    return default_client().wait(run_id, timeout)


def decide(
    run_id: str,
    call_id: str,
    decision: Literal["approve", "reject"],
    *,
    actor: str,
    reason: str | None = None,
    args_sha256: str | None = None,
) -> bool:
    return default_client().decide(
        run_id, call_id, decision, actor=actor, reason=reason, args_sha256=args_sha256
    )


def answer(run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
    return default_client().answer(run_id, request_id, answers, actor=actor)


def reconcile(
    run_id: str,
    call_id: str,
    outcome: Outcome,
    *,
    actor: str,
    result: Any = None,
    error: str | None = None,
) -> bool:
    return default_client().reconcile(
        run_id, call_id, outcome, actor=actor, result=result, error=error
    )


def post_message(run_or_thread: str, text: str, *, target: str = "next-step") -> str:
    return default_client().post_message(run_or_thread, text, target=target)


def cancel(run_id: str, cause: str = "user", *, keep_inbox: bool = False) -> list[str]:
    return default_client().cancel(run_id, cause, keep_inbox=keep_inbox)


def events(run_or_thread: str) -> list[session.Event]:
    return default_client().events(run_or_thread)


def pause(run_id: str, *, actor: str) -> list[str]:
    return default_client().pause(run_id, actor=actor)


def resume(run_id: str, *, actor: str) -> list[str]:
    return default_client().resume(run_id, actor=actor)


def retry(run_id: str, *, actor: str) -> controls.Retried:
    return default_client().retry(run_id, actor=actor)


def fork(run_id: str, at: str, *, actor: str, keep_decisions: bool = False) -> controls.Forked:
    return default_client().fork(run_id, at, actor=actor, keep_decisions=keep_decisions)


def when_idle(run_or_thread: str, timeout: float | None = None) -> bool:
    return default_client().when_idle(run_or_thread, timeout)


def approve(run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
    return default_client().approve(run_id, call_id, actor=actor, reason=reason)


def reject(run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
    return default_client().reject(run_id, call_id, actor=actor, reason=reason)


__all__ = [
    "Client",
    "UnknownRunError",
    "answer",
    "approve",
    "cancel",
    "decide",
    "default_client",
    "enqueue_run",
    "events",
    "fork",
    "get_run",
    "pause",
    "post_message",
    "reconcile",
    "reject",
    "resume",
    "retry",
    "wait",
    "when_idle",
]
