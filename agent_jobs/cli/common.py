"""What every command shares: settings, the app, the store, errors as one line."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn, ParamSpec, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
import kombu.exceptions
import pydantic
import redis.exceptions
import sqlalchemy.exc
from rich.console import Console
from rich.text import Text

from .. import startup
from ..app import AgentApp
from ..client import Client
from ..dispatch import CeleryDispatcher, celery_client
from ..errors import AgentJobsError, InvalidRequestError, UnknownRunError
from ..loading import load_app
from ..logs import known_secrets
from ..runners import InlineRunner
from ..settings import Settings, get_settings
from ..store import Store
from ..streams.redis_streams import RedisStreams
from .text import visible

P = ParamSpec("P")
R = TypeVar("R")

# No markup and no emoji codes: what is printed is often a run's own text, and a
# "[/x]" or ":warning:" in it must be shown as it is. Styles are given as `style=`.
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)

# Exit codes: 1 the run failed or was cancelled; 2 bad input, configuration or a refused
# decision; 3 not found; 4 the run waits for a person (no terminal here to ask);
# 5 a service is unreachable (the database, the broker or Redis).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_WAITING = 4
EXIT_UNAVAILABLE = 5
EXIT_ALREADY_DECIDED = 6  # a decision or answers came after the first: nothing changed

DATABASE_ERRORS: tuple[type[Exception], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)
# Narrower than what a send may raise: an unrelated OSError is not "Redis is down".
REDIS_ERRORS: tuple[type[Exception], ...] = (
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `error: MESSAGE` on one line of stderr and exit with `code`."""
    err.print(Text.assemble(("error:", "red"), " ", visible(redact(message))))
    sys.exit(code)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the library's typed errors, and services that cannot be reached, into a
    one-line message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except AgentJobsError as exc:
            fail(str(exc), exit_code_of(exc))
        except DATABASE_ERRORS as exc:
            fail(unreachable(exc), EXIT_UNAVAILABLE)
        except REDIS_ERRORS as exc:
            fail(unreachable(exc), EXIT_UNAVAILABLE)
        except pydantic.ValidationError as exc:
            if exc.title != Settings.__name__:
                raise
            fail(bad_settings(exc), EXIT_USAGE)

    return wrapper


# The exit code of each of the library's errors, the first that matches: an unknown run
# is 3; every other refusal (bad input, a forbidden or conflicting request) is 2. The
# commands check nothing the domain checks: its typed refusals are mapped here alone.
EXIT_CODES: tuple[tuple[type[AgentJobsError], int], ...] = ((UnknownRunError, EXIT_NOT_FOUND),)


def exit_code_of(exc: AgentJobsError) -> int:
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), EXIT_USAGE)


def bad_settings(exc: pydantic.ValidationError) -> str:
    """What is wrong with the settings, a setting at a time, by its variable's name; never
    the value given (it may be a secret)."""
    faults = []
    for error in exc.errors(include_input=False, include_url=False):
        name = "AGENT_JOBS_" + "_".join(str(part) for part in error["loc"][:1]).upper()
        faults.append(f"{name}: {error['msg']}")
    return "invalid settings: " + "; ".join(faults)


def unreachable(exc: Exception) -> str:
    """Which service could not be reached, where (no password), and what it said."""
    try:
        config: Settings | None = settings()
    except Exception:  # the settings themselves may be what is broken
        config = None
    if isinstance(exc, DATABASE_ERRORS):
        what, url = "the database", config.database_url if config else None
        cause: object = getattr(exc, "orig", None) or exc
    elif isinstance(exc, kombu.exceptions.OperationalError):
        what, url, cause = "the broker", config.broker_url if config else None, exc
    else:
        what, url, cause = "Redis", config.effective_redis_url if config else None, exc
    where = f" ({safe_url(url)})" if url else ""
    said = str(cause).strip().splitlines()
    return f"{what}{where} is unreachable: {said[0] if said else type(cause).__name__}"


def safe_url(url: str) -> str:
    """`url` with its password masked."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "(an unparsable URL)"
    if not password:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def redact(text: str) -> str:
    """`text` with the secrets this process knows of masked: the passwords of the
    configured URLs, the approval secret, provider keys."""
    try:
        config = settings()
        urls = [u for u in (config.database_url, config.broker_url, config.redis_url) if u]
        passwords = {p for p in (urlsplit(u).password for u in urls) if p}
        others = set(known_secrets()) - passwords
    except Exception:  # unreadable settings: there is nothing known to mask
        return text
    # A URL's password only where it stands in a URL: a password such as "postgres"
    # is also a user name and a word. Keys are long and random: masked anywhere.
    for password in passwords:
        text = text.replace(f":{password}@", ":***@")
    for secret in sorted((s for s in others if len(s) >= 8), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return visible(redact(f"{record.levelname.lower()}: {super().format(record)}"), keep="\n")


def report_warnings() -> None:
    """Show this library's warnings (a broker that did not take a message, a stream that
    could not be written) as `warning: …` lines on stderr.

    The handler is marked as this project's, so `configure_logging` (the listener's)
    replaces it instead of logging twice.
    """
    root = logging.getLogger()
    if any(getattr(h, "_agent_jobs", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.addFilter(logging.Filter("agent_jobs"))
    handler.setFormatter(_OneLine())
    handler._agent_jobs = True  # type: ignore[attr-defined]
    root.addHandler(handler)


def settings() -> Settings:
    return get_settings()


def app() -> AgentApp:
    """The configured app; the bundled demo runs on `AGENT_JOBS_MODEL` when one is set.

    At the terminal an unusable AGENT_JOBS_MODEL is an error, not a quiet fallback to
    the scripted demo (which `load_app` allows a process without the key).
    """
    return load_app(settings().app, strict_model=True)


def store() -> Store:
    return Store.from_url(settings().database_url)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def agent_named(agent: str | None, loaded: AgentApp) -> str:
    """The agent `--agent` names; without it, the `loaded` app's only agent, or `support`
    (the demo's) among several; else `InvalidRequestError` listing them."""
    if agent is not None:
        return agent
    names = list(loaded.agents)
    if len(names) == 1:
        return names[0]
    if "support" in names:
        return "support"
    raise InvalidRequestError(
        f"this app defines several agents ({', '.join(names)}): name one with --agent"
    )


def inline_runner() -> InlineRunner:
    """The inline runner of this process (no broker: it drives the run here), with the
    process's services started (its runs' notifications, diagnostics, tracing)."""
    config = settings()
    runner = InlineRunner(app(), store(), settings=config)
    startup.start(runner.store, config)
    return runner


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
