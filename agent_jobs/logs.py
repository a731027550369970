"""Structured logs: one JSON object a line, tagged with the run and step being worked on.

`AGENT_JOBS_LOG_FORMAT=json` turns them on for the workers (through Celery's logging
signals, see `tasks/logs.py`) and for the approvals listener. The run and step come
from a context the task or the listener binds while it works on a run, from the
fields a caller passes with `extra=`, and from Celery's own task records. Known
secrets (the approval secret, API keys, passwords in URLs) are masked, and fields
whose names say they hold one are dropped.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from .dispatch import START_RUN
from .settings import SettingsBase

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"

_context: ContextVar[Mapping[str, Any] | None] = ContextVar("agent_jobs_log_context", default=None)
# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_STANDARD = frozenset(
    set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
)
_SECRET_WORDS = ("secret", "password", "passwd", "token", "api_key", "apikey", "authorization")


class LogSettings(SettingsBase):
    """`AGENT_JOBS_LOG_FORMAT` (`text` or `json`) and `AGENT_JOBS_LOG_LEVEL`."""

    log_format: LogFormat = "text"
    log_level: str = "INFO"


def bind(**fields: Any) -> Token[Mapping[str, Any] | None]:
    """Add fields (run_id, step, …) to every record logged in this context."""
    added = {k: v for k, v in fields.items() if v is not None}
    return _context.set({**(_context.get() or {}), **added})


def unbind(token: Token[Mapping[str, Any] | None]) -> None:
    _context.reset(token)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def _secret_name(key: str) -> bool:
    lowered = key.lower()
    return lowered == "sig" or any(word in lowered for word in _SECRET_WORDS)


def _literal(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _celery_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Task id, name, run and step from the `data` Celery attaches to its task records."""
    fields: dict[str, Any] = {"task_id": data.get("id"), "task": data.get("name")}
    args = _literal(data.get("args"))
    if isinstance(args, list | tuple):
        if args and isinstance(args[0], str):
            fields["run_id"] = args[0]
        if len(args) > 1 and isinstance(args[1], str):
            fields["step"] = args[1]
    kwargs = _literal(data.get("kwargs"))
    if isinstance(kwargs, dict):
        # Our step tasks show their arguments by name (agent_jobs.dispatch.step_reprs).
        for key in ("run_id", "step"):
            if isinstance(kwargs.get(key), str):
                fields[key] = kwargs[key]
    if data.get("name") == START_RUN:
        # Without a run_id, a started run is named after its task: its id is the task id.
        run_id = kwargs.get("run_id") if isinstance(kwargs, dict) else None
        fields["run_id"] = run_id if isinstance(run_id, str) and run_id else data.get("id")
    return {k: v for k, v in fields.items() if v is not None}


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: ts, level, logger, message, then run_id, step, …"""

    def __init__(self, redact: Iterable[str] = ()) -> None:
        super().__init__()
        # Short strings would mask ordinary words; real keys and secrets are long.
        self.redact = sorted({s for s in redact if len(s) >= 6}, key=len, reverse=True)

    def _mask(self, text: str) -> str:
        for secret in self.redact:
            text = text.replace(secret, MASK)
        return text

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": self._mask(record.getMessage()),
        }
        data = getattr(record, "data", None)
        if isinstance(data, Mapping):
            doc.update(_celery_fields(data))
        doc.update(_context.get() or {})
        for key, value in vars(record).items():
            if value is None or key in _STANDARD or key == "data" or key.startswith("_"):
                continue
            if _secret_name(key):
                continue
            doc[key] = self._mask(value) if isinstance(value, str) else value
        if record.exc_info:
            doc["exc"] = self._mask(self.formatException(record.exc_info))
        if record.stack_info:
            doc["stack"] = self._mask(self.formatStack(record.stack_info))
        return json.dumps(doc, ensure_ascii=False, default=str)


def known_secrets() -> list[str]:
    """Secret values this process knows of, to be masked wherever they appear."""
    from .models.registry import ProviderSettings
    from .settings import get_settings

    found: list[str] = []
    settings = get_settings()
    for secret in (
        settings.approval_secret,
        settings.database_password,
        settings.metrics_token,
        settings.webhook_secret,
    ):
        if secret is not None:
            found.append(secret.get_secret_value())
    if settings.api_tokens is not None:  # the HTTP API's bearer tokens (a JSON object)
        with contextlib.suppress(ValueError, AttributeError):
            found.extend(json.loads(settings.api_tokens.get_secret_value()).keys())
    for url in (
        settings.database_url,
        settings.broker_url,
        settings.redis_url,
        settings.webhook_url,
    ):
        password = urlsplit(url).password if url else None
        if password:
            found.append(password)
    providers = ProviderSettings()
    for name in type(providers).model_fields:
        value = getattr(providers, name)
        if hasattr(value, "get_secret_value"):
            found.append(value.get_secret_value())
    return found


def json_formatter() -> JsonFormatter:
    return JsonFormatter(redact=known_secrets())


def use_json(logger: logging.Logger) -> None:
    """Give every handler of `logger` the JSON formatter (Celery set them up)."""
    formatter = json_formatter()
    for handler in logger.handlers:
        handler.setFormatter(formatter)


def configure_logging(fmt: LogFormat | None = None, level: str | None = None) -> None:
    """Log to stderr in the configured format (a process that is not a Celery worker)."""
    settings = LogSettings()
    fmt = fmt or settings.log_format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_agent_jobs", False)]:
        root.removeHandler(old)
    handler._agent_jobs = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel((level or settings.log_level).upper())
