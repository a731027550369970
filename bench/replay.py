"""What a coordinator pass costs as a run grows: its first steps against its last ones.

    .venv/bin/python -m bench.replay [--pg URL] [--steps 100]

A run of `--steps` model turns, each asking for one read, driven in this process by a
durable runner against Postgres, one step at a time (no broker, no worker: what is
measured is the pass). For each step: the wall and CPU time of the step and the pass
its completion wakes, the CPU time of that pass alone, and the journal rows the pass
read from the database. Printed: the median over steps 2 to 6 against the median over
the last five, with the run's loop kept in the process between passes (the default:
a pass goes on where the last one stopped), with it replayed by every pass, and with
the journal cache off too (every pass reads the whole journal).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs import AgentApp, ScriptedModel  # noqa: E402
from agent_jobs.leases import Leases  # noqa: E402
from agent_jobs.runners.durable.runner import DurableRunner  # noqa: E402
from agent_jobs.runs import RunRequest  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from agent_jobs.store import journal as journal_rows  # noqa: E402
from agent_jobs.streams.base import MemoryStreams  # noqa: E402
from bench.durable import fresh_database  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


def agent_app(steps: int) -> AgentApp:
    app = AgentApp(name="replay-bench")

    @app.tool(kind="read")
    def lookup(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "shipped"}

    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "lookup", "args": {"order_id": str(n)}}]} for n in range(steps)
    ]
    model = ScriptedModel([*script, {"text": "done"}])
    app.agent("long", model=model, tools=["lookup"], max_steps=steps + 1)
    return app


class Recorder:
    """The runner's dispatcher: the steps it sends are kept in `sent`, to run by hand."""

    def __init__(self, sent: list[tuple[str, str]]) -> None:
        self.sent = sent

    def steps(self, run_id: str, batch: Any, countdown: float | None = None) -> None:
        self.sent.extend(batch)

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        pass


def measure(
    url: str, redis_url: str, steps: int, cached: bool, sticky: bool = True
) -> dict[str, float]:
    store = Store.from_url(url)
    app = agent_app(steps)
    sent: list[tuple[str, str]] = []
    settings = Settings(database_url=url, eager_steps=False, sticky_loops=sticky)
    runner = DurableRunner(
        app, store, Recorder(sent), MemoryStreams(), settings, Leases.from_url(redis_url)
    )
    if not cached:
        runner.journal_cache.capacity = 0
    read: list[int] = []
    lock_and_load = journal_rows.lock_and_load

    def counted(*args: Any, **kwargs: Any) -> Any:
        locked = lock_and_load(*args, **kwargs)
        read.append(len(locked[1]))  # the journal's rows
        return locked

    journal_rows.lock_and_load = counted  # type: ignore[assignment]
    passes: list[tuple[float, float]] = []  # the pass after each step: wall, CPU
    drive = runner._drive

    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return drive(*args, **kwargs)
        finally:
            passes.append((time.perf_counter() - wall, time.process_time() - cpu))

    runner._drive = timed  # type: ignore[method-assign]
    run_id = f"replay-{steps}-{'cached' if cached else 'uncached'}-{sticky}"
    runner.create(RunRequest(agent="long", input="go", actor="bench"), run_id)
    runner.coordinate(run_id)
    walls: list[float] = []
    cpus: list[float] = []
    reads: list[int] = []
    pass_cpus: list[float] = []
    try:
        while sent:
            task, step = sent.pop(0)
            read.clear()
            passes.clear()
            wall, cpu = time.perf_counter(), time.process_time()
            runner.execute_step(run_id, step, task=task)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            reads.append(sum(read))
            pass_cpus.append(sum(cpu for _, cpu in passes))
    finally:
        journal_rows.lock_and_load = lock_and_load  # type: ignore[assignment]
        store.engine.dispose()
    assert store.get_run(run_id).status == "completed"
    # Steps alternate model and tool: every pass is one of the two kinds, so medians
    # over five consecutive passes compare like with like.
    early, late = slice(2, 7), slice(-5, None)
    return {
        "passes": len(walls),
        "early_ms": statistics.median(walls[early]) * 1000,
        "late_ms": statistics.median(walls[late]) * 1000,
        "early_cpu_ms": statistics.median(cpus[early]) * 1000,
        "late_cpu_ms": statistics.median(cpus[late]) * 1000,
        "early_rows": statistics.median(reads[early]),
        "late_rows": statistics.median(reads[late]),
        "early_pass_cpu_ms": statistics.median(pass_cpus[early]) * 1000,
        "late_pass_cpu_ms": statistics.median(pass_cpus[late]) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    url = fresh_database(args.pg, "agent_jobs_replay_bench")
    os.environ["AGENT_JOBS_DATABASE_URL"] = url
    server = RedisServer().start()
    try:
        for label, cached, sticky in (
            ("journal cache on, loops kept", True, True),
            ("journal cache on, loops replayed", True, False),
            ("journal cache off, loops replayed", False, False),
        ):
            f = measure(url, server.url(0), args.steps, cached, sticky)
            print(
                f"{label}: {args.steps} model turns ({f['passes']} passes); early in the "
                f"run a step and its pass {f['early_ms']:.1f} ms ({f['early_cpu_ms']:.1f} ms "
                f"CPU; the pass {f['early_pass_cpu_ms']:.1f} ms; {f['early_rows']:.0f} rows "
                f"read), late {f['late_ms']:.1f} ms ({f['late_cpu_ms']:.1f} ms CPU; the pass "
                f"{f['late_pass_cpu_ms']:.1f} ms; {f['late_rows']:.0f} rows read)"
            )
    finally:
        server.close()


if __name__ == "__main__":
    main()
