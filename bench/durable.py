"""Benchmark of the durable runner: W1, W2, W3 and the floor, measured in one go.

    .venv/bin/python -m bench.durable [--runs 200] [--no-eager] [--no-sticky]
        [--w3 POOL:CONCURRENCY[xWORKERS][@RUNS]] [--peers]

W1: `--runs` runs of an agent whose first two model turns each ask for two reads and
whose third answers, on one worker with 2 processes: runs/s, p50/p95 per run, journal
rows, commits, WAL bytes and broker messages per run. W2: one run with eight 0.5 s
reads on 8 processes: wall time. The floor, measured in the same run: a Celery no-op
round trip and a Postgres single-row commit. W3: 200 runs (or `@RUNS`) of W1's shape
whose model calls take 1.0 s and reads 0.2 s (a run alone: 3.4 s), enqueued at once on
one worker (or `xWORKERS`) with the given pool: makespan against that ideal, and the
workers' peak RSS. With `--peers` (the `bench` extra; for Restate, `npm ci --prefix
bench/restate --ignore-scripts`), the same W1 and W2 on LangGraph + PostgresSaver, DBOS,
Restate and Temporal right after (`bench.peers`), W3 on Restate (200 runs and 1,000) and
on Temporal (200), and our figures as ratios to theirs where as many runs ran.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import create_engine, func, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs import encryption  # noqa: E402
from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from agent_jobs.store.db import make_engine, upgrade  # noqa: E402
from agent_jobs.store.schema import journal, runs  # noqa: E402
from bench.apps import app  # noqa: E402
from tests.support.hosts import Postgres as OwnPostgres  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import Process, service_env, start_worker  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def fresh_database(admin_url: str, name: str) -> str:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


# The indexes the runs list added (migration 0008); (thread_id) alone was there before.
LIST_INDEXES = (
    "ix_runs_created",
    "ix_runs_status_created",
    "ix_runs_agent_created",
    "ix_runs_actor_created",
    "ix_runs_thread_created",
    "ix_runs_root",
    "ix_runs_search",
    "ix_tool_calls_action",
)


def drop_list_indexes(url: str) -> None:
    """The schema as it was before the runs list's indexes."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        for name in LIST_INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        conn.execute("CREATE INDEX IF NOT EXISTS ix_runs_thread ON runs (thread_id)")


def libpq(url: str) -> str:
    """`url` for psycopg, working in agent-jobs' schema (as its own engines do)."""
    from agent_jobs.settings import get_settings

    plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
    joiner = "&" if "?" in plain else "?"
    return f"{plain}{joiner}options=-csearch_path%3D{get_settings().database_schema}"


def pg_commit_floor(url: str, n: int = 500) -> float:
    """Median seconds of one single-row INSERT and its COMMIT."""
    with psycopg.connect(libpq(url)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS floor_commit (id serial primary key, v int)")
        conn.commit()
        samples = []
        for i in range(n):
            started = time.perf_counter()
            conn.execute("INSERT INTO floor_commit (v) VALUES (%s)", (i,))
            conn.commit()
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def floor_worker(broker: str, concurrency: int, *extra: str) -> Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_")}
    env.update(FLOOR_BROKER_URL=broker, PYTHONPATH=str(ROOT))
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.floor:floor",
        "worker",
        f"--concurrency={concurrency}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=INFO",
        *extra,
    ]
    return Process(args, env, "floor").start(ready="ready.")


def celery_floor(broker: str, n: int = 200) -> float:
    """Median seconds of a no-op task's round trip (send, run, result back)."""
    proc = floor_worker(broker, 1)
    os.environ["FLOOR_BROKER_URL"] = broker
    from bench.floor import noop

    try:
        for _ in range(20):
            noop.delay().get(timeout=10)
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            noop.delay().get(timeout=10)
            samples.append(time.perf_counter() - started)
    finally:
        proc.stop()
    return statistics.median(samples)


def celery_throughput(broker: str, n: int = 2000) -> float:
    """No-op tasks a second that two processes drain with the workers' settings."""
    proc = floor_worker(broker, 2, "-E")
    os.environ["FLOOR_BROKER_URL"] = broker
    from bench.floor import floor, noop_acked

    floor.conf.worker_prefetch_multiplier = 1
    client = redis.Redis.from_url(broker)
    try:
        started = time.perf_counter()
        for _ in range(n):
            noop_acked.apply_async()
        while client.llen("celery") or client.hlen("unacked"):
            time.sleep(0.005)
        return n / (time.perf_counter() - started)
    finally:
        client.close()
        proc.stop()


