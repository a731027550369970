"""The server's door to the runs: one interface, the durable runner's here.

The HTTP API speaks to runs only through a `Door`. With a broker (`AGENT_JOBS_BROKER_URL`)
it is `DurableDoor`: runs go to the Celery workers through the client, frames are read
from Redis. Without one, `agent-jobs serve` gives it the inline runner's door
(`agent_jobs/cli/serve.py`: only the command line and the package root reach a runner).
"""

from __future__ import annotations

import re
from typing import Any, Literal, Protocol

import redis

from ..app import AgentApp
from ..client import Client
from ..controls import Forked, Retried
from ..reconciliation import Reconciliation
from ..runs import RunRequest
from ..settings import Settings
from ..store import Store
from ..streams.base import StreamBackend
from ..streams.redis_streams import RedisStreams

# The server's Redis connections are named, so an operator (and a test) can find them
# in `CLIENT LIST`.
REDIS_CLIENT_NAME = "agent-jobs-serve"


class Door(Protocol):
    """What the HTTP API needs of a runner: start, decide, steer, cancel, read frames."""

    runner: str  # the runner this server starts runs on: "durable" or "inline"
    store: Store
    app: AgentApp
    streams: StreamBackend  # where the frames of this runner's runs are read
    entry_id: re.Pattern[str]  # what an entry id of those streams looks like

    def admit(self, request: RunRequest) -> tuple[str, bool]:
        """Start the run (or find it, by its run id): (run id, whether it is new)."""
        ...

    def decide(
        self,
        run_id: str,
        call_id: str,
        decision: Literal["approve", "reject"],
        *,
        actor: str,
        reason: str | None,
        args_sha256: str | None,
    ) -> bool:
        """Record a decision, then release the run; False if another came first."""
        ...

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        """Record answers, then release the run; False if answered already."""
        ...

    def reconcile(self, run_id: str, call_id: str, decision: Reconciliation) -> bool:
        """Record how a call whose outcome is unknown ended, then release the run; a call
        not waiting for that is refused (`ReconcileRefusedError`)."""
        ...

    def post_message(self, run_id: str, text: str, *, target: str) -> str:
        """Queue a message on the run's thread; returns the thread id."""
        ...

    def cancel(self, run_id: str, *, keep_inbox: bool) -> list[str]:
        """Ask the run and its children to stop; the ids asked (none if it has ended)."""
        ...

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        """Ask the run and its children to pause at their next step boundary; the ids."""
        ...

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        """Let the paused run and its children go on; the ids resumed."""
        ...

    def retry(self, run_id: str, *, actor: str) -> Retried:
        """Run the failed step of a run that failed on it again; the run goes on."""
        ...

    def fork(self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False) -> Forked:
        """A new run on a new thread from the run's journal before step `at`."""
        ...

    def close(self) -> None: ...


class DurableDoor:
    """Runs on the Celery workers, through `agent_jobs.client`; frames from Redis Streams."""

    runner = "durable"
    entry_id = re.compile(r"^\d{1,20}(-\d{1,20})?$")

    def __init__(self, client: Client, streams: RedisStreams) -> None:
        self.client = client
        self.store = client.store
        self.app = client.app
        self.streams: StreamBackend = streams
        self._redis = streams.client

    @classmethod
    def from_settings(cls, settings: Settings, client: Client, max_streams: int) -> DurableDoor:
        """The door of `client`, reading frames from the configured Redis with a pool
        large enough for `max_streams` readers waiting at once."""
        url = settings.effective_redis_url
        assert url is not None, "a durable door needs a broker"
        connection = redis.Redis.from_url(
            url, max_connections=max_streams + 32, client_name=REDIS_CLIENT_NAME
        )
        streams = RedisStreams(connection, maxlen=settings.stream_maxlen, ttl=settings.stream_ttl)
        return cls(client, streams)

    def admit(self, request: RunRequest) -> tuple[str, bool]:
        return self.client.admit(request)

    def decide(
        self,
        run_id: str,
        call_id: str,
        decision: Literal["approve", "reject"],
        *,
        actor: str,
        reason: str | None,
        args_sha256: str | None,
    ) -> bool:
        return self.client.decide(
            run_id, call_id, decision, actor=actor, reason=reason, args_sha256=args_sha256
        )

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        return self.client.answer(run_id, request_id, answers, actor=actor)

    def reconcile(self, run_id: str, call_id: str, decision: Reconciliation) -> bool:
        d = decision
        return self.client.reconcile(
            run_id, call_id, d.outcome, actor=d.actor, result=d.result, error=d.error
        )

    def post_message(self, run_id: str, text: str, *, target: str) -> str:
        return self.client.post_message(run_id, text, target=target)

    def cancel(self, run_id: str, *, keep_inbox: bool) -> list[str]:
        return self.client.cancel(run_id, "user", keep_inbox=keep_inbox)

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        return self.client.pause(run_id, actor=actor)

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        return self.client.resume(run_id, actor=actor)

    def retry(self, run_id: str, *, actor: str) -> Retried:
        return self.client.retry(run_id, actor=actor)

    def fork(self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False) -> Forked:
        return self.client.fork(run_id, at, actor=actor, keep_decisions=keep_decisions)

    def close(self) -> None:
        self._redis.close()
        if self.client.dispatcher is not None:
            self.client.dispatcher.celery.close()
        self.store.engine.dispose()
