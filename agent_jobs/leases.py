"""Who is running a remote step right now, and how often it was delivered: kept in Redis.

A step task takes the step's lease (SET NX with an expiry) before it looks at the step,
and keeps it alive while it runs; a duplicate delivery finds the lease taken and does
nothing. A lease names its holder (the machine, the process and its start time), so a
redelivery after its worker died takes the lease over at once instead of waiting for it
to expire: recovery follows the death, not the lease. Only a holder that is provably
gone is taken over (a process of this machine that no longer runs; or one whose parent
saw it die and released its leases), so two live workers never run one step.

Each delivery that may run the step counts an attempt, so a step that keeps killing its
worker is given up after a bounded number. None of this costs a Postgres commit; if
Redis loses it, the worst case is a step run once more, whose result the journal
refuses (first writer wins) and whose side effects the idempotency key guards.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

ATTEMPTS_TTL = 7 * 24 * 3600
SEP = "|"


def _lease_key(run_id: str, step: str) -> str:
    return f"agent_jobs:lease:{run_id}:{step}"


def _attempts_key(run_id: str, step: str) -> str:
    return f"agent_jobs:attempts:{run_id}:{step}"


# The worker processes that beat (score: when each last did, by Redis's clock, in ms), and
# what each is working on: a set of `run_id|token`, one member a task.
PROCESSES_KEY = "agent_jobs:processes"
HOLDS_PREFIX = "agent_jobs:holds:"
HOLDS_TTL = 24 * 3600


# Take the lease if it is free; else say who holds it.
_TAKE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return redis.call('get', KEYS[1])
"""
# Take over a lease whose holder is gone, if it is still that holder's.
_TAKE_OVER = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
# Count one more delivery; never below the attempts the journal has on record (a claimed
# attempt is counted in its row, and Redis may have lost the count).
_COUNT = """
local attempt = redis.call('incr', KEYS[1])
local floor = tonumber(ARGV[2])
if attempt <= floor then
  attempt = floor + 1
  redis.call('set', KEYS[1], attempt)
end
redis.call('expire', KEYS[1], ARGV[1])
return attempt
"""
# Keep a lease alive while it is ours; take it back if Redis lost it (restarted empty,
# flushed), so a step that still runs stays visible as running.
_REFRESH = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# Release a lease held by a process that died (its parent saw it).
_RELEASE_DEAD = """
local holder = redis.call('get', KEYS[1])
if holder and string.sub(holder, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


# Take processes, each removed from the set so exactly one caller takes it, with the runs
# they held: those silent for more than ARGV[2] ms (-1: none), and those named after
# ARGV[5] (known to be gone). With ARGV[1], that process beats first: it is alive now; it
# takes nobody silent unless its own beat before this one came at most ARGV[5] ms ago by
# Redis's clock (a call sent before a gap in its beats, or the first after one, is not
# proof that it is connected now). Returns {steady (1 or 0), taken}.
_TAKE_PROCESSES = """
local now = redis.call('time')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local holds = ARGV[3]
local steady = 1
if ARGV[1] ~= '' then
  local last = redis.call('zscore', KEYS[1], ARGV[1])
  if not last or now - tonumber(last) > tonumber(ARGV[5]) then
    steady = 0
  end
  redis.call('zadd', KEYS[1], now, ARGV[1])
  redis.call('expire', holds .. ARGV[1], ARGV[4])
end
local candidates = {}
if tonumber(ARGV[2]) >= 0 and steady == 1 then
  candidates = redis.call('zrangebyscore', KEYS[1], '-inf', now - tonumber(ARGV[2]),
                          'LIMIT', 0, 20)
end
for i = 6, #ARGV do
  table.insert(candidates, ARGV[i])
end
local taken = {}
for _, process in ipairs(candidates) do
  if redis.call('zrem', KEYS[1], process) == 1 then
    table.insert(taken, process)
    table.insert(taken, redis.call('smembers', holds .. process))
    redis.call('del', holds .. process)
  end
end
return {steady, taken}
"""


# Note a run worked on by ARGV[1] (ARGV[2] is `run_id|token`); the process is among those
# that beat from now, if it was not (scored now, by Redis's clock).
_HOLD = """
redis.call('sadd', KEYS[2], ARGV[2])
if not redis.call('zscore', KEYS[1], ARGV[1]) then
  local now = redis.call('time')
  redis.call('zadd', KEYS[1], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000),
             ARGV[1])
end
return 1
"""


@cache
def this_machine() -> str:
    """Names the machine and process namespace: equal for processes that see each other's
    pids (a fork inherits it)."""
    host = socket.gethostname().replace(SEP, "_")
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        # No /proc: no other process can be checked, and none is ever taken over.
        return f"{host}:{uuid.uuid4().hex}"
    return f"{host}:{boot}:{namespace}"


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces


def _start_time(pid: int) -> str:
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else "?"


@cache
def _own_start_time(pid: int) -> str:
    """This process's start time, read once (keyed by pid: a fork reads its own)."""
    return _start_time(pid)


