"""Round trips to Postgres of one W1 run, driven in this process a step at a time.

    .venv/bin/python -m bench.round_trips [--pg URL]

The run's passes and its steps' reads of their rows, on a durable runner with no broker
(each step sent is run here as a delivered task would run it), after two runs that warm
the connection pool and the prepared statements: once with the fast path (a step a pass
schedules runs at once in the task, as the workers run them), once without (every step
delivered). It runs itself under `strace` (which
must be installed) and counts, on the sockets connected to Postgres, every send that a
receive follows: one round trip, however many statements a pipeline sent before it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

START, END = b"ROUND-TRIPS-START\n", b"ROUND-TRIPS-END\n"


def drive(url: str, redis_url: str, eager: str, runs: int = 3) -> int:
    """W1 runs, the last between the markers; returns how many step tasks it took."""
    from agent_jobs.leases import Leases
    from agent_jobs.runners.durable.runner import DurableRunner
    from agent_jobs.runs import RunRequest
    from agent_jobs.settings import Settings
    from agent_jobs.store import Store
    from agent_jobs.streams.base import MemoryStreams
    from bench.apps import app
    from bench.replay import Recorder

    store = Store.from_url(url)
    sent: list[tuple[str, str]] = []
    settings = Settings(database_url=url, eager_steps=eager == "eager")
    runner = DurableRunner(
        app, store, Recorder(sent), MemoryStreams(), settings, Leases.from_url(redis_url)
    )
    steps = 0
    for n in range(runs):
        run_id = f"round-trips-{os.getpid()}-{n}"
        runner.create(RunRequest(agent="w1", input="go", actor="bench"), run_id)
        last = n == runs - 1
        if last:
            os.write(2, START)
        if eager == "eager":
            runner.continue_run(run_id)  # as the start_run task does: it keeps its step
        else:
            runner.coordinate(run_id)
        while sent:
            task, step = sent.pop(0)
            runner.execute_step(run_id, step, task=task)
            steps += last
        if last:
            os.write(2, END)
        if store.get_run(run_id).status != "completed":
            raise SystemExit(f"run {run_id} did not complete")
    return steps


def count(trace: Path) -> tuple[int, int]:
    """(round trips, sends) between the markers, on the Postgres sockets.

    The child is one process: its threads share its descriptors, so a socket is known by
    its descriptor alone (strace -f names each thread by its own id), until it is closed.
    """
    sockets: set[int] = set()
    inside, last, trips, sends = False, "", 0, 0
    for line in trace.read_text(errors="replace").splitlines():
        pid, _, call = line.partition(" ")
        if not pid.isdigit():  # a trace of one process has no pid column
            call = line
        call = call.lstrip()  # strace pads the pid column
        if "ROUND-TRIPS-START" in call:
            inside = True
        elif "ROUND-TRIPS-END" in call:
            break
        elif m := re.match(
            r"connect\((\d+), \{sa_family=AF_INET6?, sin6?_port=htons\(5432\)", call
        ):
            sockets.add(int(m.group(1)))
        elif m := re.match(r"close\((\d+)\)", call):
            sockets.discard(int(m.group(1)))
        elif m := re.match(r"(sendto|write|recvfrom|read)\((\d+),", call):
            if int(m.group(2)) not in sockets or call.rstrip().endswith("EAGAIN)"):
                continue
            kind = "send" if m.group(1) in ("sendto", "write") else "receive"
            if inside and kind == "send":
                sends += 1
            if inside and kind == "receive" and last == "send":
                trips += 1
            last = kind
    return trips, sends


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(drive(*args.child))
        return
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("bench.round_trips needs strace (apt-get install strace)")
    from bench.durable import fresh_database
    from tests.support.redis_server import RedisServer

    url = fresh_database(args.pg, "agent_jobs_round_trips")
    server = RedisServer().start()
    try:
        for mode in ("eager", "delivered"):
            trips, sends, tasks = _traced(strace, url, server.url(0), mode)
            how = "the fast path" if mode == "eager" else "every step delivered"
            print(
                f"one W1 run, {how} ({tasks} step tasks): {trips} round trips to Postgres "
                f"({trips / 7:.1f} a step of its 7), {sends} sends"
            )
    finally:
        server.close()


def _traced(strace: str, url: str, redis_url: str, mode: str) -> tuple[int, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        child = [sys.executable, "-m", "bench.round_trips", "--child", url, redis_url, mode]
        calls = "trace=connect,close,sendto,recvfrom,read,write"
        done = subprocess.run(
            [strace, "-f", "-e", calls, "-o", str(trace), *child],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        tasks = int(done.stdout.strip().splitlines()[-1])
        return (*count(trace), tasks)


if __name__ == "__main__":
    main()
