"""A document the store answers, as server-sent events: sent at once, then again each
time it changes (the inbox, the runs list). The store is the truth for both, so it is
polled, every `api_inbox_poll` seconds; comments keep the connection alive meanwhile."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from . import sse
from .errors import DATABASE_ERRORS
from .state import Release, ServerState

log = logging.getLogger(__name__)


async def polled_events(
    state: ServerState,
    read: Callable[[], Any],
    first: Any,
    release: Release,
    what: str,
) -> AsyncIterator[bytes]:
    """`first`, then `read()`'s answer each time it differs from the one sent before;
    while the store does not answer, what was sent stands (`what` names it in the log)."""
    settings = state.settings
    doc, sent, number, quiet = first, "", 0, 0.0
    try:
        yield sse.RETRY
        while True:
            body = json.dumps(doc, ensure_ascii=False, sort_keys=True)
            if body != sent:
                number += 1
                sent, quiet = body, 0.0
                yield sse.event(body, id=str(number))
            elif quiet >= settings.api_keepalive:
                quiet = 0.0
                yield sse.KEEPALIVE
            await asyncio.sleep(settings.api_inbox_poll)
            quiet += settings.api_inbox_poll
            try:
                doc = await run_in_threadpool(read)
            except DATABASE_ERRORS as exc:
                log.warning("the %s could not be read: %s", what, exc)
    finally:
        release()
