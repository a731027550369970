"""Where a W1 run's cost goes: by process, by function, by statement, by Redis command.

    .venv/bin/python -m bench.profile [--runs 300] [--pool prefork] [--out DIR] [--json]

W1 (bench.durable's agent: two turns of two reads, then an answer) on one worker with 2
processes, its own database and Redis, in four windows after a warm-up:

1. the figures `bench.durable` gives for W1 (runs/s, p50, CPU a run by process, Redis
   commands a run by kind), with nothing attached;
2. `py-spy record` (sampling, `--nonblocking`) on the worker and every process of its
   pool, and on this process (the client that enqueues and polls): the top functions by
   self and by total time, time by package, and what the time in psycopg's pipeline is
   spent on and who calls it;
3. every statement Postgres ran for the benchmark's database (`log_statement=all` on it
   alone, read back from the server's log file, `--pg-log`): statements a run by kind;
4. Redis `MONITOR` over a few runs: commands and bytes a run by command and key, and
   the bytes of each kind of message (task messages, Flower's events, live frames).

Then the bytes a run keeps in Postgres: the journal's intents and results by step kind,
the session log's events. Raw stacks are kept in `--out` (py-spy's collapsed format).
Needs py-spy (`.venv/bin/pip install py-spy`) and root or ptrace rights.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from bench.apps import app  # noqa: E402
from bench.durable import (  # noqa: E402
    _descendants,
    _named,
    cpu_seconds,
    fresh_database,
    libpq,
    percentile,
    redis_commands,
    run_all,
    run_latency,
)
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import Process, service_env, start_worker  # noqa: E402

DATABASE = "agent_jobs_profile"
STEPS_A_RUN = 7  # W1: three model steps, four reads


# --- window 1: the figures ------------------------------------------------------------


def figures(
    client: Client, worker: Process, broker: redis.Redis, redis_pid: int | None, n: int
) -> dict[str, Any]:
    store = client.store
    alone = [run_latency(store, run_all(client, "w1", 1, 60, poll=0.005)[1][0]) for _ in range(20)]
    assert worker.proc is not None
    commands0, cpu0 = redis_commands(broker), cpu_seconds(worker.proc.pid, redis_pid)
    reaped0, sessions0 = _reaped_postgres(), _sessions(client)
    wall, _ = run_all(client, "w1", n, 600)
    cpu1, commands1 = cpu_seconds(worker.proc.pid, redis_pid), redis_commands(broker)
    reaped1, sessions1 = _reaped_postgres(), _sessions(client)
    return {
        "runs": n,
        # Postgres sessions opened a run, and the CPU of the backends that ended in the
        # window (the postmaster's reaped children), which cpu_seconds does not see.
        "sessions_per_run": (sessions1 - sessions0) / n,
        "postgres_ended_backends_cpu_ms_per_run": (reaped1 - reaped0) / n * 1000,
        "runs_per_s": n / wall,
        "alone_p50_ms": percentile(alone, 50) * 1000,
        "cpu_ms_per_run": {k: (cpu1[k] - cpu0[k]) / n * 1000 for k in cpu0},
        "redis_commands_per_run": {
            name: round((calls - commands0.get(name, 0)) / n, 2)
            for name, calls in sorted(commands1.items(), key=lambda kv: -kv[1])
            if calls - commands0.get(name, 0) >= n / 10
        },
    }


def _reaped_postgres() -> float:
    """CPU seconds of the Postgres processes that ended and were reaped by the
    postmaster (its children's user and system time)."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _named("postgres"):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[13]) + int(fields[14])  # cutime, cstime (fields 16 and 17)
    return total / hz


def _sessions(client: Client) -> int:
    with client.store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        ).scalar_one()
    return int(found)


# --- window 2: py-spy ------------------------------------------------------------------

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


NATIVE = False  # --native: py-spy reads the native frames too (C extensions, libpq)


