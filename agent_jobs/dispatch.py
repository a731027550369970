"""How the durable runner reaches Celery: by task name, JSON only, never importing `tasks`."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import redis
from celery import Celery, group
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError

from .transport import transport_for, transport_options

START_RUN = "agent_jobs.start_run"
COORDINATE = "agent_jobs.coordinate"
MODEL_TURN = "agent_jobs.model_turn"
INVOKE_TOOL = "agent_jobs.invoke_tool"
SWEEP = "agent_jobs.sweep"
QUEUE = "agent_jobs"

log = logging.getLogger(__name__)

# What a send raises when the broker cannot be reached (kombu wraps the connection
# errors it gave up retrying; redis-py and the socket layer may surface directly).
BROKER_ERRORS: tuple[type[Exception], ...] = (OperationalError, redis.RedisError, OSError)


def task_queues(queue: str) -> list[Queue]:
    """The queue every task goes to, on the anonymous exchange.

    Routing by queue name needs no binding kept in Redis, so a broker that lost
    everything (restarted empty, FLUSHALL) still delivers the sweep's re-drives.
    """
    return [Queue(queue, Exchange("", type="direct"), routing_key=queue)]


def routing_config(queue: str | None = None) -> dict[str, Any]:
    """Serialisation and routing settings every Celery app of this project shares.

    `queue` defaults to `AGENT_JOBS_QUEUE`.
    """
    if queue is None:
        from .settings import get_settings

        queue = get_settings().queue
    return {
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "event_serializer": "json",
        "task_queues": task_queues(queue),
        "task_default_queue": queue,
        "task_default_exchange": "",
        "task_default_routing_key": queue,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
    }


# --- what Flower shows of a task -----------------------------------------------------------
#
# A task's arguments are `(run_id, step)`; shown as they are, the 32-character run id comes
# first and the step is cut off. Shown instead: what a person looks for first, the step
# (and a tool call's tool) then the run, cut short (`model:2 · run 6b79ab12…`); the
# arguments whole, by name, as the task's kwargs (`{'run_id': '…', 'step': 'model:2'}`),
# which Flower's search finds (`kwargs:run_id=…`). Display only: a worker acts on the
# message's real arguments.

# A generated id (a UUID, with or without its dashes) is told apart by its first 8
# characters; an id someone chose (`ticket-2026-0417`, up to 64 characters) is shown
# whole: ids of one kind often share a long prefix.
_GENERATED = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def short_run_id(run_id: str) -> str:
    return run_id[:8] + "…" if _GENERATED.fullmatch(run_id) else run_id


def run_label(head: str, run_id: str | None) -> str:
    """`<head> · run <run id, cut short>`: `model:2 · run 6b79ab12…`."""
    return f"{head} · run {short_run_id(run_id)}" if run_id else head


def step_label(task: str, run_id: str, step: str | None = None, tool: str | None = None) -> str:
    """A coordinate or step task's arguments as Flower shows them: `coordinate · run …`,
    `model:2 · run …`, `tool:call_3 lookup_order · run …`."""
    head = step or task.rsplit(".", 1)[-1]
    return run_label(f"{head} {tool}" if tool else head, run_id)


def step_reprs(
    task: str, run_id: str, step: str | None = None, tool: str | None = None
) -> tuple[str, str]:
    """The `argsrepr` and `kwargsrepr` of a coordinate or step task."""
    named = {"run_id": run_id} if step is None else {"run_id": run_id, "step": step}
    return step_label(task, run_id, step, tool), repr(named)


def start_run_label(kwargs: Any, task_id: str) -> str:
    """A `start_run` task's arguments as Flower shows them: `start_run support · run …`
    (the run is named after the task unless the request names it). Built from what was
    sent, checked or not: display only."""
    agent = kwargs.get("agent") if isinstance(kwargs, Mapping) else None
    run_id = kwargs.get("run_id") if isinstance(kwargs, Mapping) else None
    head = f"start_run {agent[:64]}" if isinstance(agent, str) and agent else "start_run"
    return run_label(head, run_id[:64] if isinstance(run_id, str) and run_id else task_id)


# A run request's payloads: with encryption at rest on, Flower shows them as `…`.
_SEALED_KWARGS = ("input", "metadata")


def start_run_kwargs(kwargs: Any) -> str | None:
    """A `start_run` task's keyword arguments as Flower shows them: with encryption at
    rest on, its payloads (input, metadata) left out (docs/security.md, "Encryption at
    rest"); else None (as sent)."""
    from .encryption import keyring

    if not keyring().encrypting or not isinstance(kwargs, Mapping):
        return None
    return repr({k: "…" if k in _SEALED_KWARGS else v for k, v in kwargs.items()})


def tool_of(intent: Any) -> str | None:
    """The tool a remote step's intent (as journaled) calls, if it calls one."""
    if isinstance(intent, Mapping) and intent.get("type") == "invoke_tool":
        call = intent.get("call")
        name = call.get("name") if isinstance(call, Mapping) else None
        return name if isinstance(name, str) else None
    return None


def tools_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Step name to tool, of the journal rows (as inserted) that call a tool."""
    return {row["step"]: tool for row in rows if (tool := tool_of(row.get("intent")))}


def own_queue(name: str) -> tuple[str, str | None]:
    """A step's task name as sent (`task` or `task@queue`): the task, and its own queue."""
    task, _, queue = name.partition("@")
    return task, queue or None


class Dispatcher(Protocol):
    """Enqueues work; called only after the transaction that scheduled it committed."""

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None: ...

    def steps(
        self, run_id: str, steps: Sequence[tuple[str, str]], *, countdown: float | None = None
    ) -> None:
        """Enqueue remote steps given as (task name, step name); several go as one group.
        A task name `task@queue` goes to that queue (a tool's own); the others to the
        workers' queue. With `countdown`, they are delivered no sooner than that many
        seconds from now."""
        ...


def celery_client(broker_url: str, queue: str | None = None) -> Celery:
    """A Celery app that only sends: JSON only, no result backend."""
    client = Celery("agent_jobs_client", broker=broker_url, set_as_current=False)
    client.conf.update(routing_config(queue))
    if (transport := transport_for(broker_url)) is not None:
        client.conf.broker_transport = transport
    client.conf.broker_transport_options = transport_options()
    return client


class CeleryDispatcher:
    """Sends tasks by name with `(run_id, step)` alone: the journal holds the rest."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery
        self.queue: str = celery.conf.task_default_queue or QUEUE

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        argsrepr, kwargsrepr = step_reprs(COORDINATE, run_id)
        self.celery.send_task(
            COORDINATE,
            args=[run_id],
            queue=self.queue,
            countdown=countdown,
            argsrepr=argsrepr,
            kwargsrepr=kwargsrepr,
        )

    def steps(
        self,
        run_id: str,
        steps: Sequence[tuple[str, str]],
        *,
        countdown: float | None = None,
        tools: Mapping[str, str] | None = None,
    ) -> None:
        """`Dispatcher.steps`; `tools` names the tool of a tool call's step, for Flower."""
        if not steps:
            return
        tools = tools or {}
        if len(steps) == 1:
            task, queue = self._route(steps[0][0])
            step = steps[0][1]
            argsrepr, kwargsrepr = step_reprs(task, run_id, step, tools.get(step))
            # Celery takes a Queue where its stubs say str.
            self.celery.send_task(
                task,
                args=[run_id, step],
                queue=queue,  # type: ignore[arg-type]
                countdown=countdown,
                argsrepr=argsrepr,
                kwargsrepr=kwargsrepr,
            )
            return
        # A fan-out of reads: one group, every member re-drives the run when it ends.
        # No chord: the coordinator itself notices when all have settled.
        signatures: list[Any] = [
            self.celery.signature(
                task, args=[run_id, step], queue=queue, argsrepr=shown[0], kwargsrepr=shown[1]
            )
            for (task, queue), step in ((self._route(name), step) for name, step in steps)
            for shown in [step_reprs(task, run_id, step, tools.get(step))]
        ]
        if countdown is None:
            group(signatures).apply_async()
        else:
            group(signatures).apply_async(countdown=countdown)

    def _route(self, name: str) -> tuple[str, str | Queue]:
        task, queue = own_queue(name)
        if queue is None:
            return task, self.queue
        # On the anonymous exchange too: no binding in Redis to lose.
        return task, task_queues(queue)[0]

    def start_run(self, kwargs: dict[str, Any], *, task_id: str | None = None) -> str:
        task_id = task_id or str(uuid.uuid4())
        result = self.celery.send_task(
            START_RUN,
            kwargs=kwargs,
            task_id=task_id,
            queue=self.queue,
            argsrepr=start_run_label(kwargs, task_id),
            kwargsrepr=start_run_kwargs(kwargs),
        )
        return str(result.id)


class ResendingDispatcher:
    """A dispatcher whose sends never fail the caller: one the broker refuses is kept
    and sent again in the background until the broker is back.

    Every send here follows a commit that already recorded what it announces, so a
    lost send delays a run and never loses it: the sweep would find the work too. This
    only makes the wait as short as the outage. A process that dies with sends still
    kept leaves them to the sweep. Repeating a send is harmless (steps and re-drives
    are idempotent), so nothing here needs to know whether a failed send got through.
    """

    def __init__(
        self,
        inner: Dispatcher,
        *,
        retry_every: float = 0.5,
        max_backoff: float = 5.0,
        max_kept: int = 10_000,
    ) -> None:
        self.inner = inner
        self.retry_every = retry_every
        self.max_backoff = max_backoff
        self._kept: deque[tuple[Callable[[], None], str]] = deque(maxlen=max_kept)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        due = None if countdown is None else time.monotonic() + countdown

        def send() -> None:
            left = None if due is None else max(0.0, due - time.monotonic())
            self.inner.coordinate(run_id, countdown=left)

        self._send(send, f"re-drive of run {run_id}")

    def steps(
        self,
        run_id: str,
        steps: Sequence[tuple[str, str]],
        *,
        countdown: float | None = None,
        tools: Mapping[str, str] | None = None,
    ) -> None:
        """`Dispatcher.steps`; `tools` (step to tool, for Flower) reaches a Celery
        dispatcher only: another dispatcher has no use for it."""
        if not steps:
            return
        chosen = list(steps)
        names = " ".join(step for _, step in chosen)
        inner = self.inner
        if tools and isinstance(inner, CeleryDispatcher):
            named = dict(tools)
            self._send(
                lambda: inner.steps(run_id, chosen, countdown=countdown, tools=named),
                f"{names} of run {run_id}",
            )
        elif countdown is None:
            self._send(lambda: inner.steps(run_id, chosen), f"{names} of run {run_id}")
        else:
            self._send(
                lambda: inner.steps(run_id, chosen, countdown=countdown),
                f"{names} of run {run_id}",
            )

    @property
    def kept(self) -> int:
        """How many sends wait for the broker to come back."""
        with self._lock:
            return len(self._kept)

    def _send(self, send: Callable[[], None], what: str) -> None:
        with self._lock:
            queued = bool(self._kept)
        if not queued:
            try:
                send()
                return
            except BROKER_ERRORS as exc:
                log.warning(
                    "the broker refused the %s (%s); sending it again when it is back", what, exc
                )
        # Behind earlier sends that wait: a run's sends keep their order.
        with self._lock:
            if len(self._kept) == self._kept.maxlen:
                _, dropped = self._kept[0]
                log.warning(
                    "too many sends wait for the broker: the %s is left to the sweep", dropped
                )
            self._kept.append((send, what))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._resend, name="agent-jobs-resend", daemon=True
                )
                self._thread.start()

    def _resend(self) -> None:
        delay = self.retry_every
        while True:
            time.sleep(delay)
            while True:
                with self._lock:
                    if not self._kept:
                        self._thread = None
                        return
                    send, what = self._kept[0]
                try:
                    send()
                except BROKER_ERRORS as exc:
                    log.debug("the broker still refuses the %s: %s", what, exc)
                    delay = min(delay * 2, self.max_backoff)
                    break
                except Exception:
                    log.exception("could not send the %s; it is left to the sweep", what)
                else:
                    log.info("sent the %s now that the broker is back", what)
                    delay = self.retry_every
                with self._lock:
                    if self._kept and self._kept[0][0] is send:
                        self._kept.popleft()