def pg_counters(url: str) -> tuple[int, int]:
    """(write transactions so far, WAL position in bytes) of the cluster.

    Only a transaction that writes takes a transaction id, so the id's advance counts
    write transactions (reading it takes one too: subtract it).
    """
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        wal = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert xid is not None and wal is not None
    return int(xid[0]), int(wal[0])


def _ticks(pid: int, reaped: bool = False) -> int:
    """CPU clock ticks (user + system) a process has used; 0 once it is gone. With
    `reaped`, those of its children that ended and it waited for too."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime (fields 16 and 17)
    return ticks


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        todo.extend(int(c) for c in children)
    return found


def _named(prefix: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith(prefix):
                    pids.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return pids


# The postmaster of the benchmark's own cluster (`--own-postgres`), for every process of
# the benchmark (the peers' too): only its processes are Postgres's CPU.
POSTMASTER = "BENCH_POSTMASTER"


def _postgres_pids() -> list[int]:
    own = os.environ.get(POSTMASTER)
    return _descendants(int(own)) if own else _named("postgres")


def cpu_seconds(worker_pid: int, redis_pid: int | None) -> dict[str, float]:
    """CPU time used so far by the worker (all its processes), Postgres (the benchmark's
    own cluster, or else every Postgres process on this machine), and the Redis server
    (its own, when the benchmark started it).

    Postgres's includes the backends that have ended (the postmaster's children it
    reaped): a session opened and closed within the window is not missed."""
    hz = os.sysconf("SC_CLK_TCK")
    return {
        "worker": sum(_ticks(p) for p in _descendants(worker_pid)) / hz,
        "postgres": sum(_ticks(p, reaped=True) for p in _postgres_pids()) / hz,
        "redis": (_ticks(redis_pid) if redis_pid else 0) / hz,
    }


def redis_commands(client: redis.Redis) -> dict[str, int]:
    """Commands the Redis server has run so far, by command (every database, client)."""
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(entry.get("calls", 0)) for name, entry in stats.items()
    }


def broker_pushes(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("lpush", "rpush"))


def run_latency(store: Store, run_id: str) -> float:
    """Seconds from the run's creation to its end, as its row says."""
    with store.engine.connect() as conn:
        row = conn.execute(
            select(runs.c.created_at, runs.c.finished_at).where(runs.c.id == run_id)
        ).one()
    return float((row.finished_at - row.created_at).total_seconds())


