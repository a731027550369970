"""Each key's requests and tokens per minute: token buckets that hand out places in time.

A bucket holds a second's worth of its limit (at least one request; a request of more
tokens than that goes when the bucket is full and leaves it in debt) and refills at a
sixtieth of the limit each second. It is kept as the moment it will next be full (the
generic cell rate algorithm): one number a bucket, and a pause's end, per key.

A step that finds no capacity is not refused: it is given a place, the moment the
buckets will have its request and tokens, which it keeps as a grant (`owner` names it:
run and step) and takes when it comes back then, with no new queueing. So each waiting
step wakes once, in the order they came. A 429's pause voids the grants that fall inside
it (they queue again behind it), and the requests bucket restarts empty at its end: the
key resumes one request at a time.

`RedisBuckets` keeps this in Redis, every decision one Lua script on Redis's own clock,
so every worker shares it; `LocalBuckets` keeps it in this process (the inline runner
with no Redis). While Redis cannot be reached, steps go on unlimited (logged): a 429
is still retried by the request-error waterfall.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from .rules import Rule

log = logging.getLogger(__name__)

STATE_PREFIX = "agent_jobs:ratelimit:key:"
GRANT_PREFIX = "agent_jobs:ratelimit:grant:"
GRANT_KEEP_MS = 600_000  # a grant outlives its moment by this much, then lapses
TOLERANCE_MS = 5.0  # a step back this early on its grant goes (the clocks of two hosts)


@dataclass(frozen=True)
class Verdict:
    """What a bucket says to a step: go now (`wait` 0, its place taken), or come back
    in `wait` seconds, when its place is (`paused`: the key is paused by a 429)."""

    wait: float
    paused: bool = False


GO = Verdict(0.0)


@dataclass(frozen=True)
class Shape:
    """A rule's buckets in milliseconds: a request's interval and the requests bucket's
    depth, a token's interval and the tokens bucket's depth (0: no such limit)."""

    request_ms: float
    request_depth: float
    token_ms: float
    token_depth: float

    @classmethod
    def of(cls, rule: Rule) -> Shape:
        rpm, tpm = rule.requests_per_minute, rule.tokens_per_minute
        request_ms = 60_000 / rpm if rpm else 0.0
        token_ms = 60_000 / tpm if tpm else 0.0
        return cls(
            request_ms,
            max(1.0, (rpm or 0) / 60) * request_ms,
            token_ms,
            max(1.0, (tpm or 0) / 60) * token_ms,
        )

    def tokens(self, count: int) -> tuple[float, float]:
        """What `count` tokens cost, and what the bucket must hold for them to go (a full
        bucket lets a larger request go), in milliseconds."""
        if not self.token_ms:
            return 0.0, 0.0
        return count * self.token_ms, min(count * self.token_ms, self.token_depth)


class Buckets(Protocol):
    """Where the buckets are kept."""

    def take(self, rule: Rule, tokens: int, owner: str) -> Verdict:
        """A request of about `tokens` tokens by `owner` (a step): go now, or its place."""
        ...

    def pause(self, rule: Rule, seconds: float) -> None:
        """The provider said 429, retry after `seconds`: nobody goes until then."""
        ...

    def correct(self, rule: Rule, tokens: int) -> None:
        """A call used `tokens` more than it took (fewer, if negative)."""
        ...


# --- in Redis: one script a decision ------------------------------------------------------

# KEYS[1]: the key's state (a hash: r, t, when the requests and tokens buckets are next
# full; p, the end of a pause; all in ms of Redis's clock). KEYS[2]: the owner's grant.
# ARGV: request interval, requests depth, tokens cost, tokens needed, tokens depth (ms),
# how long a grant outlives its moment, how early a grant may be taken (ms).
_TAKE = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local state = redis.call('hmget', KEYS[1], 'r', 't', 'p')
local r, t, p = tonumber(state[1]) or 0, tonumber(state[2]) or 0, tonumber(state[3]) or 0
local reason = 1
if p > now then reason = 2 end
local grant = redis.call('get', KEYS[2])
if grant then
  grant = tonumber(grant)
  if grant >= p then
    if grant <= now + tonumber(ARGV[7]) then
      redis.call('del', KEYS[2])
      return {0, 0}
    end
    return {math.ceil(grant - now), reason}
  end
end
local rms, rdepth = tonumber(ARGV[1]), tonumber(ARGV[2])
local tcost, tneed, tdepth = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local at = math.max(now, p)
if rms > 0 then at = math.max(at, r - rdepth + rms) end
if tcost > 0 then at = math.max(at, t - tdepth + tneed) end
if rms > 0 then r = math.max(r, at) + rms end
if tcost > 0 then t = math.max(t, at) + tcost end
redis.call('hset', KEYS[1], 'r', string.format('%.3f', r), 't', string.format('%.3f', t))
redis.call('pexpire', KEYS[1], math.ceil(math.max(r, t, p) - now) + 60000)
if at <= now then
  redis.call('del', KEYS[2])
  return {0, 0}
end
local keep = math.ceil(at - now + tonumber(ARGV[6]))
redis.call('set', KEYS[2], string.format('%.3f', at), 'PX', keep)
return {math.ceil(at - now), reason}
"""