def _spy(pid: int, out: Path, subprocesses: bool) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    # Only the thread holding the GIL is sampled: a thread woken from a socket and
    # waiting for a core (two cores, shared by every process here) is not CPU spent.
    args = [spy, "record", "--pid", str(pid), "--rate", "250", "--gil"]
    args += ["--format", "raw", "--output", str(out)]
    if subprocesses:
        args.append("--subprocesses")
    # Native frames need the process paused while it is sampled; else it runs on.
    args.append("--native" if NATIVE else "--nonblocking")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def spied(
    client: Client, worker: Process, n: int, out: Path, *, alone: bool = False
) -> dict[str, Path]:
    """W1 runs under py-spy: the worker with its pool, and this process. `alone`: one
    run at a time (the cores mostly idle, so a sample is CPU, not a wait for a core)."""
    assert worker.proc is not None
    tag = "-alone" if alone else ""
    paths = {"worker": out / f"worker{tag}.stacks", "client": out / f"client{tag}.stacks"}
    spies = [
        _spy(worker.proc.pid, paths["worker"], subprocesses=True),
        _spy(os.getpid(), paths["client"], subprocesses=False),
    ]
    time.sleep(1.0)  # py-spy attaches
    if alone:
        for _ in range(n):
            run_all(client, "w1", 1, 60, poll=0.005)
    else:
        run_all(client, "w1", n, 600)
    for spy in spies:
        spy.send_signal(2)  # SIGINT: py-spy writes what it sampled
    for spy in spies:
        _, err = spy.communicate(timeout=60)
        if spy.returncode not in (0, -2, 130):
            raise SystemExit(f"py-spy failed: {err.decode(errors='replace')[-2000:]}")
    return paths


def _frames(stack: str) -> list[tuple[str, str]]:
    """(function, file) of each frame, outermost first; a `process …` root dropped."""
    frames = []
    for part in stack.split(";"):
        if part.startswith("process "):
            continue
        m = _FRAME.match(part)
        frames.append((m.group("func"), m.group("file")) if m else (part, ""))
    return frames


def _process(stack: str, main: int | None) -> str:
    # A pool process's stacks sit under its parent's: the innermost `process` is its own.
    pids = re.findall(r"(?:^|;)process (\d+):", stack)
    if not pids or int(pids[-1]) == main:
        return "main process"
    return "pool process"


_PACKAGES = (
    ("psycopg pipeline", ("psycopg/_pipeline", "psycopg/generators", "psycopg/waiting")),
    ("psycopg", ("psycopg/", "psycopg_binary/")),
    ("sqlalchemy", ("sqlalchemy/",)),
    ("kombu", ("kombu/",)),
    ("celery", ("celery/",)),
    ("billiard", ("billiard/",)),
    ("redis-py", ("redis/",)),
    ("pydantic", ("pydantic/", "pydantic_core/")),
    ("json", ("json/",)),
    ("logging", ("logging/",)),
    ("greenlet", ("greenlet/",)),
    ("agent_jobs", ("agent_jobs/",)),
    ("tasks", ("tasks/",)),
)


def package(file: str) -> str:
    for name, marks in _PACKAGES:
        if any(mark in file for mark in marks):
            return name
    if "/lib/python3" in file and "site-packages" not in file:
        return "stdlib"
    return "other"


def _short(func: str, file: str) -> str:
    path = file.split("site-packages/")[-1].split("/lib/python3.")[-1]
    path = path.split("/", 1)[-1] if path[:2].isdigit() else path
    path = path.removeprefix(str(ROOT) + "/")
    return f"{func} ({path})"


