"""Lifecycle diagnostics: structural events for whoever listens, free when nobody does.

Events: `run.started`, `assistant.message`, `tool.executed`, `tool.rejected`,
`tool.failed`, `delegation.started`, `run.finished`. They are published where the side
effect happens (a step's executor, the runner), never from the loop body, so a
durable replay does not publish them twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]

_listeners: list[Listener] = []
_lock = threading.Lock()
_enabled = True
log = logging.getLogger(__name__)


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call `listener(event, payload)` for every event; returns an unsubscribe function."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def set_enabled(enabled: bool) -> None:
    """Turn publishing off (or on) for this process; `AGENT_JOBS_DIAGNOSTICS` does it too."""
    global _enabled
    _enabled = enabled


def active() -> bool:
    return _enabled and bool(_listeners)


def publish(event: str, payload_factory: Callable[[], dict[str, Any]]) -> None:
    """Publish `event`; the payload is built only when somebody listens."""
    if not active():
        return
    payload = payload_factory()
    for listener in list(_listeners):
        try:
            listener(event, payload)
        except Exception:  # a listener must never break a run
            log.exception("diagnostics listener failed on %s", event)