# KEYS[1]: the key's state. ARGV: the pause (ms), request interval, requests depth (ms).
_PAUSE = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local state = redis.call('hmget', KEYS[1], 'r', 'p')
local p = math.max(tonumber(state[2]) or 0, now + tonumber(ARGV[1]))
local r = tonumber(state[1]) or 0
local rms = tonumber(ARGV[2])
if rms > 0 then r = math.max(r, p + tonumber(ARGV[3]) - rms) end
redis.call('hset', KEYS[1], 'p', string.format('%.3f', p), 'r', string.format('%.3f', r))
local ttl = math.max(redis.call('pttl', KEYS[1]), math.ceil(math.max(p, r) - now) + 60000)
redis.call('pexpire', KEYS[1], ttl)
return 1
"""

# KEYS[1]: the key's state. ARGV: the tokens used beyond those taken, in ms (negative:
# fewer were used; a refund never fills the bucket past full).
_CORRECT = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local t = tonumber(redis.call('hget', KEYS[1], 't') or '0') or 0
local delta = tonumber(ARGV[1])
if delta > 0 then
  t = math.max(t, now) + delta
elseif t > now then
  t = math.max(now, t + delta)
else
  return 0
end
redis.call('hset', KEYS[1], 't', string.format('%.3f', t))
local ttl = math.max(redis.call('pttl', KEYS[1]), math.ceil(t - now) + 60000)
redis.call('pexpire', KEYS[1], ttl)
return 1
"""


class RedisBuckets:
    """The buckets in Redis, shared by every process that uses it."""

    # After Redis failed, steps go on unlimited this long before it is tried again: an
    # outage must not cost every model step the client's connection timeouts.
    AWAY = 5.0

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._take = client.register_script(_TAKE)
        self._pause = client.register_script(_PAUSE)
        self._correct = client.register_script(_CORRECT)
        self._away_until = 0.0

    def _run(self, script: Any, what: str, keys: list[str], args: list[Any]) -> Any:
        """The script's answer, or None while Redis cannot be reached (logged)."""
        if time.monotonic() < self._away_until:
            return None
        try:
            return script(keys=keys, args=args)
        except redis.RedisError as exc:
            self._away_until = time.monotonic() + self.AWAY
            log.warning("%s: Redis cannot be reached (%s); steps go on unlimited", what, exc)
            return None

    def take(self, rule: Rule, tokens: int, owner: str) -> Verdict:
        shape = Shape.of(rule)
        cost, need = shape.tokens(tokens)
        args = [shape.request_ms, shape.request_depth, cost, need, shape.token_depth]
        keys = [STATE_PREFIX + rule.key, GRANT_PREFIX + owner]
        what = f"rate limit {rule.key} not applied"
        answer = self._run(self._take, what, keys, [*map(_ms, args), GRANT_KEEP_MS, TOLERANCE_MS])
        if answer is None or int(answer[0]) <= 0:
            return GO
        return Verdict(int(answer[0]) / 1000, int(answer[1]) == 2)

    def pause(self, rule: Rule, seconds: float) -> None:
        shape = Shape.of(rule)
        args = [_ms(a) for a in (seconds * 1000, shape.request_ms, shape.request_depth)]
        self._run(self._pause, f"{rule.key} not paused", [STATE_PREFIX + rule.key], args)

    def correct(self, rule: Rule, tokens: int) -> None:
        shape = Shape.of(rule)
        if shape.token_ms and tokens:
            args = [_ms(tokens * shape.token_ms)]
            what = f"{rule.key}'s tokens not corrected"
            self._run(self._correct, what, [STATE_PREFIX + rule.key], args)


