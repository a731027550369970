"""The request-error waterfall: what to do when a model request fails.

A chain of middlewares sees the failure; any may set an action (retry or abort) and
stop the chain, or call `next()` to pass it on. If none decides, the terminal decision
retries a retryable error (rate limit, overload, timeout, dropped connection) while
retries remain, with exponential backoff and jitter, or waits as long as the
provider's Retry-After asks; anything else aborts the turn with an `error` ending.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .errors import ModelError


@dataclass(frozen=True)
class RequestErrorAction:
    kind: Literal["retry", "abort"]
    reason: str
    delay: float = 0.0  # seconds before the retry


@dataclass
class RequestErrorPayload:
    error: ModelError
    run_id: str
    step: str
    retry_count: int  # retries already made for this step
    max_retries: int
    action: RequestErrorAction | None = None

    @property
    def retryable(self) -> bool:
        return self.error.retryable


RequestErrorMiddleware = Callable[[RequestErrorPayload, Callable[[], None]], None]


def backoff(retry_count: int, base: float, ceiling: float, rand: Callable[[], float]) -> float:
    """Exponential backoff with jitter: between half and all of base * 2^n, capped."""
    return float(min(ceiling, base * 2.0**retry_count) * (0.5 + rand() / 2))


def resolve(
    chain: Sequence[RequestErrorMiddleware],
    payload: RequestErrorPayload,
    *,
    base_delay: float = 1.0,
    max_delay: float = 60.0,
    rand: Callable[[], float] = random.random,
) -> RequestErrorAction:
    """Run the chain; fall back to the terminal decision."""

    def run(index: int) -> None:
        if index < len(chain) and payload.action is None:
            chain[index](payload, lambda: run(index + 1))

    run(0)
    if payload.action is not None:
        return payload.action
    error = payload.error
    if not payload.retryable:
        return RequestErrorAction("abort", f"{error.kind} is not retryable: {error}")
    if payload.retry_count >= payload.max_retries:
        return RequestErrorAction(
            "abort", f"gave up after {payload.retry_count} retries: {error.kind}: {error}"
        )
    delay = backoff(payload.retry_count, base_delay, max_delay, rand)
    if error.retry_after is not None:
        delay = max(delay, error.retry_after)
    return RequestErrorAction("retry", f"{error.kind}: retry {payload.retry_count + 1}", delay)