@dataclass(frozen=True)
class Holder:
    """The process that holds a lease."""

    machine: str
    pid: int
    started: str
    token: str

    def __str__(self) -> str:
        return SEP.join((self.process, self.token))

    @property
    def process(self) -> str:
        """Names the process alone (every lease it takes starts with this and `SEP`)."""
        return SEP.join((self.machine, str(self.pid), self.started))

    @classmethod
    def parse(cls, value: bytes | str) -> Holder | None:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        parts = text.split(SEP)
        if len(parts) != 4 or not parts[1].isdigit():
            return None
        return cls(parts[0], int(parts[1]), parts[2], parts[3])

    @classmethod
    def of_process(cls, process: str) -> Holder | None:
        """The holder a process name (`process`) stands for, with no token."""
        return cls.parse(process + SEP)

    @classmethod
    def me(cls) -> Holder:
        """A new holder for this process (each acquisition has its own token)."""
        pid = os.getpid()
        return cls(this_machine(), pid, _own_start_time(pid), uuid.uuid4().hex)

    def gone(self) -> bool:
        """True only when this process is provably not running any more."""
        if self.machine != this_machine():
            return False  # another machine's: its parent releases it, or it expires
        fields = _stat(self.pid)
        if fields is None:
            return True
        if fields[0] in ("Z", "X"):  # killed, waiting to be reaped
            return True
        return len(fields) > 19 and fields[19] != self.started  # the pid was reused


def session_name(process: str) -> str:
    """The `application_name` of every Postgres session of `process` (a `Holder.process`):
    recovery ends the sessions of a process it took for dead whose open transaction still
    locks a row it needs (runners/durable/recovery.py). A digest: the name has 63 bytes at most."""
    return "agent_jobs " + hashlib.sha256(process.encode()).hexdigest()[:32]


def my_session_name() -> str:
    """This process's `session_name`, read as a connection opens (a forked child's own)."""
    pid = os.getpid()
    return session_name(SEP.join((this_machine(), str(pid), _own_start_time(pid))))


def holder_prefix(machine: str, pid: int) -> str:
    """What every lease of process `pid` on `machine` starts with."""
    return f"{machine}{SEP}{pid}{SEP}"


def beat_client(url: str, timeout: float, max_connections: int = 8) -> redis.Redis:
    """A Redis client for a process's beats (runners/durable/liveness.py): every call fails in a
    third of `timeout` rather than hang through a cut, and is not retried (the next beat
    is the retry); the operating system notices a dead peer in about that long too. Every
    task of the process notes its run over it too (`Liveness.hold`): a threads or gevent
    pool needs a connection for each task it runs at once."""
    seconds = max(0.1, timeout / 3)
    return redis.Redis.from_url(
        url,
        socket_timeout=seconds,
        socket_connect_timeout=seconds,
        socket_keepalive=True,
        socket_keepalive_options=tcp_keepalive(seconds),
        retry=Retry(NoBackoff(), 0),
        max_connections=max_connections,
    )


def tcp_keepalive(seconds: float) -> dict[int, int]:
    """TCP options that find a dead peer after about `seconds` of silence (Linux; empty
    elsewhere): probes each second once the line is idle, and unacknowledged data given
    up after `seconds`."""
    options: dict[int, int] = {}
    idle = max(1, int(seconds))
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", 1),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", max(1000, int(seconds * 1000))),
    ):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return options