def _ms(value: float) -> str:
    return f"{value:.3f}"


# --- in this process --------------------------------------------------------------------


@dataclass
class _State:
    requests: float = 0.0  # when each bucket is next full, ms of the monotonic clock
    tokens: float = 0.0
    paused: float = 0.0


class LocalBuckets:
    """The same buckets in this process: the inline runner with no Redis. One lock; the
    monotonic clock."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a child starts afresh

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._grants: dict[str, tuple[float, float]] = {}  # owner: (moment, lapses at)

    def _now(self) -> float:
        return float(self._clock()) * 1000

    def take(self, rule: Rule, tokens: int, owner: str) -> Verdict:
        shape = Shape.of(rule)
        cost, need = shape.tokens(tokens)
        with self._lock:
            now = self._now()
            state = self._states.setdefault(rule.key, _State())
            paused = state.paused > now
            grant = self._grants.pop(owner, None)
            if grant is not None and grant[0] >= state.paused and grant[1] > now:
                if grant[0] <= now + TOLERANCE_MS:
                    return GO
                self._grants[owner] = grant
                return Verdict(math.ceil(grant[0] - now) / 1000, paused)
            at = max(now, state.paused)
            if shape.request_ms:
                at = max(at, state.requests - shape.request_depth + shape.request_ms)
            if cost:
                at = max(at, state.tokens - shape.token_depth + need)
            if shape.request_ms:
                state.requests = max(state.requests, at) + shape.request_ms
            if cost:
                state.tokens = max(state.tokens, at) + cost
            if at <= now:
                return GO
            self._forget_lapsed(now)
            self._grants[owner] = (at, at + GRANT_KEEP_MS)
            return Verdict(math.ceil(at - now) / 1000, paused)

    def _forget_lapsed(self, now: float) -> None:
        if len(self._grants) > 1024:
            self._grants = {k: g for k, g in self._grants.items() if g[1] > now}

    def pause(self, rule: Rule, seconds: float) -> None:
        shape = Shape.of(rule)
        with self._lock:
            state = self._states.setdefault(rule.key, _State())
            state.paused = max(state.paused, self._now() + seconds * 1000)
            if shape.request_ms:
                restart = state.paused + shape.request_depth - shape.request_ms
                state.requests = max(state.requests, restart)

    def correct(self, rule: Rule, tokens: int) -> None:
        shape = Shape.of(rule)
        if not shape.token_ms or not tokens:
            return
        with self._lock:
            now = self._now()
            state = self._states.setdefault(rule.key, _State())
            delta = tokens * shape.token_ms
            if delta > 0:
                state.tokens = max(state.tokens, now) + delta
            elif state.tokens > now:
                state.tokens = max(now, state.tokens + delta)


# The process's own buckets: every inline runner of the process shares them.
LOCAL = LocalBuckets()