def analyse(path: Path, main: int | None = None, top: int = 25) -> dict[str, Any]:
    """Self and total time by function, self time by package, by process, and the
    agent-jobs callers of psycopg's pipeline and of everything below SQLAlchemy."""
    self_time: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    by_package: collections.Counter[str] = collections.Counter()
    by_process: collections.Counter[str] = collections.Counter()
    inside: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    callers: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        frames = _frames(stack)
        if not frames:
            continue
        by_process[_process(stack, main)] += count
        func, file = frames[-1]
        self_time[_short(func, file)] += count
        by_package[package(file)] += count
        for name in {_short(f, p) for f, p in frames}:
            total[name] += count
        for area in ("psycopg pipeline", "psycopg", "sqlalchemy", "redis-py", "kombu"):
            at = next((i for i, (_, p) in enumerate(frames) if package(p) == area), None)
            if at is None:
                continue
            # What it spends the time on (the innermost frame), and who asked (the
            # innermost agent-jobs or tasks frame above it).
            inside[area][_short(func, file)] += count
            ours = [_short(f, p) for f, p in frames[:at] if package(p) in ("agent_jobs", "tasks")]
            callers[area][ours[-1] if ours else "(outside agent-jobs)"] += count

    def share(counter: collections.Counter[str], k: int = top) -> list[tuple[str, float]]:
        return [(name, round(100 * c / samples, 1)) for name, c in counter.most_common(k)]

    return {
        "samples": samples,
        "by_process": share(by_process),
        "by_package": share(by_package),
        "self": share(self_time),
        "total": share(total),
        "inside": {area: share(c, 12) for area, c in inside.items()},
        "callers": {area: share(c, 12) for area, c in callers.items()},
    }


# --- window 2b: perf, on-CPU, native -------------------------------------------------