class Leases:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._take = client.register_script(_TAKE)
        self._take_over = client.register_script(_TAKE_OVER)
        self._count = client.register_script(_COUNT)
        self._refresh = client.register_script(_REFRESH)
        self._release = client.register_script(_RELEASE)
        self._release_dead = client.register_script(_RELEASE_DEAD)
        self._take_processes = client.register_script(_TAKE_PROCESSES)
        self._hold = client.register_script(_HOLD)

    @classmethod
    def from_url(cls, url: str) -> Leases:
        return cls(redis.Redis.from_url(url))

    def take(self, run_id: str, step: str, holder: Holder, seconds: float) -> bool:
        """Take the step's lease; or take it over from a holder that is gone. False
        while a live delivery (or one that cannot be proved dead) holds it."""
        key = _lease_key(run_id, step)
        got = self._take(keys=[key], args=[str(holder), _ms(seconds)])
        if got == 1:
            return True
        current = Holder.parse(got) if got is not None else None
        if current is None or not current.gone():
            return False
        if not self._take_over(keys=[key], args=[got, str(holder), _ms(seconds)]):
            return False  # another delivery took it over first
        log.info(
            "took over the lease of %s of run %s from process %d, which is gone",
            step,
            run_id,
            current.pid,
        )
        return True

    def count_attempt(self, run_id: str, step: str, recorded: int = 0) -> int:
        """Count one more delivery that runs the step; returns its attempt number, which
        follows the `recorded` attempts (the step's journal row) if Redis counted fewer."""
        key = _attempts_key(run_id, step)
        return int(self._count(keys=[key], args=[ATTEMPTS_TTL, recorded]))

    def reset_attempts(self, run_id: str, step: str) -> None:
        """Forget the step's deliveries: a person may have it run again, counted afresh."""
        self.client.delete(_attempts_key(run_id, step))

    def refresh(self, run_id: str, step: str, holder: Holder, seconds: float) -> bool:
        """Keep the lease alive; False when another delivery holds it now."""
        return bool(
            self._refresh(keys=[_lease_key(run_id, step)], args=[str(holder), _ms(seconds)])
        )

    def release(self, run_id: str, step: str, holder: Holder) -> None:
        self._release(keys=[_lease_key(run_id, step)], args=[str(holder)])

    def release_dead(self, run_id: str, step: str, machine: str, pid: int) -> bool:
        """Release the step's lease if the dead process `pid` of `machine` held it."""
        return self.release_process(run_id, step, holder_prefix(machine, pid))

    def release_process(self, run_id: str, step: str, prefix: str) -> bool:
        """Release the step's lease if a holder whose name starts with `prefix` holds it."""
        return bool(self._release_dead(keys=[_lease_key(run_id, step)], args=[prefix]))

    # --- which processes live, and what they hold (see runners/durable/liveness.py) -------------

    def beat(self, process: str, *, silent_for: float, take: bool) -> dict[str, set[str]]:
        """Say that `process` lives; with `take`, also take the processes that have not
        said so for `silent_for` seconds: {process: the runs it was working on}."""
        return self.pulse(process, silent_for=silent_for, take=take)[0]

    def pulse(
        self, process: str, *, silent_for: float, take: bool, gap: float | None = None
    ) -> tuple[dict[str, set[str]], bool]:
        """`beat`, and whether the beat was steady: the one before it reached Redis at
        most `gap` seconds earlier (by Redis's clock; by default half of `silent_for`).
        An unsteady beat takes nobody."""
        gap_ms = _ms(silent_for / 2 if gap is None else gap)
        steady, taken = self._take_dead(process, _ms(silent_for) if take else -1, gap_ms, [])
        return taken, steady

    def take_processes(self, processes: list[str]) -> dict[str, set[str]]:
        """Take the named processes, known to be gone, unless another caller did."""
        return self._take_dead("", -1, 0, processes)[1] if processes else {}

    def _take_dead(
        self, beating: str, silent_ms: int, gap_ms: int, named: list[str]
    ) -> tuple[bool, dict[str, set[str]]]:
        args: list[str | int] = [beating, silent_ms, HOLDS_PREFIX, HOLDS_TTL, gap_ms, *named]
        steady, flat = self._take_processes(keys=[PROCESSES_KEY], args=args)
        return bool(steady), _taken(flat)

    def processes(self) -> list[str]:
        """Every process that beats or did, until it is taken."""
        members: list[bytes] = self.client.zrange(PROCESSES_KEY, 0, -1)  # type: ignore[assignment]
        return [_text(p) for p in members]

    def hold(self, process: str, member: str) -> None:
        """`process` works on a run (`member` is `run_id|token`, one a task), and so it
        lives: one taken for dead that took work before its next beat (a host whose
        consumer came back before its beat did) is among the processes again, and is
        taken if it falls silent."""
        self._hold(keys=[PROCESSES_KEY, HOLDS_PREFIX + process], args=[process, member])

    def let_go(self, process: str, member: str) -> None:
        self.client.srem(HOLDS_PREFIX + process, member)

    def forget(self, process: str) -> None:
        """`process` ends cleanly: nobody need take it."""
        self.client.zrem(PROCESSES_KEY, process)

    def held(self, run_id: str, steps: list[str]) -> set[str]:
        """Which of the run's steps a delivery that may still live is running now."""
        return {
            step
            for step, value, holder in self._holders(run_id, steps)
            if value is not None and (holder is None or not holder.gone())
        }

    def orphaned(self, run_id: str, steps: list[str]) -> set[str]:
        """Which of the run's steps were taken by a holder that is provably gone (a
        process of this machine that died): nobody will finish them."""
        return {
            step
            for step, _, holder in self._holders(run_id, steps)
            if holder is not None and holder.gone()
        }

    def _holders(
        self, run_id: str, steps: list[str]
    ) -> list[tuple[str, bytes | None, Holder | None]]:
        """Each step's lease as stored, and its holder if the value names one."""
        if not steps:
            return []
        pipe = self.client.pipeline(transaction=False)
        for step in steps:
            pipe.get(_lease_key(run_id, step))
        values = pipe.execute()
        return [
            (step, value, Holder.parse(value) if value is not None else None)
            for step, value in zip(steps, values, strict=True)
        ]


def _taken(flat: list[Any]) -> dict[str, set[str]]:
    """{process: run ids} from a script's [process, [run_id|token, ...], ...]."""
    out: dict[str, set[str]] = {}
    for process, members in zip(flat[::2], flat[1::2], strict=True):
        runs = {_text(m).split(SEP, 1)[0] for m in members}
        out[_text(process)] = runs
    return out


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