def run_all(
    client: Client, agent: str, n: int, timeout: float, poll: float = 0.05
) -> tuple[float, list[str]]:
    started = time.perf_counter()
    ids = [client.enqueue_run(agent, "go", actor="bench") for _ in range(n)]
    deadline = time.monotonic() + timeout
    engine = client.store.engine
    while True:
        with engine.connect() as conn:
            done = conn.execute(
                select(func.count()).where(
                    runs.c.id.in_(ids), runs.c.status.in_(("completed", "failed"))
                )
            ).scalar_one()
        if done == n:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"only {done} of {n} {agent} runs finished in {timeout}s")
        time.sleep(poll)
    return time.perf_counter() - started, ids


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--redis",
        help="a Redis base URL (its databases are flushed); default: a redis-server of its own",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--no-list-indexes",
        action="store_true",
        help="drop the runs list's indexes (the filters' and the search's) after the "
        "migration: to weigh what they cost a run",
    )
    parser.add_argument(
        "--own-postgres",
        action="store_true",
        help="a Postgres cluster of its own (initdb, a free port; needs PostgreSQL's server "
        "binaries, and root runs them as `postgres`) in place of --pg: its WAL, write "
        "transactions and CPU are the benchmark's alone on a machine that does other work",
    )
    parser.add_argument(
        "--w3",
        action="append",
        metavar="POOL:CONCURRENCY",
        help="W3 (200 runs of 1.0 s model calls and 0.2 s reads, ideal 3.4 s) on a worker "
        "with this pool, e.g. threads:50 or prefork:8, or on N such workers of this host: "
        "threads:100x2, and another number of runs: threads:500x2@1000; repeatable "
        "(default: threads:50)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also W1 and W2 on LangGraph + PostgresSaver, DBOS, Restate and Temporal, and W3 "
        "on Restate and Temporal (bench.peers; needs the `bench` extra and, for Restate, "
        "`npm ci --prefix bench/restate --ignore-scripts`), and our figures as ratios to theirs",
    )
    parser.add_argument(
        "--eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the fast path (AGENT_JOBS_EAGER_STEPS) on the workers; --no-eager: every step "
        "crosses the broker",
    )
    parser.add_argument(
        "--sticky",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="runs' loops kept in the workers between passes (AGENT_JOBS_STICKY_LOOPS); "
        "--no-sticky: every pass replays its run",
    )
    parser.add_argument(
        "--encryption",
        action="store_true",
        help="encryption at rest on, in this process and the workers, with a key generated "
        "for the run (AGENT_JOBS_ENCRYPTION_KEYS): W1 with it against W1 without",
    )
    args = parser.parse_args()
    sealing: dict[str, str] = {}
    if args.encryption:
        sealing = {
            "AGENT_JOBS_ENCRYPTION_KEYS": json.dumps(
                {"bench": base64.b64encode(os.urandom(32)).decode()}
            ),
            "AGENT_JOBS_ENCRYPTION_KEY_ID": "bench",
        }
        encryption.configure(
            sealing["AGENT_JOBS_ENCRYPTION_KEYS"], "bench", settings=False
        )  # this process's client seals the runs it starts
    if args.own_postgres:
        own_pg = OwnPostgres(listen=["127.0.0.1"], trusted="127.0.0.1/32").start()
        atexit.register(own_pg.stop)
        args.pg = own_pg.url("127.0.0.1")
        os.environ[POSTMASTER] = (own_pg.data / "postmaster.pid").read_text().split()[0]
    redis_pid: int | None = None
    if args.redis is None:
        own_redis = RedisServer().start()
        atexit.register(own_redis.close)
        args.redis = own_redis.url(0).rsplit("/", 1)[0]
        redis_pid = own_redis.proc.pid if own_redis.proc is not None else None

    url = fresh_database(args.pg, "agent_jobs_bench")
    if args.no_list_indexes:
        drop_list_indexes(url)
    broker = f"{args.redis}/9"
    broker_client = redis.Redis.from_url(broker)
    broker_client.flushdb()

    figures: dict[str, Any] = {"encryption": args.encryption}
    figures["floor_celery_roundtrip_ms"] = celery_floor(f"{args.redis}/10") * 1000
    figures["floor_celery_tasks_per_s"] = celery_throughput(f"{args.redis}/10")
    figures["floor_pg_commit_ms"] = pg_commit_floor(url) * 1000
    figures["floor_redis_roundtrip_ms"] = _redis_floor(broker_client) * 1000

    os.environ["AGENT_JOBS_DATABASE_URL"] = url
    store = Store.from_url(url)
    settings = Settings(broker_url=broker, database_url=url)
    celery = celery_client(broker)
    client = Client(store, app, settings, CeleryDispatcher(celery))
    env = service_env(
        broker,
        url,
        AGENT_JOBS_APP="bench.apps:app",
        # The pool a worker sizes itself (the tests keep one connection a process: a
        # second one wanted at once, by the notification sender, is opened and closed).
        AGENT_JOBS_DB_POOL_SIZE="",
        AGENT_JOBS_EAGER_STEPS="true" if args.eager else "false",
        AGENT_JOBS_STICKY_LOOPS="true" if args.sticky else "false",
        **sealing,
    )
    env["PYTHONPATH"] = str(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))

    # W1 on one worker with two processes.
    worker = start_worker(env, concurrency=2, name="w1")
    try:
        run_all(client, "w1", 10, 60)  # warm up: forks, connections, imports
        # One run at a time: the latency of a run with nothing queued ahead of it.
        # Measured by the run's own row (created to finished), not by this poll loop.
        alone = [
            run_latency(store, run_all(client, "w1", 1, 60, poll=0.005)[1][0]) for _ in range(20)
        ]
        assert worker.proc is not None
        commits0, wal0 = pg_counters(url)
        pushes0 = broker_pushes(broker_client)
        commands0 = redis_commands(broker_client)
        cpu0 = cpu_seconds(worker.proc.pid, redis_pid)
        wall, ids = run_all(client, "w1", args.runs, 600)
        cpu1 = cpu_seconds(worker.proc.pid, redis_pid)
        commands1 = redis_commands(broker_client)
        commits1, wal1 = pg_counters(url)
        pushes1 = broker_pushes(broker_client)
    finally:
        worker.stop()
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(runs.c.status, runs.c.created_at, runs.c.finished_at).where(runs.c.id.in_(ids))
        ).all()
        journal_rows = conn.execute(
            select(func.count()).select_from(journal).where(journal.c.run_id.in_(ids))
        ).scalar_one()
    failed = [r for r in rows if r.status != "completed"]
    if failed:
        raise SystemExit(f"{len(failed)} W1 runs did not complete")
    latencies = [(r.finished_at - r.created_at).total_seconds() for r in rows]
    n = args.runs
    figures.update(
        w1_runs=n,
        w1_wall_s=wall,
        w1_runs_per_s=n / wall,
        w1_p50_ms=percentile(latencies, 50) * 1000,
        w1_p95_ms=percentile(latencies, 95) * 1000,
        w1_journal_rows_per_run=journal_rows / n,
        w1_commits_per_run=(commits1 - commits0 - 1) / n,
        w1_wal_bytes_per_run=(wal1 - wal0) / n,
        w1_broker_messages_per_run=(pushes1 - pushes0) / n,
        # The benchmark's own polling and counting are in these two, a few per run.
        w1_redis_commands_per_run=(sum(commands1.values()) - sum(commands0.values())) / n,
        w1_redis_commands_by_kind={
            name: (calls - commands0.get(name, 0)) / n
            for name, calls in sorted(commands1.items(), key=lambda kv: -kv[1])
            if calls - commands0.get(name, 0) >= n / 10
        },
        **{f"w1_cpu_ms_per_run_{k}": (cpu1[k] - cpu0[k]) / n * 1000 for k in cpu0},
        w1_cpu_ms_per_run=sum(cpu1[k] - cpu0[k] for k in cpu0) / n * 1000,
        w1_alone_p50_ms=statistics.median(alone) * 1000,
    )

    # W2: eight half-second reads, enough processes to run them together.
    worker = start_worker(env, concurrency=8, name="w2")
    try:
        run_all(client, "w2", 1, 60)  # warm every process
        wall, _ = run_all(client, "w2", 1, 60)
    finally:
        worker.stop()
    figures["w2_wall_s"] = wall

    for spec in args.w3 or ["threads:50"]:
        pool, _, shape = spec.partition(":")
        shape, _, count = shape.partition("@")
        concurrency, _, workers = shape.partition("x")
        figures[f"w3_{pool}_{shape}" + (f"@{count}" if count else "")] = w3(
            client, env, pool, int(concurrency), int(workers or 1), int(count or W3_RUNS)
        )
    # A run alone crosses the broker this often (its start, and the steps it sends: 7
    # without the fast path, 2 with it): per hop, how many Celery no-op round trips?
    hops = max(1.0, figures["w1_broker_messages_per_run"])
    figures["w1_per_hop_vs_floor"] = (
        figures["w1_alone_p50_ms"] / hops / figures["floor_celery_roundtrip_ms"]
    )

    celery.close()
    store.engine.dispose()
    del tmp
    if args.peers:
        figures["peers"] = peers(args.pg, args.runs)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        report(figures)


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


