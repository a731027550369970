"""What every command shares: settings, the app, the store, errors as one line."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn, ParamSpec, TypeVar

import click
from rich.console import Console

from ..app import AgentApp, load_app
from ..client import Client
from ..dispatch import CeleryDispatcher, celery_client
from ..errors import AgentJobsError, DecisionRefusedError, InvalidRequestError, UnknownRunError
from ..redis_streams import RedisStreams
from ..settings import Settings, get_settings
from ..store import Store

P = ParamSpec("P")
R = TypeVar("R")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# Exit codes: 1 the run failed; 2 bad input or configuration; 3 not found.
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    sys.exit(code)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the library's typed errors into a one-line message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except UnknownRunError as exc:
            fail(str(exc), EXIT_NOT_FOUND)
        except (InvalidRequestError, DecisionRefusedError) as exc:
            fail(str(exc), EXIT_USAGE)
        except AgentJobsError as exc:
            fail(str(exc), EXIT_USAGE)

    return wrapper


def settings() -> Settings:
    return get_settings()


def app() -> AgentApp:
    """The configured app; the bundled demo runs on `AGENT_JOBS_MODEL` when one is set."""
    config = settings()
    if not config.app:
        from ..models.registry import default_model_from_settings

        # At the terminal an unusable AGENT_JOBS_MODEL is an error, not a quiet fallback
        # to the scripted demo (which `load_app` allows a process without the key).
        default_model_from_settings()
    return load_app(config.app)


def store() -> Store:
    return Store.from_url(settings().database_url)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def durable_client() -> Client:
    """A client that enqueues on the broker; refuses without AGENT_JOBS_BROKER_URL."""
    config = settings()
    if not config.broker_url:
        fail(
            "this command needs the durable runner: set AGENT_JOBS_BROKER_URL "
            "(without a broker, `agent-jobs run` runs the agent in this process)"
        )
    return Client(store(), app(), config, CeleryDispatcher(celery_client(config.broker_url)))


def redis_streams() -> RedisStreams:
    """The live streams on the configured Redis; refuses when none is configured."""
    config = settings()
    url = config.effective_redis_url
    if not url:
        fail("the live stream needs Redis: set AGENT_JOBS_REDIS_URL or AGENT_JOBS_BROKER_URL")
    return RedisStreams.from_url(url, maxlen=config.stream_maxlen, ttl=config.stream_ttl)