def perfed(
    client: Client, worker: Process, redis_pid: int | None, n: int, out: Path
) -> dict[str, Any] | None:
    """W1 runs under `perf record` (on-CPU samples) on the worker's processes, every
    Postgres process and Redis: CPU by process and shared object (the interpreter, the
    kernel, libpq, Postgres), and the top native symbols."""
    perf = shutil.which("perf")
    if perf is None or worker.proc is None:
        return None
    pids = [*_descendants(worker.proc.pid), *_named("postgres")]
    pids += [redis_pid] if redis_pid else []
    data = out / "perf.data"
    spy = subprocess.Popen(
        [perf, "record", "-F", "499", "-o", str(data), "-p", ",".join(map(str, pids))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    run_all(client, "w1", n, 600)
    spy.send_signal(2)
    spy.wait(timeout=60)

    def table(sort: str, limit: int) -> list[tuple[float, str]]:
        done = subprocess.run(
            [perf, "report", "-i", str(data), "--sort", sort, "--stdio", "--no-children"],
            capture_output=True,
            text=True,
            check=False,
        )
        rows = []
        for line in done.stdout.splitlines():
            m = re.match(r"\s*([\d.]+)%\s+(.*)$", line)
            if m:
                rows.append((float(m.group(1)), " ".join(m.group(2).split())))
        return rows[:limit]

    return {"by_comm_dso": table("comm,dso", 30), "by_symbol": table("comm,dso,sym", 40)}


# --- window 2c: system calls ---------------------------------------------------------


def straced(client: Client, worker: Process, n: int, out: Path) -> dict[str, Any] | None:
    """System calls of the worker's processes a run, by call (`strace -c`: it slows them
    down a lot, so this window says how many, not how long)."""
    strace = shutil.which("strace")
    if strace is None or worker.proc is None:
        return None
    log = out / "strace.txt"
    pids = _descendants(worker.proc.pid)
    args = [strace, "-c", "-f", "-o", str(log)]
    for pid in pids:
        args += ["-p", str(pid)]
    tracer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    run_all(client, "w1", n, 600)
    tracer.send_signal(2)
    tracer.wait(timeout=60)
    calls = []
    for line in log.read_text().splitlines():
        fields = line.split()
        if (
            len(fields) >= 5
            and fields[-1].isidentifier()
            and fields[3].isdigit()
            and fields[-1] != "total"
        ):
            calls.append((fields[-1], round(int(fields[3]) / n, 1)))
    calls.sort(key=lambda kv: -kv[1])
    return {"per_run": round(sum(c for _, c in calls), 1), "by_call_per_run": calls[:20]}


# --- window 3: statements -------------------------------------------------------------

_LOGGED = re.compile(r"@(?P<db>\S+) LOG:\s+(?:statement|execute [^:]*): (?P<sql>.*)$")


def statements(
    url: str, pg_log: Path, client: Client, env: dict[str, str], n: int, out: Path
) -> dict[str, Any] | None:
    """Every statement Postgres ran for the worker over `n` runs, by kind: the worker
    starts after `log_statement=all` is set on the database (sessions read it as they
    start; this process's connections, opened before, log nothing)."""
    if not pg_log.exists():
        return None
    admin = psycopg.connect(libpq(url), autocommit=True)
    admin.execute(f"ALTER DATABASE \"{DATABASE}\" SET log_statement = 'all'")
    try:
        worker = start_worker(env, concurrency=2, name="profile-statements")
        try:
            run_all(client, "w1", 10, 60)  # warm up
            start = pg_log.stat().st_size
            run_all(client, "w1", n, 600)
            time.sleep(0.5)
        finally:
            worker.stop()
        with pg_log.open("rb") as f:
            f.seek(start)
            logged = f.read().decode(errors="replace")
        (out / "statements.log").write_text(logged)
    finally:
        admin.execute(f'ALTER DATABASE "{DATABASE}" RESET log_statement')
        admin.close()
    kinds: collections.Counter[str] = collections.Counter()
    for line in _entries(logged):
        m = _LOGGED.search(line)
        if m is None or m.group("db") != DATABASE:
            continue
        kinds[_statement_kind(m.group("sql"))] += 1
    total = sum(kinds.values())
    return {
        "per_run": round(total / n, 1),
        "per_step": round(total / n / STEPS_A_RUN, 2),
        "by_kind_per_run": [(k, round(c / n, 2)) for k, c in kinds.most_common()],
    }


def _entries(logged: str) -> list[str]:
    """The log's entries, a statement's further lines (a tab first) joined to its first."""
    entries: list[str] = []
    for line in logged.splitlines():
        if line.startswith("\t") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    return entries


def _statement_kind(sql: str) -> str:
    sql = " ".join(sql.split())
    head = sql.split(" ", 1)[0].upper()
    if head in ("BEGIN", "COMMIT", "ROLLBACK", "SET", "SHOW"):
        return sql[:40]
    table = re.search(r"\b(?:FROM|INTO|UPDATE)\s+(?:agent_jobs\.)?(\w+)", sql, re.IGNORECASE)
    return f"{head} {table.group(1) if table else '?'}"


# --- window 4: Redis MONITOR ----------------------------------------------------------

_MONITOR = re.compile(r'^[\d.]+ \[\d+ [^\]]+\] (?P<args>".*)$')
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def monitored(redis_url: str, client: Client, n: int) -> dict[str, Any]:
    """Commands and bytes (arguments as sent) a run, by command and key, over `n` runs."""
    conn = redis.Redis.from_url(redis_url)
    lines: list[str] = []
    stop = threading.Event()

    def listen() -> None:
        with conn.monitor() as monitor:  # type: ignore[no-untyped-call]
            for entry in monitor.listen():
                if stop.is_set():
                    return
                lines.append(json.dumps([entry["command"]]))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    time.sleep(0.3)
    run_all(client, "w1", n, 600, poll=0.2)
    stop.set()
    redis.Redis.from_url(redis_url).ping()  # one more command, for the listener to see stop
    thread.join(timeout=5)
    commands: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for line in lines:
        raw: str = json.loads(line)[0]
        parts = raw.split(" ")
        name = parts[0].upper()
        if name in ("EVALSHA", "EVAL") and len(parts) > 3:  # the script, by its first key
            key = f"{parts[1].strip(chr(34))[:8]} {_key_kind(parts[3])}"
        else:
            key = _key_kind(parts[1]) if len(parts) > 1 else ""
        label = f"{name} {key}".strip()
        commands[label] += 1
        sizes[label] += len(raw.encode())
    return {
        "runs": n,
        "per_run": round(sum(commands.values()) / n, 1),
        "bytes_per_run": round(sum(sizes.values()) / n),
        "by_command_per_run": [
            (k, round(c / n, 2), round(sizes[k] / n)) for k, c in commands.most_common()
        ],
    }


def _key_kind(key: str) -> str:
    key = key.strip('"')
    key = re.sub(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", "<id>", key)
    key = re.sub(r"[0-9a-f]{32}", "<id>", key)
    return re.sub(r"\d+", "<n>", key)[:48]


# --- bytes kept in Postgres -----------------------------------------------------------


def kept_bytes(store: Store) -> dict[str, Any]:
    """Bytes a W1 run keeps: the journal's intents and results by step kind, events."""
    with store.engine.connect() as conn:
        runs = conn.execute(text("SELECT count(*) FROM runs WHERE agent = 'w1'")).scalar_one()
        journal = conn.execute(
            text(
                "SELECT split_part(step, ':', 1) AS kind, count(*), "
                "sum(octet_length(intent::text)), sum(octet_length(coalesce(result::text, ''))) "
                "FROM journal GROUP BY 1 ORDER BY 3 DESC"
            )
        ).all()
        events = conn.execute(
            text(
                "SELECT type, count(*), sum(octet_length(data::text)) FROM events "
                "GROUP BY 1 ORDER BY 3 DESC"
            )
        ).all()
    return {
        "runs": runs,
        "journal_per_run": [
            (r[0], round(r[1] / runs, 2), round(r[2] / runs), round(r[3] / runs)) for r in journal
        ],
        "events_per_run": [(r[0], round(r[1] / runs, 2), round(r[2] / runs)) for r in events],
    }


# --- the report -----------------------------------------------------------------------


def report(found: dict[str, Any]) -> None:
    if "figures" in found:
        _report_figures(found["figures"])
    for key, how in (("spy", ""), ("spy_alone", ", one run at a time")):
        for who in ("worker", "client"):
            if (spy := found.get(key, {}).get(who)) is not None:
                _report_spy(who + how, spy)
    if found.get("perf"):
        for title in ("by_comm_dso", "by_symbol"):
            _table(
                f"perf (on-CPU samples), {title}",
                [(f"{p:5.1f}", n) for p, n in found["perf"][title]],
            )
    if t := found.get("strace"):
        _table(f"system calls of the worker: {t['per_run']} a run", t["by_call_per_run"])
    if s := found.get("statements"):
        title = f"statements: {s['per_run']} a run, {s['per_step']} a step"
        _table(title, [(c, n) for n, c in s["by_kind_per_run"]])
    if found.get("monitor"):
        _report_monitor(found["monitor"])
    k = found["kept"]
    _table("kept in Postgres a run: journal (kind, rows, intent B, result B)", k["journal_per_run"])
    _table("events (kind, rows, payload B)", k["events_per_run"])


def _table(title: str, rows: list[Any]) -> None:
    print(f"\n== {title} ==")
    for row in rows:
        print("  " + "  ".join(str(cell) for cell in row))


def _report_figures(f: dict[str, Any]) -> None:
    cpu = f["cpu_ms_per_run"]
    print(
        f"W1 ({f['runs']} runs, 2 worker processes): {f['runs_per_s']:.1f} runs/s, a run alone "
        f"p50 {f['alone_p50_ms']:.1f} ms; CPU a run {sum(cpu.values()):.1f} ms (worker "
        f"{cpu['worker']:.1f}, Postgres {cpu['postgres']:.1f}, Redis {cpu['redis']:.1f})"
    )
    print(
        f"   Postgres sessions opened a run {f['sessions_per_run']:.2f}; CPU of the backends "
        f"that ended in the window {f['postgres_ended_backends_cpu_ms_per_run']:.1f} ms a run"
    )
    print(
        "Redis commands a run: "
        + ", ".join(f"{k} {v}" for k, v in f["redis_commands_per_run"].items())
    )


def _report_monitor(m: dict[str, Any]) -> None:
    print(f"\n== Redis MONITOR: {m['per_run']} commands, {m['bytes_per_run']} bytes a run ==")
    for name, count, size in m["by_command_per_run"]:
        print(f"  {count:6.2f}  {size:7d} B  {name}")


def _report_spy(who: str, spy: dict[str, Any]) -> None:
    print(f"\n== py-spy, {who}: {spy['samples']} samples ==")
    for title in ("by_process", "by_package", "self", "total"):
        print(f"-- {title} (% of samples)")
        for name, pct in spy[title]:
            print(f"  {pct:5.1f}  {name}")
    for area, rows in spy["callers"].items():
        print(f"-- {area}: its agent-jobs callers")
        for name, pct in rows:
            print(f"  {pct:5.1f}  {name}")
        print(f"-- {area}: where its time goes (innermost frame)")
        for name, pct in spy["inside"][area]:
            print(f"  {pct:5.1f}  {name}")


_began = time.monotonic()


def _note(window: str) -> None:
    print(f"[{time.monotonic() - _began:6.1f} s] {window}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--pg-log", type=Path, default=Path("/var/log/postgresql/postgresql-15-main.log")
    )
    parser.add_argument("--pool", default="prefork")
    parser.add_argument(
        "--out", type=Path, help="where to keep the raw stacks (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--monitor-runs", type=int, default=20)
    parser.add_argument("--native", action="store_true", help="py-spy's native frames too")
    parser.add_argument(
        "--db-pool-size",
        default="",
        help="AGENT_JOBS_DB_POOL_SIZE of the worker (default: unset, as shipped; "
        "bench.durable runs 1, as the tests do)",
    )
    parser.add_argument(
        "--windows",
        default="figures,py-spy,py-spy-alone,perf,strace,monitor,statements",
        help="which windows to run (comma-separated; default: all)",
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="profile-"))
    out.mkdir(parents=True, exist_ok=True)
    windows = set(args.windows.split(","))
    global NATIVE
    NATIVE = args.native

    server = RedisServer().start()
    atexit.register(server.close)
    redis_url = server.url(0).rsplit("/", 1)[0]
    redis_pid = server.proc.pid if server.proc is not None else None
    url = fresh_database(args.pg, DATABASE)
    broker = f"{redis_url}/9"
    broker_client = redis.Redis.from_url(broker)
    os.environ["AGENT_JOBS_DATABASE_URL"] = url
    store = Store.from_url(url)
    settings = Settings(broker_url=broker, database_url=url)
    celery = celery_client(broker)
    client = Client(store, app, settings, CeleryDispatcher(celery))
    env = service_env(
        broker, url, AGENT_JOBS_APP="bench.apps:app", AGENT_JOBS_DB_POOL_SIZE=args.db_pool_size
    )
    env["PYTHONPATH"] = str(ROOT)
    found: dict[str, Any] = {"out": str(out)}
    worker = start_worker(env, concurrency=2, name="profile", pool=args.pool)
    try:
        run_all(client, "w1", 10, 60)  # warm up: forks, connections, imports
        _note("figures")
        found["figures"] = figures(client, worker, broker_client, redis_pid, args.runs)
        if "py-spy" in windows:
            _note("py-spy")
            paths = spied(client, worker, args.runs, out)
            main_pid = worker.proc.pid if worker.proc is not None else None
            found["spy"] = {
                who: analyse(path, main_pid if who == "worker" else None)
                for who, path in paths.items()
                if path.exists()
            }
        if "py-spy-alone" in windows:
            _note("py-spy, one run at a time")
            paths = spied(client, worker, min(args.runs, 150), out, alone=True)
            main_pid = worker.proc.pid if worker.proc is not None else None
            found["spy_alone"] = {
                who: analyse(path, main_pid if who == "worker" else None)
                for who, path in paths.items()
                if path.exists()
            }
        if "perf" in windows:
            _note("perf")
            found["perf"] = perfed(client, worker, redis_pid, min(args.runs, 200), out)
        if "strace" in windows:
            _note("strace")
            found["strace"] = straced(client, worker, min(args.runs, 50), out)
        if "monitor" in windows:
            _note("monitor")
            found["monitor"] = monitored(broker, client, args.monitor_runs)
    finally:
        worker.stop()
    if "statements" in windows:
        _note("statements")
        found["statements"] = statements(url, args.pg_log, client, env, min(args.runs, 100), out)
    found["kept"] = kept_bytes(store)
    (out / "profile.json").write_text(json.dumps(found, indent=1))
    celery.close()
    store.engine.dispose()
    if args.json:
        print(json.dumps(found, indent=1))
    else:
        report(found)
        print(f"\nraw stacks and the figures as JSON: {out}")


if __name__ == "__main__":
    main()
