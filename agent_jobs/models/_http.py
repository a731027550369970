"""HTTP-level helpers shared by the provider adapters: error kinds, Retry-After, secrets."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

from ..errors import ModelErrorKind

T = TypeVar("T")

# Wording that providers use when the prompt does not fit the model's context window
# (OpenAI and vLLM: "maximum context length", Anthropic: "prompt is too long").
_CONTEXT_WORDING = re.compile(
    r"context[_ ]length|context window|maximum context|prompt is too long|too many tokens",
    re.IGNORECASE,
)

# Anthropic's error types, also sent as `error` events in the middle of a stream.
_ERROR_TYPE_KINDS: dict[str, ModelErrorKind] = {
    "rate_limit_error": "rate_limit",
    "overloaded_error": "overload",
    "api_error": "overload",
    "timeout_error": "timeout",
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "auth",
    "invalid_request_error": "invalid_request",
    "not_found_error": "invalid_request",
    "request_too_large": "context_length",
}

REDACTED = "[redacted]"


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date)."""
    if not headers:
        return None
    lowered = {key.lower(): value for key, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(
    status: int | None,
    *,
    code: str | None = None,
    error_type: str | None = None,
    message: str = "",
) -> ModelErrorKind:
    """The waterfall kind of a provider's error answer.

    `status` is None for an error that arrived inside a stream; then the provider's
    error type decides.
    """
    wording = " ".join(part for part in (code, error_type, message) if part)
    if code == "context_length_exceeded" or (
        status in (400, 413, None) and _CONTEXT_WORDING.search(wording)
    ):
        return "context_length"
    if code == "insufficient_quota":
        # OpenAI sends it as a 429, but waiting does not refill a spent balance.
        return "auth"
    if status == 429:
        return "rate_limit"
    if status in (401, 402, 403):
        # 402: OpenRouter's "insufficient credits" is an account problem, like bad keys.
        return "auth"
    if status == 413:
        return "context_length"
    if status in (408, 504):
        return "timeout"
    if status is not None and status >= 500:
        # 503/529 are the documented overload answers; other 5xx are transient too.
        return "overload"
    if status is not None and 400 <= status < 500:
        return "invalid_request"
    if error_type in _ERROR_TYPE_KINDS:
        return _ERROR_TYPE_KINDS[error_type]
    return "invalid_response"


def transport_error_kind(exc: BaseException) -> ModelErrorKind | None:
    """`timeout` or `connection` for an httpx/httpcore transport failure, else None.

    Matched by class name so it works for `httpx` and `httpx2` alike: the SDKs wrap
    transport errors at connect time, but some let them through mid-stream.
    """
    for cls in type(exc).__mro__:
        if not cls.__module__.startswith(("httpx", "httpcore")):
            continue
        if cls.__name__ == "TimeoutException":
            return "timeout"
        if cls.__name__ in ("TransportError", "RequestError", "StreamError"):
            return "connection"
    return None


def transport_message(kind: ModelErrorKind, *, opened: bool, where: str | None) -> str:
    """What a transport failure means, told apart by whether the stream had opened."""
    if kind == "timeout":
        return "the stream stalled past the timeout" if opened else "the request timed out"
    return "the connection dropped mid-stream" if opened else f"cannot reach {where or 'the API'}"


def error_message(body: object, fallback: str) -> str:
    """The human part of a provider's error body, without the JSON around it."""
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            body = inner
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body:
        return body[:500]
    return fallback


def body_field(body: object, name: str) -> str | None:
    """A string field of an error body (or of its `error` object)."""
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error")
    for source in (body, inner):
        if isinstance(source, Mapping):
            value = source.get(name)
            if isinstance(value, str | int) and not isinstance(value, bool):
                return str(value)
    return None


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """`text` with every secret replaced; short strings are left, they are not keys."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def chained(exc: BaseException, secrets: Iterable[str | None]) -> BaseException | None:
    """`exc` to chain as a cause, or None when its text would carry a secret into a traceback."""
    text = str(exc)
    return None if redact(text, secrets) != text else exc


def header_cost(headers: Mapping[str, str] | None) -> float | None:
    """The real cost a LiteLLM proxy reports in `x-litellm-response-cost`, in USD."""
    if not headers:
        return None
    for key, value in headers.items():
        if key.lower() == "x-litellm-response-cost":
            return as_cost(value)
    return None


def as_cost(value: Any) -> float | None:
    """A non-negative finite number as a cost, else None."""
    if isinstance(value, bool):
        return None
    try:
        cost = float(value)
    except (TypeError, ValueError):
        return None
    return cost if math.isfinite(cost) and cost >= 0 else None


class ProcessLocal(Generic[T]):
    """An object made on first use in each process: an SDK client (its connection pool)
    is never shared across a fork, so a Celery worker's children each make their own."""

    def __init__(self, make: Callable[[], T], close: Callable[[T], None]) -> None:
        self._make = make
        self._close = close
        self._value: T | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value, self._pid = self._make(), os.getpid()
            return self._value

    def close(self) -> None:
        with self._lock:
            if self._value is not None and self._pid == os.getpid():
                self._close(self._value)
            self._value = None
