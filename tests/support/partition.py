"""A partition lab: a second worker host on this machine, cut off from the network at will.

Host A is a network namespace of the lab's own (and a UTS namespace, for a hostname of its
own), joined to this one by a veth pair on a /30 of the lab's choosing; host B is this
one. The lab's Postgres (a cluster of its own, `initdb`) and Redis listen on 127.0.0.1
for B and on B's end of the pair for A; nothing is sent anywhere else. A cut is the
pair's link going down on A's side (`link`), or a queue on both ends that drops every
packet (`drop`, `tc qdisc … pfifo limit 0`): frames vanish silently, as on a switch
that died. Healing undoes it. Needs root (CI runs as root), `ip`, `tc` and `unshare`.

The lab's app (tests/support/apps/partition.py) notes where and when each step began
and ended; `Findings` reads that, the journal and the cut windows, and says what the
partition cost: runs lost, steps run by two live workers at once, finished steps run
again, actions run twice, the takeover times, the healthy host's longest silence.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, select, text

from agent_jobs.dispatch import celery_client
from agent_jobs.leases import PROCESSES_KEY
from agent_jobs.store import Store
from tests.support.apps.base import create_side_table, executions
from tests.support.hosts import Network, Postgres
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually
from tests.support.workers import Process, service_env, start_beat, worker

APP = "tests.support.apps.partition:app"
TAKEN_AFTER = 3.0  # the shipped AGENT_JOBS_PROCESS_TIMEOUT: a shorter cut takes nobody
QUEUE = "agent_jobs_lab"
HOST_A = "host-a"


@dataclass
class Cut:
    how: str
    at: float  # wall clock, as the app's records are
    healed: float = 0.0


@dataclass
class Lab:
    """Host A (a worker) and host B (a worker and beat) around the lab's own services."""

    network: Network
    postgres: Postgres
    redis_server: RedisServer
    procs: list[Process] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)  # run ids, as a plain client sent them
    silences: dict[str, float] = field(default_factory=dict)  # B's process: longest
    taken_b: set[str] = field(default_factory=set)  # B's processes ever taken for dead
    reconciled: set[str] = field(default_factory=set)  # calls left to a person
    locking: set[str] = field(default_factory=set)  # runs whose first read holds rows

    @property
    def here_url(self) -> str:
        return self.postgres.url("127.0.0.1")

    def broker(self, host: str) -> str:
        return f"redis://{host}:{self.redis_server.port}/0"

    def env(self, host: str) -> dict[str, str]:
        return service_env(
            self.broker(host),
            self.postgres.url(host),
            AGENT_JOBS_APP=APP,
            AGENT_JOBS_QUEUE=QUEUE,
            AGENT_JOBS_DB_POOL_SIZE="4",
        )

    def start_hosts(self, a_concurrency: int = 4, b_concurrency: int = 4) -> None:
        """Host A reads the `celery` queue, where the plain client sends, and the lab's;
        host B only the lab's: runs start on A, and their steps run there (each next step
        where the last ended) until A is cut off and B takes them over."""
        a = worker(self.env(self.network.here), a_concurrency, "host-a", pool="threads")
        a.args = self.network.in_a([*a.args[:-1], f"--queues={QUEUE},celery"], HOST_A)
        b = worker(self.env("127.0.0.1"), b_concurrency, "host-b", pool="threads")
        for host in (a, b):
            self.procs.append(host)  # killed at the end even if it never comes up
            host.start(ready="ready.")
        beat_dir = Path(tempfile.mkdtemp(prefix="agent-jobs-lab-beat-"))
        self.procs.append(start_beat(self.env("127.0.0.1"), beat_dir))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in self.procs)

    # --- what the lab does ---------------------------------------------------------------

    @contextmanager
    def enqueuing(self, runs: int, every: float) -> Iterator[None]:
        """A plain Celery client sends a start_run every `every` seconds, on the queue such
        clients use, while the block runs, and at least `runs` of them."""
        client = celery_client(self.broker("127.0.0.1"))
        stop = threading.Event()

        def send() -> None:
            n = 0
            while n < runs or not stop.is_set():
                run_id = f"lab-{n:03d}-{uuid.uuid4().hex[:6]}"
                agent = "across_a_cut_locking" if n % 3 == 2 else "across_a_cut"
                if n % 3 == 2:
                    self.locking.add(run_id)
                kwargs = {"agent": agent, "input": "go", "actor": "user-7", "run_id": run_id}
                for _ in range(100):  # the broker is this host's: it answers
                    try:
                        client.send_task("agent_jobs.start_run", kwargs=kwargs, queue="celery")
                        break
                    except Exception:
                        time.sleep(0.1)
                self.sent.append(run_id)
                n += 1
                time.sleep(every)

        try:
            with _alongside(send, stop):
                yield
        finally:
            client.close()

    @contextmanager
    def watching_beats(self) -> Iterator[None]:
        """Read every tenth of a second how long each of B's processes has been silent
        (by Redis's clock, as beats are scored), and whether one was taken."""
        client = redis.Redis.from_url(self.broker("127.0.0.1"))
        stop = threading.Event()
        seen: set[str] = set()

        def watch() -> None:
            while not stop.wait(0.1):
                try:
                    silent = _silences(client)
                except redis.RedisError:
                    continue
                present = {p for p in silent if not p.startswith(f"{HOST_A}:")}
                for process in present:
                    self.silences[process] = max(self.silences.get(process, 0.0), silent[process])
                self.taken_b |= seen - present
                seen.update(present)

        try:
            with _alongside(watch, stop):
                yield
        finally:
            client.close()

    def a_beats(self) -> bool:
        """Whether a process of host A beat in the last second, by Redis's clock."""
        client = redis.Redis.from_url(self.broker("127.0.0.1"))
        try:
            silent = _silences(client)
        finally:
            client.close()
        return any(p.startswith(f"{HOST_A}:") and s < 1.0 for p, s in silent.items())

    def reconnects(self) -> list[float]:
        """For each cut longer than a blip, how long after the heal host A's consumer was
        connected to the broker again (its log says so, in this machine's clock)."""
        connected = [
            datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in self.procs[0].log().splitlines()
            if "INFO/MainProcess] Connected to " in line
        ]
        return [
            min(at - cut.healed for at in connected if at > cut.healed)
            for cut in self.cuts
            if cut.healed - cut.at >= TAKEN_AFTER and any(at > cut.healed for at in connected)
        ]

    def running_on_a(self, *, what: str = "") -> list[tuple[str, str]]:
        """(run, key) of the steps that began on host A and have not ended."""
        steps = self.executions()
        return [
            (run, key)
            for (run, key), runs in steps.items()
            if any(e.host == HOST_A and e.end is None for e in runs) and (not what or what in key)
        ]

    def cut(self, how: str, seconds: float) -> Cut:
        """Cut host A off for `seconds`: its link down (`link`), or every frame dropped
        (any other `how`, which names the cycle)."""
        cut = Cut(how, time.time())
        self.network.cut("link" if how == "link" else "drop")
        time.sleep(seconds)  # the outage itself: how long it lasts is what is tried
        self.network.heal()
        cut.healed = time.time()
        self.cuts.append(cut)
        return cut

    @contextmanager
    def deciding(self, client: Any) -> Iterator[None]:
        """A person at the inbox while the block runs (`decide`, every half second)."""
        stop = threading.Event()

        def decide() -> None:
            while not stop.wait(0.5):
                try:
                    self.decide(client)
                except Exception:
                    continue

        with _alongside(decide, stop):
            yield

    def settle(self, client: Any) -> None:
        """Decide (`decide`) until every run sent has ended."""
        eventually(
            lambda: self.decide(client),
            600,
            what="every run sent to end",
            every=0.5,
            context=self.logs,
        )

    def decide(self, client: Any) -> bool:
        """Approve every call waiting for a person, and say how each call whose outcome
        is unknown ended (from what the action noted); True once every run sent ended."""
        store = client.store

        def ended() -> bool:
            done = 0
            for run_id in self.sent:
                try:
                    run = store.get_run(run_id)
                except Exception:
                    continue
                if run.finished:
                    done += 1
                elif run.status == "awaiting_approval":
                    for call in store.pending_calls(run_id):
                        client.approve(run_id, call["call_id"], actor="alice")
                elif run.status == "awaiting_reconcile":
                    for row in store.journal(run_id):
                        if row["state"] != "waiting" or not row["step"].startswith("tool:"):
                            continue
                        key = f"{run_id}:{row['step']}"
                        shipped = any(  # as a person would look at what was shipped
                            e.end is not None for e in self.executions().get((run_id, key), [])
                        )
                        self.reconciled.add(key)
                        client.reconcile(
                            run_id,
                            row["step"].removeprefix("tool:"),
                            "succeeded" if shipped else "failed",
                            actor="alice",
                            result="shipped p1" if shipped else None,
                            error=None if shipped else "not shipped",
                        )
            return done == len(self.sent)

        return ended()

    # --- what it found ---------------------------------------------------------------------

    def executions(self) -> dict[tuple[str, str], list[Execution]]:
        engine = create_engine(self.here_url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(executions.c.run_id, executions.c.what, executions.c.key).order_by(
                        executions.c.id
                    )
                ).all()
        finally:
            engine.dispose()
        found: dict[tuple[str, str], list[Execution]] = defaultdict(list)
        for run_id, what, key in rows:
            kind, host, pid, at = what.split(":")
            runs = found[(run_id, key)]
            if kind == "begin":
                runs.append(Execution(host, int(pid), float(at)))
            else:
                mine = [e for e in runs if e.pid == int(pid) and e.host == host and e.end is None]
                if mine:
                    mine[-1].end = float(at)
        return found


