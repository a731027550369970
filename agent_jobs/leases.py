"""Who is running a remote step right now, and how often it was delivered: kept in Redis.

A step task takes the step's lease (SET NX with an expiry) before it runs the step and
keeps it alive while it runs; a duplicate delivery finds the lease taken and does
nothing. Each delivery that takes the lease counts an attempt, so a step that keeps
killing its worker is given up after a bounded number. None of this costs a Postgres
commit; if Redis loses it, the worst case is a step run once more, whose result the
journal refuses (first writer wins) and whose side effects the idempotency key guards.
"""

from __future__ import annotations

import redis

ATTEMPTS_TTL = 7 * 24 * 3600


def _lease_key(run_id: str, step: str) -> str:
    return f"agent_jobs:lease:{run_id}:{step}"


def _attempts_key(run_id: str, step: str) -> str:
    return f"agent_jobs:attempts:{run_id}:{step}"


# Refresh or release a lease only while it is still ours.
_REFRESH = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# Take the lease if free, and count the attempt, in one round trip.
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local attempt = redis.call('incr', KEYS[2])
  redis.call('expire', KEYS[2], ARGV[3])
  return attempt
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class Leases:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._acquire = client.register_script(_ACQUIRE)
        self._refresh = client.register_script(_REFRESH)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str) -> Leases:
        return cls(redis.Redis.from_url(url))

    def acquire(self, run_id: str, step: str, token: str, seconds: float) -> int | None:
        """Take the lease and count an attempt; None when another delivery holds it."""
        attempt = self._acquire(
            keys=[_lease_key(run_id, step), _attempts_key(run_id, step)],
            args=[token, _ms(seconds), ATTEMPTS_TTL],
        )
        return int(attempt) or None

    def refresh(self, run_id: str, step: str, token: str, seconds: float) -> bool:
        return bool(self._refresh(keys=[_lease_key(run_id, step)], args=[token, _ms(seconds)]))

    def release(self, run_id: str, step: str, token: str) -> None:
        self._release(keys=[_lease_key(run_id, step)], args=[token])

    def held(self, run_id: str, steps: list[str]) -> set[str]:
        """Which of the run's steps some delivery is running now."""
        if not steps:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for step in steps:
            pipe.exists(_lease_key(run_id, step))
        return {step for step, live in zip(steps, pipe.execute(), strict=True) if live}


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
