"""`agent_jobs.client`: start runs, read them, decide on their actions — from any process.

The module-level functions use a default `Client` built from the settings
(`AGENT_JOBS_DATABASE_URL`, `AGENT_JOBS_BROKER_URL`, `AGENT_JOBS_APP`).
"""

from __future__ import annotations

import threading
import time
from typing import Literal

from .app import AgentApp, load_app
from .approvals import record_decision
from .errors import UnknownRunError
from .hooks import Decision
from .settings import Settings, get_settings
from .store import RunView, Store


class Client:
    """A handle on one deployment: its store, its app, and (when durable) its broker."""

    def __init__(self, store: Store, app: AgentApp, settings: Settings | None = None) -> None:
        self.store = store
        self.app = app
        self.settings = settings or get_settings()

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Client:
        settings = settings or get_settings()
        return cls(Store.from_url(settings.database_url), load_app(settings.app), settings)

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

        Raises `UnknownRunError`, `UnknownCallError` or `DecisionRefusedError` (an actor
        without an approver role, arguments that changed) and then records nothing.
        """
        verdict = Decision(decision=decision, actor=actor, reason=reason)
        with self.store.begin() as conn:
            outcome = record_decision(
                conn, self.app, run_id, call_id, verdict, expected_args_sha256=args_sha256
            )
        return outcome == "recorded"

    def approve(self, run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
        return self.decide(run_id, call_id, "approve", actor=actor, reason=reason)

    def reject(self, run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
        return self.decide(run_id, call_id, "reject", actor=actor, reason=reason)


_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client built from the settings on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client.from_settings()
        return _default


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


def approve(run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
    return default_client().approve(run_id, call_id, actor=actor, reason=reason)


def reject(run_id: str, call_id: str, *, actor: str, reason: str | None = None) -> bool:
    return default_client().reject(run_id, call_id, actor=actor, reason=reason)


__all__ = [
    "Client",
    "UnknownRunError",
    "approve",
    "decide",
    "default_client",
    "get_run",
    "reject",
    "wait",
]