@contextmanager
def _alongside(work: Callable[[], None], stop: threading.Event) -> Iterator[None]:
    """Run `work` on a thread of its own while the block runs; then set `stop` (which
    `work` watches) and wait for it to end."""
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _silences(client: redis.Redis) -> dict[str, float]:
    """How long each process that beats has been silent, in seconds, by Redis's clock
    (the one beats are scored by)."""
    now_s, now_us = client.time()  # type: ignore[misc]
    now_ms = int(now_s) * 1000 + int(now_us) // 1000
    beats = client.zrange(PROCESSES_KEY, 0, -1, withscores=True)
    return {m.decode(): (now_ms - score) / 1000 for m, score in beats}  # type: ignore[union-attr]


@dataclass
class Execution:
    host: str
    pid: int
    begin: float
    end: float | None = None

    def overlaps(self, other: Execution) -> bool:
        mine = self.end if self.end is not None else float("inf")
        theirs = other.end if other.end is not None else float("inf")
        return self.begin < theirs and other.begin < mine


@contextmanager
def lab() -> Iterator[Lab]:
    network = Network().up()
    postgres: Postgres | None = None
    server: RedisServer | None = None
    made: Lab | None = None
    try:
        postgres = Postgres(["127.0.0.1", network.here], f"{network.here}/30").start()
        server = RedisServer(
            None, "--bind", "127.0.0.1", network.here, "--protected-mode", "no"
        ).start()
        Store.from_url(postgres.url("127.0.0.1"), auto_upgrade=True).engine.dispose()
        side = create_engine(postgres.url("127.0.0.1"))  # where the app's records go
        create_side_table(side)
        side.dispose()
        made = Lab(network, postgres, server)
        yield made
    finally:
        if made is not None:
            for proc in made.procs:
                proc.kill()
        network.heal()
        if server is not None:
            server.close()
        if postgres is not None:
            postgres.stop()
        network.down()


