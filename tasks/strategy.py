"""The workers' task strategy: a malformed message is dead-lettered, never fatal.

Celery unpacks a task message in the worker's main process. A body that is not
`[args, kwargs, embed]` (a string, `null`, `{}`, a list of two or four) or a header that
is not what the protocol says raises there, outside every handler, and the worker dies
("Unrecoverable error"); the message goes back to the queue and kills every worker that
takes it next. Any Celery client can send one by mistake, to our queue or to the
`celery` queue the workers also read. Here each message of our tasks is checked before
Celery unpacks it: a bad one is logged, kept in the Redis list `agent_jobs:dead_tasks`
for a person to look at, and acknowledged; everything else goes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from numbers import Real
from typing import Any

import redis
from celery import Celery, Task
from celery.worker.strategy import default

from .base import main_redis

log = logging.getLogger(__name__)

DEAD_TASKS = "agent_jobs:dead_tasks"
DEAD_TASKS_MAXLEN = 10_000
KEPT_BODY_BYTES = 64 * 1024
_EMBED_LISTS = ("callbacks", "errbacks", "chain")


def message_problem(headers: Any, payload: Any) -> str | None:
    """What is wrong with a task message of protocol 2 (or 1), or None if nothing."""
    if not isinstance(headers, Mapping):
        return "the headers are not an object"
    if "task" not in headers:
        return _protocol1_problem(payload)
    return _header_problem(headers) or _body_problem(payload)


def _header_problem(headers: Mapping[str, Any]) -> str | None:
    """What is wrong with protocol 2 headers (`id` first)."""
    if not isinstance(headers.get("id"), str) or not headers["id"]:
        return "the header `id` must be a non-empty string"
    limits = headers.get("timelimit")
    if limits is not None and not (
        isinstance(limits, list | tuple)
        and len(limits) == 2
        and all(v is None or (isinstance(v, Real) and not isinstance(v, bool)) for v in limits)
    ):
        return "the header `timelimit` must be [hard, soft] seconds"
    retries = headers.get("retries")
    if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool)):
        return "the header `retries` must be an integer"
    for key in ("shadow", "root_id", "parent_id", "group", "argsrepr", "kwargsrepr"):
        if headers.get(key) is not None and not isinstance(headers[key], str):
            return f"the header `{key}` must be a string"
    return None


def _body_problem(payload: Any) -> str | None:
    """What is wrong with a protocol 2 body, `[args, kwargs, embed]`."""
    if not isinstance(payload, list | tuple) or len(payload) != 3:
        shape = f"a list of {len(payload)}" if isinstance(payload, list | tuple) else "not a list"
        return f"the body must be [args, kwargs, embed], not {shape}"
    args, kwargs, embed = payload
    if not isinstance(args, list | tuple):
        return "args must be a list"
    if not isinstance(kwargs, Mapping):
        return "kwargs must be an object"
    return _embed_problem(embed)


def _embed_problem(embed: Any) -> str | None:
    """What is wrong with a body's `embed` (the callbacks, the chain, the chord)."""
    if embed is None:
        return None
    if not isinstance(embed, Mapping):
        return "embed must be an object or null"
    for key in _EMBED_LISTS:
        if embed.get(key) is not None and not isinstance(embed[key], list):
            return f"embed.{key} must be a list or null"
    if embed.get("chord") is not None and not isinstance(embed["chord"], Mapping):
        return "embed.chord must be an object or null"
    return None


def _protocol1_problem(payload: Any) -> str | None:
    if not isinstance(payload, Mapping):
        return "neither protocol 2 headers nor a protocol 1 body"
    if not isinstance(payload.get("id"), str) or not payload["id"]:
        return "the protocol 1 body needs an `id` string"
    if not isinstance(payload.get("args", []), list | tuple):
        return "args must be a list"
    if not isinstance(payload.get("kwargs", {}), Mapping):
        return "kwargs must be an object"
    return None


def keep_aside(entry: dict[str, Any]) -> bool:
    """Keep a refused message in the Redis list (newest first, bounded)."""
    try:
        pipe = main_redis().pipeline(transaction=False)
        pipe.lpush(DEAD_TASKS, json.dumps(entry, default=str, ensure_ascii=False))
        pipe.ltrim(DEAD_TASKS, 0, DEAD_TASKS_MAXLEN - 1)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not keep a refused task message in %s: %s", DEAD_TASKS, exc)
        return False
    return True


def _entry(message: Any, reason: str) -> dict[str, Any]:
    raw = message.body
    body = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    delivery = message.delivery_info or {}
    return {
        "at": time.time(),
        "reason": reason,
        "task": str(headers.get("task", ""))[:200],
        "id": str(headers.get("id", ""))[:200],
        "queue": delivery.get("routing_key"),
        "content_type": message.content_type,
        "headers": {str(k)[:100]: repr(v)[:500] for k, v in list(headers.items())[:50]},
        "body": body[:KEPT_BODY_BYTES],
    }


def guarded(task: Task[Any, Any], app: Celery, consumer: Any, **options: Any) -> Callable[..., Any]:
    """Celery's default strategy behind a check of each message's shape."""
    handle = default(task, app, consumer, **options)
    connection_errors = consumer.connection_errors

    def task_message_handler(
        message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any
    ) -> Any:
        try:
            payload = body if body is not None else message.payload
        except Exception as exc:  # undecodable, or a serializer we do not accept
            reason = f"the body cannot be decoded: {type(exc).__name__}: {exc}"
        else:
            problem = message_problem(message.headers, payload)
            if problem is None:
                return handle(message, body, ack, reject, callbacks, **kwargs)
            reason = problem
        entry = _entry(message, reason)
        kept = keep_aside(entry)
        log.error(
            "refused a malformed %s message %s: %s; %s",
            entry["task"] or "task",
            entry["id"] or "(no id)",
            reason,
            f"kept in {DEAD_TASKS}" if kept else "dropped",
            extra={"task": entry["task"], "task_id": entry["id"]},
        )
        ack(log, connection_errors)
        return None

    return task_message_handler