W3_RUNS = 200  # W3's runs at once unless a `--w3` spec says another number
# Connections the benchmark's own processes keep to Postgres beside the workers'.
POSTGRES_CONNECTIONS, OWN_CONNECTIONS, BURST = 100, 10, 10


def db_pool_for(workers: int, concurrency: int, pool: str) -> int:
    """A worker's `AGENT_JOBS_DB_POOL_SIZE`: as the worker sizes itself (a threads pool's
    concurrency up to 20, plus 2; 5 a prefork process), less where `workers` of them with
    their burst of 10 each would pass Postgres's default 100 connections."""
    processes = workers * (concurrency if pool == "prefork" else 1)
    own = min(concurrency, 20) + 2 if pool != "prefork" else 5
    fits = (POSTGRES_CONNECTIONS - OWN_CONNECTIONS) // processes - BURST
    return max(1, min(own, fits))


def w3(
    client: Client,
    env: dict[str, str],
    pool: str,
    concurrency: int,
    workers: int = 1,
    count: int = W3_RUNS,
) -> dict[str, float]:
    """W3 on `workers` workers of this host: makespan of `count` runs enqueued at once,
    and the workers' peak RSS together. Each worker's database pool is sized so that
    the workers together, at their burst, stay within Postgres's 100 connections."""
    env = {**env, "AGENT_JOBS_DB_POOL_SIZE": str(db_pool_for(workers, concurrency, pool))}
    procs = [
        start_worker(env, concurrency=concurrency, name=f"w3-{pool}-{n}", pool=pool)
        for n in range(workers)
    ]
    peak = 0
    try:
        pids = [proc.proc.pid for proc in procs if proc.proc is not None]
        run_all(client, "w3", 2 * workers, 60)  # warm up
        started = time.perf_counter()
        ids = [client.enqueue_run("w3", "go", actor="bench") for _ in range(count)]
        engine = client.store.engine
        while True:
            peak = max(peak, sum(_rss_bytes(_descendants(pid)) for pid in pids))
            with engine.connect() as conn:
                done = conn.execute(
                    select(func.count()).where(
                        runs.c.id.in_(ids), runs.c.status.in_(("completed", "failed"))
                    )
                ).scalar_one()
            if done == len(ids):
                break
            if time.perf_counter() - started > 900:
                raise SystemExit(f"W3 on {pool}:{concurrency}: {done} of {count} in 900 s")
            time.sleep(0.2)
        makespan = time.perf_counter() - started
        with engine.connect() as conn:
            failed = conn.execute(
                select(func.count()).where(runs.c.id.in_(ids), runs.c.status != "completed")
            ).scalar_one()
        if failed:
            raise SystemExit(
                f"W3 on {pool}:{concurrency}: {failed} of {count} runs did not complete"
            )
    finally:
        for proc in procs:
            proc.stop()
    return {
        "runs": count,
        "makespan_s": makespan,
        "vs_ideal": makespan / 3.4,
        "rss_mib": peak / 2**20,
    }