@dataclass
class Findings:
    runs_sent: int
    runs_lost: int
    runs_completed: int
    steps_on_a_at_cuts: int
    two_live_at_once: int  # steps run at once by two workers neither of which was cut off
    again_across_a_cut: int  # steps run again because their host was cut off (by design)
    finished_again: int  # executions that began after their step was finished
    actions_twice: int
    outcome_unknown: int
    takeovers: list[float]
    detail: list[str]
    longest_healthy_silence: float
    healthy_taken: int
    reconnects: list[float]  # each heal to host A's consumer connected again, s

    def summary(self) -> dict[str, Any]:
        takeovers = sorted(self.takeovers)
        return {
            "runs sent": self.runs_sent,
            "runs completed": self.runs_completed,
            "runs lost": self.runs_lost,
            "steps in flight on A at the cuts": self.steps_on_a_at_cuts,
            "steps run by two live workers at once": self.two_live_at_once,
            "steps run again after their host was cut off": self.again_across_a_cut,
            "finished steps executed again": self.finished_again,
            "non-idempotent actions run twice": self.actions_twice,
            "actions left to a person (outcome unknown)": self.outcome_unknown,
            "takeover p50 s": round(statistics.median(takeovers), 2) if takeovers else None,
            "takeover max s": round(takeovers[-1], 2) if takeovers else None,
            "longest silence of a worker never cut off s": round(self.longest_healthy_silence, 2),
            "healthy processes taken for dead": self.healthy_taken,
            "healed worker consuming again, max s": (
                round(max(self.reconnects), 2) if self.reconnects else None
            ),
        }


