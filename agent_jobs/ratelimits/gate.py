"""The rate limits as a model step meets them: capacity before the call, a 429's pause and
the usage's correction after it.

A model step's key is the first of `AGENT_JOBS_RATE_LIMITS` that matches the
`provider:model` its request goes to. Before the call it takes one request and the
tokens its request is estimated at (about four characters a token of what it sends, and
the output cap when one is set, as providers count it); after the call the tokens the
provider reports (input and output) replace the estimate, and a 429 with a Retry-After
pauses the key for everyone until then.

On the durable runner a step that finds no capacity is deferred before it counts as an
attempt: `admit` raises `Deferred` and the step goes back to the broker with a countdown
(at most `horizon`, a step's time limit: a delayed message must not outlive the broker's
visibility timeout; a longer wait is deferred again). The inline runner has no broker: it
waits on its own thread (`wait`). With no key set, no runner has a gate at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from ..app import AgentApp
from ..errors import AgentJobsError, Deferred, ModelError
from ..executor import model_of
from ..messages import ModelRequest, Usage
from ..models.base import Model
from ..settings import Settings
from ..steps import ModelTurn
from .buckets import LOCAL, Buckets, RedisBuckets
from .rules import Rule, Rules

log = logging.getLogger(__name__)


def model_name(model: Model, request: ModelRequest) -> str:
    """The `provider:model` a request goes to: its adapter's, with the model the request
    names instead of the adapter's default (an agent's options, a thread's selection)."""
    provider, colon, _ = model.name.partition(":")
    wanted = request.settings.model
    return f"{provider}:{wanted}" if colon and wanted else model.name


def estimate(model: Model, request: ModelRequest) -> int:
    """The tokens a call may use, about: four characters a token of what the request
    sends (system prompt, messages with their tool calls, tools, as JSON), and its output
    cap (the request's, else the adapter's) when there is one."""
    sent = request.model_dump_json(include={"system", "messages", "tools"})
    cap = request.settings.max_tokens or getattr(model, "max_tokens", None)
    return max(1, len(sent) // 4 + (cap if isinstance(cap, int) else 0))


class ModelGate:
    """A runner's rate limits: the app (to know where a request goes), the rules, the
    buckets."""

    def __init__(self, app: AgentApp, rules: Rules, buckets: Buckets, *, horizon: float) -> None:
        self.app = app
        self.rules = rules
        self.buckets = buckets
        self.horizon = max(1.0, horizon)

    @classmethod
    def of(cls, app: AgentApp, settings: Settings, client: redis.Redis | None) -> ModelGate | None:
        """The gate the settings ask for: None with no key set (then nothing here runs,
        and no Redis command is sent); buckets in Redis with a `client`, else in process."""
        rules = Rules(settings.rate_limits)
        if not rules:
            return None
        buckets: Buckets = RedisBuckets(client) if client is not None else LOCAL
        return cls(app, rules, buckets, horizon=settings.step_time_limit)

    @classmethod
    def inline(cls, app: AgentApp, settings: Settings) -> ModelGate | None:
        """The inline runner's: shared in Redis when a Redis URL is set, else in process."""
        if not settings.rate_limits:
            return None
        url = settings.effective_redis_url
        return cls.of(app, settings, redis.Redis.from_url(url) if url else None)

    def rule(self, model: Model, request: ModelRequest) -> Rule | None:
        return self.rules.match(model_name(model, request))

    def _take(self, request: ModelRequest, owner: str) -> tuple[Rule, float, bool] | None:
        """Take capacity for `request`: None when no key limits it, else its rule and
        how long to wait (0: go now) and whether the key is paused."""
        try:
            model = model_of(self.app, request)
        except AgentJobsError:  # the step's own call says what is wrong, as it fails
            return None
        rule = self.rule(model, request)
        if rule is None:
            return None
        tokens = estimate(model, request) if rule.tokens_per_minute else 0
        verdict = self.buckets.take(rule, tokens, owner)
        return rule, verdict.wait, verdict.paused

    def admit(self, intent: Any, run_id: str, step: str) -> None:
        """The durable runner's, before a step counts as an attempt: a model step with no
        capacity now raises `Deferred` (its place is kept for when it comes back)."""
        if not (isinstance(intent, dict) and intent.get("type") == "model_turn"):
            return
        try:
            request = ModelTurn.model_validate(intent).request
        except ValueError:  # a malformed intent fails in the step, where it says so
            return
        taken = self._take(request, f"{run_id}:{step}")
        if taken is None or taken[1] <= 0:
            return
        rule, wait, paused = taken
        delay = min(wait, self.horizon)
        log.info("%s of run %s waits %.2fs for capacity of %s", step, run_id, wait, rule.key)
        raise Deferred(delay, rule.key, paused=paused)

    def wait(self, request: ModelRequest, owner: str, sleep: Callable[[float], None]) -> None:
        """The inline runner's: wait on this thread until the request may go (`sleep`
        waits, and raises to stop: a cancel)."""
        while (taken := self._take(request, owner)) is not None and taken[1] > 0:
            log.info("%s waits %.2fs for capacity of %s", owner, taken[1], taken[0].key)
            sleep(taken[1])

    def refused(self, model: Model, request: ModelRequest, error: ModelError) -> None:
        """A call failed: a 429 with a Retry-After pauses its key for every worker."""
        if error.kind != "rate_limit" or not error.retry_after:
            return
        rule = self.rule(model, request)
        if rule is not None:
            log.info("%s paused for %.2fs by the provider (429)", rule.key, error.retry_after)
            self.buckets.pause(rule, error.retry_after)

    def used(self, model: Model, request: ModelRequest, usage: Usage) -> None:
        """A call answered: the tokens it used replace those it took (a provider that
        reports none leaves the estimate)."""
        rule = self.rule(model, request)
        if rule is None or not rule.tokens_per_minute or not usage.total_tokens:
            return
        self.buckets.correct(rule, usage.total_tokens - estimate(model, request))