PEERS = ("langgraph", "dbos", "restate", "temporal")
# W3 on the peers that run it, by its number of runs: 200, and 1,000 at LLM scale.
PEERS_W3 = {"restate": (200, 1000), "temporal": (200,)}


class PeerFailed(Exception):
    pass


def peer(name: str, pg: str, runs: int, w3: int | None = None) -> dict[str, Any]:
    """A peer's figures (`bench.peers`), measured in a process of its own."""
    extra = ["--w3", str(w3)] if w3 else []
    done = subprocess.run(
        [sys.executable, "-m", "bench.peers", name, "--pg", pg, "--runs", str(runs), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise PeerFailed(f"the {name} peer failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def peers(pg: str, runs: int) -> dict[str, dict[str, Any]]:
    """Every peer's figures. One that cannot run here (its server not installed, say) is
    left out with its reason on stderr, and the others still measured."""
    found: dict[str, dict[str, Any]] = {}
    for name in PEERS:
        try:
            found[name] = peer(name, pg, runs)
            for size in PEERS_W3.get(name, ()):
                found[name][f"w3_{size}"] = peer(name, pg, runs, w3=size)
        except PeerFailed as failed:
            print(failed, file=sys.stderr)
    return found


def _redis_floor(client: redis.Redis, n: int = 1000) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def report(f: dict[str, Any]) -> None:
    print(
        f"floor: Celery no-op round trip {f['floor_celery_roundtrip_ms']:.2f} ms, "
        f"Postgres commit {f['floor_pg_commit_ms']:.2f} ms, Redis round trip "
        f"{f['floor_redis_roundtrip_ms']:.3f} ms"
    )
    print(
        f"   Celery alone, acks late, prefetch 1, events on, 2 processes: "
        f"{f['floor_celery_tasks_per_s']:.0f} no-op tasks/s "
        f"(a W1 run sends {f['w1_broker_messages_per_run']:.0f} of them: at most "
        f"{f['floor_celery_tasks_per_s'] / max(1.0, f['w1_broker_messages_per_run']):.0f} "
        "runs/s)"
    )
    print(
        f"W1 ({f['w1_runs']} runs, 2 worker processes): {f['w1_runs_per_s']:.1f} runs/s, "
        f"p50 {f['w1_p50_ms']:.1f} ms, p95 {f['w1_p95_ms']:.1f} ms per run"
    )
    print(
        f"   per run: {f['w1_journal_rows_per_run']:.1f} journal rows, "
        f"{f['w1_commits_per_run']:.1f} write transactions, "
        f"{f['w1_wal_bytes_per_run'] / 1024:.1f} kB WAL, "
        f"{f['w1_broker_messages_per_run']:.1f} broker messages, "
        f"{f['w1_redis_commands_per_run']:.0f} Redis commands"
    )
    kinds = sorted(f["w1_redis_commands_by_kind"].items(), key=lambda kv: -kv[1])
    print("   Redis commands a run: " + ", ".join(f"{k} {v:.1f}" for k, v in kinds[:10]))
    print(
        f"   CPU per run: {f['w1_cpu_ms_per_run']:.0f} ms (worker "
        f"{f['w1_cpu_ms_per_run_worker']:.0f}, Postgres {f['w1_cpu_ms_per_run_postgres']:.0f}, "
        f"Redis {f['w1_cpu_ms_per_run_redis']:.0f})"
    )
    print(
        f"   one run alone: p50 {f['w1_alone_p50_ms']:.1f} ms = {f['w1_per_hop_vs_floor']:.2f} x "
        f"the Celery no-op round trip per broker hop ({f['w1_broker_messages_per_run']:.0f} a run)"
    )
    print(f"W2 (eight 0.5 s reads, 8 processes): {f['w2_wall_s']:.2f} s wall")
    for name, p in f.get("peers", {}).items():
        report_peer(f, name, p)
    for key, w3 in f.items():
        if key.startswith("w3_"):
            print(
                f"W3 ({key[3:]}, {w3['runs']} runs of 1.0 s model calls, 0.2 s reads): "
                f"{w3['makespan_s']:.1f} s = {w3['vs_ideal']:.1f} x the 3.4 s ideal, "
                f"worker RSS {w3['rss_mib']:.0f} MiB"
            )
    for name, p in f.get("peers", {}).items():
        for key, w3 in p.items():
            if key.startswith("w3_"):
                report_peer_w3(f, name, w3)


def report_peer(f: dict[str, Any], name: str, p: dict[str, Any]) -> None:
    """A peer's W1 and W2, and ours as ratios to them."""
    roles = [k.removeprefix("w1_cpu_ms_per_run_") for k in p if k.startswith("w1_cpu_ms_per_run_")]
    cpu = ", ".join(f"{role} {p[f'w1_cpu_ms_per_run_{role}']:.0f}" for role in roles)
    writes = (
        f", {p['w1_commits_per_run']:.1f} write transactions and "
        f"{p['w1_wal_bytes_per_run'] / 1024:.1f} kB WAL a run"
        if "w1_wal_bytes_per_run" in p
        # Restate's journal entries, Temporal's history events.
        else f", {p['w1_record_entries_per_run']} entries in the record of a run"
    )
    print(
        f"{name}: W1 {p['w1_seq_runs_per_s']:.1f} runs/s one after another "
        f"({p['w1_conc4_runs_per_s']:.1f} 4 at a time), p50 {p['w1_seq_p50_ms']:.1f} ms "
        f"a run, CPU {p['w1_cpu_ms_per_run']:.0f} ms a run "
        f"({cpu or 'its process and Postgres'}){writes}; W2 {p['w2_wall_s']:.2f} s"
    )
    wal = (
        f"WAL a run {f['w1_wal_bytes_per_run'] / p['w1_wal_bytes_per_run']:.2f}, "
        if "w1_wal_bytes_per_run" in p
        else ""
    )
    print(
        f"   agent-jobs / {name}: W1 runs/s {f['w1_runs_per_s'] / p['w1_seq_runs_per_s']:.2f}"
        f" (vs its 4 at a time {f['w1_runs_per_s'] / p['w1_conc4_runs_per_s']:.2f}), "
        f"a run alone {f['w1_alone_p50_ms'] / p['w1_seq_p50_ms']:.2f}, "
        f"CPU a run {f['w1_cpu_ms_per_run'] / p['w1_cpu_ms_per_run']:.2f}, "
        f"{wal}W2 {f['w2_wall_s'] / p['w2_wall_s']:.2f}"
    )


def report_peer_w3(f: dict[str, Any], name: str, w3: dict[str, Any]) -> None:
    """A peer's W3, and ours as ratios to it where ours ran as many runs."""
    rss = ", ".join(
        f"{k.removeprefix('rss_mib_')} {v:.0f}" for k, v in w3.items() if k.startswith("rss_mib_")
    )
    print(
        f"{name} W3 ({w3['runs']} runs at once): {w3['makespan_s']:.1f} s = "
        f"{w3['vs_ideal']:.1f} x the 3.4 s ideal, peak RSS MiB: {rss}"
    )
    for key, ours in f.items():
        if key.startswith("w3_") and ours.get("runs", W3_RUNS) == w3["runs"]:
            print(
                f"   agent-jobs ({key[3:]}) / {name}: W3 makespan "
                f"{ours['makespan_s'] / w3['makespan_s']:.2f}"
            )


if __name__ == "__main__":
    main()