def findings(made: Lab) -> Findings:
    """What the partition cost, from the app's records, the journal and the cuts."""
    steps = made.executions()
    finished, statuses = _journal(made)
    two_live = across = again = 0
    at_cuts = _AtCuts()
    for (run_id, key), runs in steps.items():
        live, cut = _overlapping(made, runs)
        two_live, across = two_live + live, across + cut
        done_at = finished.get((run_id, key))
        if done_at is not None:
            again += sum(1 for e in runs if e.begin > done_at)
        at_cuts.add(made, key, runs)
    twice = sum(1 for k in _ship_keys(made) if len(steps.get(k, [])) > 1)
    lost_runs = [r for r in made.sent if statuses.get(r) is None]
    completed = sum(1 for r in made.sent if statuses.get(r) == "completed")
    return Findings(
        runs_sent=len(made.sent),
        runs_lost=len(lost_runs),
        runs_completed=completed,
        steps_on_a_at_cuts=at_cuts.in_flight,
        two_live_at_once=two_live,
        again_across_a_cut=across,
        finished_again=again,
        actions_twice=twice,
        outcome_unknown=len(made.reconciled),
        takeovers=at_cuts.takeovers,
        detail=at_cuts.detail,
        longest_healthy_silence=max(made.silences.values(), default=0.0),
        reconnects=made.reconnects(),
        healthy_taken=len(made.taken_b),
    )


def _journal(made: Lab) -> tuple[dict[tuple[str, str], float], dict[str, str]]:
    """When each step finished, by (run, key), and each run's status, from the database."""
    store = Store.from_url(made.here_url)
    try:
        finished: dict[tuple[str, str], float] = {}
        statuses: dict[str, str] = {}
        with store.engine.connect() as conn:
            for run_id, step, at in conn.execute(
                text("SELECT run_id, step, finished_at FROM journal WHERE finished_at IS NOT NULL")
            ):
                finished[(run_id, f"{run_id}:{step}")] = at.timestamp()
            for run_id, status in conn.execute(text("SELECT id, status FROM runs")):
                statuses[run_id] = status
    finally:
        store.engine.dispose()
    return finished, statuses


def _overlapping(made: Lab, runs: list[Execution]) -> tuple[int, int]:
    """The pairs of a step's executions that overlap: (by two live workers, across a cut
    of host A)."""
    live = across = 0
    for i, x in enumerate(runs):
        for y in runs[i + 1 :]:
            if not x.overlaps(y):
                continue
            if _cut_during(made, x) or _cut_during(made, y):
                across += 1
            else:
                live += 1
    return live, across


def _cut_during(made: Lab, e: Execution) -> bool:
    end = e.end if e.end is not None else float("inf")
    return e.host == HOST_A and any(c.at < end and e.begin < c.healed + 1 for c in made.cuts)


