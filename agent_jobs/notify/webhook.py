"""The webhook: each notification POSTed as its JSON body, signed with HMAC-SHA256.

Headers: `Content-Type: application/json`, `X-Agent-Jobs-Event-Id` (the same on a
duplicate) and `X-Agent-Jobs-Signature`, the hex HMAC-SHA256 of the exact body bytes
keyed by `AGENT_JOBS_WEBHOOK_SECRET`. A URL without a secret is refused at start: a
receiver could not tell our notifications from anyone's. Only a 2xx delivers; anything
else is tried again later (the sender's backoff), a 4xx other than 408 and 429 (and a
redirect) said loudly, as a receiver that refuses what we send needs a person.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..settings import Settings

if TYPE_CHECKING:
    import httpx

SIGNATURE_HEADER = "X-Agent-Jobs-Signature"
EVENT_ID_HEADER = "X-Agent-Jobs-Event-Id"
USER_AGENT = "agent-jobs-notifications"
_QUIET_4XX = frozenset({408, 429})  # the receiver asks us to come back: no alarm


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: hex HMAC-SHA256 of `body`, keyed by `secret`."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def check(settings: Settings) -> None:
    """Refuse a webhook that could not be sent safely (before anything starts)."""
    url = settings.webhook_url
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError("AGENT_JOBS_WEBHOOK_URL must be an http:// or https:// URL")
    secret = settings.webhook_secret
    if secret is None or not secret.get_secret_value():
        raise ConfigurationError(
            "AGENT_JOBS_WEBHOOK_URL is set but AGENT_JOBS_WEBHOOK_SECRET is not: the receiver "
            "could not tell these notifications from forged ones; set the secret (a long "
            "random string) in the environment of every process that sends"
        )


@dataclass(frozen=True)
class Attempt:
    """How one POST went."""

    delivered: bool
    error: str | None = None  # why not (no URL, no secret in it)
    retry_after: float | None = None  # seconds the receiver asked us to wait
    loud: bool = False  # a refusal someone must look at
    down: bool = False  # the receiver could not be reached at all


class Webhook:
    """POSTs notifications to one URL, keeping its connections between them."""

    def __init__(self, url: str, secret: str, *, timeout: float) -> None:
        self.url = url
        self._secret = secret
        parts = urlsplit(url)
        # What logs and errors may show of the URL: its path or query may be a secret.
        self.where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        import httpx  # only a process that POSTs pays for its import

        hide_paths_of(parts.hostname or "")
        self._httpx = httpx
        self._client: httpx.Client = httpx.Client(timeout=timeout, follow_redirects=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Webhook | None:
        """The settings' webhook (None without a URL); refuses one without a secret."""
        check(settings)
        if not settings.webhook_url or settings.webhook_secret is None:
            return None
        return cls(
            settings.webhook_url,
            settings.webhook_secret.get_secret_value(),
            timeout=settings.webhook_timeout,
        )

    def post(self, event_id: str, body: bytes) -> Attempt:
        headers = {
            "Content-Type": "application/json",
            EVENT_ID_HEADER: event_id,
            SIGNATURE_HEADER: sign(self._secret, body),
            "User-Agent": USER_AGENT,
        }
        try:
            response = self._client.post(self.url, content=body, headers=headers)
        except self._httpx.TransportError as exc:  # refused, unreachable, timed out, cut
            return Attempt(False, f"{type(exc).__name__}: {self._hide(str(exc))}", down=True)
        status = response.status_code
        response.close()
        if 200 <= status < 300:
            return Attempt(True)
        retry_after = _retry_after(response.headers.get("Retry-After"))
        loud = (400 <= status < 500 and status not in _QUIET_4XX) or 300 <= status < 400
        return Attempt(False, f"HTTP {status}", retry_after=retry_after, loud=loud)

    def close(self) -> None:
        self._client.close()

    def _hide(self, text: str) -> str:
        return text.replace(self.url, self.where)


class _HidePaths(logging.Filter):
    """Cuts the path and query out of the URLs of some hosts in a library's log records:
    httpx logs every request (`HTTP Request: POST <url> "HTTP/1.1 200 OK"`) at INFO, and a
    webhook receiver's secret is often in its URL's path or query."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, host: str) -> None:
        self.hosts.add(host)
        names = "|".join(re.escape(h) for h in sorted(self.hosts, key=len, reverse=True))
        self._pattern = re.compile(rf"(?i)(\bhttps?://(?:{names})(?::\d+)?)[/?#][^\s\"'<>]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if self._pattern is not None:
            message = record.getMessage()
            hidden = self._pattern.sub(r"\1/…", message)
            if hidden != message:
                record.msg, record.args = hidden, ()
        return True


_HIDDEN = _HidePaths()


def hide_paths_of(host: str) -> None:
    """Keep the path and query of URLs of `host` out of httpx's and httpcore's log
    records, in every process that sends to it, whatever its logging is."""
    if host and host not in _HIDDEN.hosts:
        _HIDDEN.add(host)
        for name in ("httpx", "httpcore"):
            library = logging.getLogger(name)
            if _HIDDEN not in library.filters:
                library.addFilter(_HIDDEN)


def _retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds, given as seconds or as an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
