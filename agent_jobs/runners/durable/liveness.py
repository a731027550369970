"""Every worker process beats; when one stops, another sends its steps again in seconds.

A pool process that dies alone is seen by its worker's main process (tasks/requests.py).
A whole worker that dies — a threads or gevent worker is one process; a prefork worker's
main process and pool go together on a SIGKILL or a lost machine — leaves nobody to see
it, and its tasks' messages come back only after the broker's visibility timeout. So each
process says twice a second, in Redis, that it lives (a sorted set scored by Redis's own
clock, so machines' clocks do not matter), and keeps a set of the runs its tasks work on.
A beat also takes (atomically: one taker) the processes silent for `process_timeout`
seconds; the taker lets go of their claims and leases and sends their steps again
(runners/durable/recovery.py), on a recovery thread of its own: a recovery that waits (on a row
a lost host's open transaction still locks) never holds up the beat. A worker that
starts takes at once the processes of its machine that are provably gone (their pid no
longer runs), as after a restart.

A process of another machine declared dead while it still runs (stalled longer than the
timeout: a CPU-bound tool holding the GIL, a machine paused) has its step run twice; the
journal keeps the first result and the idempotency key guards the side effect, as for an
expired lease. One of this machine whose pid still runs (stopped, not dead) is left its
steps: they go again once its lease runs out and the sweep finds the run stale.
A process that cannot reach Redis does not take others until it has beaten for a whole
timeout again: after an outage every process's last beat is old, and none is dead. Nor
does one whose beats were slow or came after a gap (by Redis's clock): a host cut off
from the network heals into a world where everyone looks silent, and a call it sent
before the cut may reach Redis after it (`Liveness.beat`). Beats go over a client of
their own with short timeouts (`beat_client`), so one lost in a cut fails in a fraction
of the timeout instead of hanging through it and succeeding on a retry.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from ...leases import SEP, Holder, Leases, this_machine

log = logging.getLogger(__name__)

# How often a process beats, as a share of the silence after which it is taken for dead.
BEATS_PER_TIMEOUT = 6
# A beat whose round trip took longer than this share of the timeout counts as failed.
QUICK_SHARE = 0.25


class Liveness:
    """This process's beat, and the recovery of processes that stopped beating."""

    def __init__(
        self,
        leases: Leases,
        recover: Callable[[str, set[str]], set[str] | None],
        timeout: float,
    ) -> None:
        self.leases = leases
        self.recover = recover
        self.timeout = timeout
        self.process = Holder.me().process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beating_since: float | None = None  # since the last failed beat
        # Processes taken, recovered one after another on a thread of their own: a
        # recovery may wait (on a row a lost host's open transaction still locks), and
        # the beat must go on meanwhile, or this process is taken for dead in turn.
        self._taken: queue.SimpleQueue[tuple[str, set[str]]] = queue.SimpleQueue()
        self._recovering: threading.Thread | None = None
        self._recovering_lock = threading.Lock()

    def start(self) -> None:
        """Beat now, then on a thread of its own (a slow database or a busy heartbeat must
        not silence it), until the process ends. The first beat is the caller's: the task
        that started the runtime goes on only once this process is known to live, so one
        killed in its first moments is taken like any other."""
        self.beat()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """End cleanly: nobody need take this process."""
        self._stop.set()
        with contextlib.suppress(redis.RedisError):  # then it is taken, holding nothing
            self.leases.forget(self.process)

    def hold(self, run_id: str) -> str | None:
        """A task of this process works on `run_id`; returns what `let_go` takes."""
        member = f"{run_id}{SEP}{uuid.uuid4().hex}"
        try:
            self.leases.hold(self.process, member)
        except redis.RedisError as exc:  # then the sweep is the backstop, as before
            log.warning("could not note run %s as worked on here: %s", run_id, exc)
            return None
        return member

    def let_go(self, member: str | None) -> None:
        if member is None:
            return
        try:
            self.leases.let_go(self.process, member)
        except redis.RedisError as exc:  # a dead process's runs re-driven for nothing
            log.warning("could not note %s as done here: %s", member, exc)

    def _run(self) -> None:
        self._take_gone_here()
        while not self._stop.wait(self.timeout / BEATS_PER_TIMEOUT):
            self.beat()

    def beat(self) -> None:
        """Say this process lives; take the silent ones only on a beat that proves this
        process is connected now: quick (its round trip under `QUICK_SHARE` of the
        timeout), steady by Redis's clock (`Leases.pulse`), and after a whole timeout of
        such beats. A failed, slow or unsteady beat starts that count again, so a host
        cut off from Redis that heals rejoins, and takes nobody, for a timeout: every
        process looks silent to it then, and none is dead for that."""
        began = time.monotonic()
        since = self._beating_since
        take = since is not None and began - since >= self.timeout
        try:
            taken, steady = self.leases.pulse(self.process, silent_for=self.timeout, take=take)
        except redis.RedisError as exc:
            if since is not None:
                log.warning("liveness beat failed: %s", exc)
            self._beating_since = None
            return
        took = time.monotonic() - began
        if not steady or took > self.timeout * QUICK_SHARE:
            if since is not None:
                log.warning(
                    "liveness beat %s (%.1fs): taking nobody for %.1fs",
                    "came after a gap" if not steady else "was slow",
                    took,
                    self.timeout,
                )
            self._beating_since = None
        elif since is None:
            self._beating_since = began
        # Taken on a steady beat, by Redis's decision: they are this process's to recover
        # whatever the round trip's reply took to come back.
        for process, run_ids in taken.items():
            self._hand_over(process, run_ids)

    def _take_gone_here(self) -> None:
        """Take the processes of this machine that provably no longer run."""
        try:
            gone = [
                process
                for process in self.leases.processes()
                if (holder := Holder.of_process(process)) is not None
                and holder.machine == this_machine()
                and holder.gone()
            ]
            taken = self.leases.take_processes(gone)
        except redis.RedisError as exc:
            log.warning("could not look for dead processes: %s", exc)
            return
        for process, run_ids in taken.items():
            self._hand_over(process, run_ids)

    def _hand_over(self, process: str, run_ids: set[str]) -> None:
        """Recover a taken process on the recovery thread (started on first use), never
        on the beat's."""
        self._taken.put((process, run_ids))
        with self._recovering_lock:
            if self._recovering is None or not self._recovering.is_alive():
                self._recovering = threading.Thread(
                    target=self._recover_taken, name="liveness-recovery", daemon=True
                )
                self._recovering.start()

    def _recover_taken(self) -> None:
        while True:
            process, run_ids = self._taken.get()
            self._recover(process, run_ids)

    def _recover(self, process: str, run_ids: set[str]) -> None:
        holder = Holder.of_process(process)
        if holder is not None and holder.machine == this_machine() and not holder.gone():
            # Silent, yet provably running (stalled): leave its steps to it.
            log.warning("process %d stopped beating but runs: its steps are left to it", holder.pid)
            return
        log.warning("process %s stopped beating: recovering runs %s", process, sorted(run_ids))
        try:
            later = self.recover(process, run_ids)
        except Exception:  # the sweep is the backstop
            log.exception("recovering the runs of process %s failed", process)
            return
        if later and not self._stop.is_set():  # rows still locked: those runs again soon
            again = threading.Timer(
                self.timeout / BEATS_PER_TIMEOUT, self._hand_over, (process, later)
            )
            again.daemon = True
            again.start()


@contextmanager
def working_on(liveness: Liveness | None, run_id: str) -> Iterator[None]:
    """While a task works on the run: if this process dies, another re-drives it. A task
    cut short by the process going (SystemExit on SIGTERM: a pool process killed at its
    hard time limit is sent one first) leaves the run noted, for the taker."""
    if liveness is None:
        yield
        return
    member = liveness.hold(run_id)
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # an error, or a signal such as a retry later: the task ended
        liveness.let_go(member)
        raise
    liveness.let_go(member)