@dataclass
class _AtCuts:
    """The steps in flight on host A at each cut long enough to take it for dead, and how
    long until another host took each over."""

    in_flight: int = 0
    takeovers: list[float] = field(default_factory=list)
    detail: list[str] = field(default_factory=list)

    def add(self, made: Lab, key: str, runs: list[Execution]) -> None:
        for cut in made.cuts:
            if cut.healed - cut.at < TAKEN_AFTER:
                continue  # a blip: nobody takes a host back within it
            cut_off = [
                e
                for e in runs
                if e.host == HOST_A
                and e.begin < cut.at
                and (e.end is None or e.end > cut.at)
                and not any(e.begin < c.at < cut.at for c in made.cuts)  # an earlier cut's
            ]
            if not cut_off:
                continue
            self.in_flight += 1
            later = [e.begin for e in runs if e.host != HOST_A and e.begin > cut.at]
            if later:
                self.takeovers.append(min(later) - cut.at)
            was = [
                (round(e.begin - cut.at, 1), e.end and round(e.end - cut.at, 1)) for e in cut_off
            ]
            then = [(e.host, round(e.begin - cut.at, 1)) for e in runs if e.begin > cut.at]
            self.detail.append(f"{cut.how} {key}: on A {was}, then {then}")


def _ship_keys(made: Lab) -> list[tuple[str, str]]:
    """(run, key) of every `ship` call: the third step of each run's second model turn."""
    engine = create_engine(made.here_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT run_id, step FROM agent_jobs.journal"
                    " WHERE intent->'call'->>'name' = 'ship'"
                )
            ).all()
    finally:
        engine.dispose()
    return [(run_id, f"{run_id}:{step}") for run_id, step in rows]


# The cuts of the full experiment (bench/partition.py): six cycles, each cut at a moment
# host A runs a step; `tx` while one of its reads holds its run's journal rows in an open
# transaction; a blip of a second.
CYCLES: list[tuple[str, float]] = [
    ("drop", 10.0),
    ("link", 8.0),
    ("tx", 12.0),
    ("blip", 1.0),
    ("drop", 14.0),
    ("link", 9.0),
]


def experiment(made: Lab, cycles: list[tuple[str, float]], runs: int, every: float) -> Findings:
    """Start the hosts; while a plain client sends `runs` start_runs one every `every`
    seconds and a person decides, cut host A off once for each of `cycles` (how, for how
    long), each time while it runs a step; then wait for every run to end."""
    from agent_jobs.client import Client
    from agent_jobs.dispatch import CeleryDispatcher
    from agent_jobs.loading import load_app
    from agent_jobs.settings import Settings

    made.start_hosts()
    settings = Settings(
        broker_url=made.broker("127.0.0.1"), database_url=made.here_url, queue=QUEUE, app=APP
    )
    celery = celery_client(made.broker("127.0.0.1"), QUEUE)
    store = Store.from_url(made.here_url)
    client = Client(store, load_app(APP), settings, CeleryDispatcher(celery))
    try:
        with made.watching_beats(), made.deciding(client), made.enqueuing(runs, every):
            for how, seconds in cycles:
                locking = how == "tx"

                def busy(locking: bool = locking) -> bool:
                    running = made.running_on_a()
                    if locking:  # its read that holds its run's rows: the first call
                        return any(
                            key.endswith(":tool:call_1") and run in made.locking
                            for run, key in running
                        )
                    return bool(running)

                eventually(busy, 120, what=f"host A to run a step ({how})", every=0.05)
                made.cut(how, seconds)
                # A rejoins (beats again), and runs a step again, before the next cut.
                eventually(made.a_beats, 120, what="host A to beat again", every=0.1)
                healed = made.cuts[-1].healed
                eventually(
                    lambda h=healed: any(
                        e.host == HOST_A and e.begin > h
                        for runs_ in made.executions().values()
                        for e in runs_
                    ),
                    120,
                    what="host A to run a step again after the heal",
                    every=0.1,
                    context=made.logs,
                )
        made.settle(client)
    finally:
        celery.close()
        store.engine.dispose()
    return findings(made)
