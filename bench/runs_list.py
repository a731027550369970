"""Benchmark of the runs list at scale: 1,000,000 runs, each filter's pages and plans.

    .venv/bin/python -m bench.runs_list [--runs 1000000] [--calls 200] [--deep 20]
        [--reuse] [--plans] [--no-http] [--json]

Builds a Postgres database of its own, `agent_jobs_runs_bench` (re-made on each run; a
database of that name the bench did not make is left alone, and the bench stops), at
migration 0007, fills it in bulk (server-side `INSERT … SELECT` over `generate_series`,
100,000 runs a statement): `--runs` runs over 30 days from 2,000 actors (a few busy, most
not) on 400,000 threads, five agents; 3% failed (with an error, a quarter of them dead
letters), 1% awaiting approval, 0.5% cancelled, the newest 0.5% running, queued or
paused, 5% delegated children; inputs of a dozen kinds, metadata of four keys; an
action call in a tenth of the runs (one of three tools; a fourth, rare, in one run of
2,000) and a read in a quarter; a
journal of 15 steps for 1,000 runs. Then it migrates to the newest revision with the
project's own migration (0008 builds the runs list's indexes: timed), and `VACUUM
ANALYZE`s. `--reuse` measures a database an earlier run filled.

Measured, through `Store.runs_page` (what `GET /v1/runs` calls), for each filter: the
first page (`limit` 50) `--calls` times, and the page `--deep` pages in (its cursor
followed once, then asked for `--calls` times): p50, p95 and the longest, in ms; and
each one's plan (`EXPLAIN (ANALYZE, BUFFERS)`): the indexes it scans, whether any table
is read whole, its buffers and time. `--plans` prints the plans whole. Reported too:
the fill's time, the migration's, and the size of the table and of each index.

Then through the HTTP API (`agent-jobs serve` on the same database, a process of its own
with a Redis of its own; unless `--no-http`): `GET /v1/runs` with filters as an operator,
as a reader with no roles and as one who approves `issue_credit`, `GET /v1/runs/{run_id}`
and `GET /v1/runs/{run_id}/steps` of a journaled run, `--calls` times each, one after
another on a keep-alive connection: p50, p95 and the longest, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs import AgentApp, ScriptedModel  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from agent_jobs.store.db import make_engine, upgrade  # noqa: E402
from agent_jobs.store.listing import Reader, RunFilter, list_runs_query  # noqa: E402
from bench.durable import libpq, percentile  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.workers import Process, service_env  # noqa: E402

NAME = "agent_jobs_runs_bench"
MARK = "agent-jobs bench.runs_list: dropped and made again by it"
CHUNK = 100_000
THREADS = 400_000
ACTORS = 2_000
AGENTS = ("support", "billing", "triage", "research", "ops")
ACTION_TOOLS = ("refund", "cancel_subscription", "issue_credit")
RARE_TOOL = "close_account"  # in one run of 2,000
NONE: frozenset[str] = frozenset()
ROLES = "BENCH_RUNS_LIST_ROLES"
JOURNALED = 1_000
STEPS = 15

# --- the app `agent-jobs serve` loads (AGENT_JOBS_APP=bench.runs_list:app) -----------------
# Its roles are the bench's: an operator, and the readers the cases pick from the data
# (BENCH_RUNS_LIST_ROLES, a JSON object of actor to roles).
app = AgentApp(name="runs-list-bench", roles=json.loads(os.environ.get(ROLES, "{}")))


def _action(name: str, approvers: list[str]) -> None:
    def act(order_id: int) -> dict[str, int]:
        return {"order_id": order_id}

    act.__name__ = name
    act.__doc__ = f"The bench's {name}."
    app.tool(kind="action", approvers=approvers)(act)


for _tool in ACTION_TOOLS:
    _action(_tool, ["credit"] if _tool == "issue_credit" else ["lead"])
_action(RARE_TOOL, ["closer"])
for _agent in AGENTS:
    app.agent(_agent, model=ScriptedModel([{"text": "done"}]), tools=[])

# --- the database ----------------------------------------------------------------------


def own_database(admin_url: str, reuse: bool) -> str:
    """The bench's database: made afresh (or, `reuse`, as an earlier run left it). A
    database of its name that it did not make is refused, never dropped."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            found = conn.execute(
                text(
                    "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                    "WHERE datname = :name"
                ),
                {"name": NAME},
            ).first()
            if found is not None and found[0] != MARK:
                sys.exit(f"error: a database {NAME!r} exists that this bench did not make")
            if found is None or not reuse:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{NAME}"'))
                conn.execute(text(f"COMMENT ON DATABASE \"{NAME}\" IS '{MARK}'"))
    finally:
        admin.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{NAME}"


def migrate(url: str, revision: str) -> float:
    """Seconds to migrate the database to `revision` with the project's migrations."""
    engine = make_engine(url)
    try:
        started = time.perf_counter()
        upgrade(engine, revision)
        return time.perf_counter() - started
    finally:
        engine.dispose()


# Each run's values are functions of its number `g` (so a child can name its parent's);
# `o` is the run whose actor and thread it shares (a child's: its parent's, `g - 1`).
_NUMBERED = """
SELECT g, o, h1, h2, h3, t,
    CASE
        WHEN g > %(n)s::int * 0.995 AND h2 %% 10000 < 3000 THEN 'running'
        WHEN g > %(n)s::int * 0.995 AND h2 %% 10000 < 4500 THEN 'queued'
        WHEN g > %(n)s::int * 0.995 AND h2 %% 10000 < 5000 THEN 'paused'
        WHEN h2 %% 10000 < 300 THEN 'failed'
        WHEN h2 %% 10000 < 400 THEN 'awaiting_approval'
        WHEN h2 %% 10000 < 450 THEN 'cancelled'
        ELSE 'completed'
    END AS status
FROM (
    SELECT g, CASE WHEN g %% 20 = 0 THEN g - 1 ELSE g END AS o,
        abs(hashint4(g)) AS h1, abs(hashint4(g + 7777777)) AS h2,
        abs(hashint4(g + 15555555)) AS h3,
        timestamptz '2026-11-01 00:00:00+00' + interval '30 days' * (g::float8 / %(n)s::int)
            + interval '1 second' * (abs(hashint4(g + 3)) %% 7) AS t
    FROM generate_series(%(lo)s::int, %(hi)s::int) AS g
) AS numbered
"""

_INPUTS = """(ARRAY[
    'Where is my order #' || (10000 + h3 % 90000) || '? It has not arrived yet.',
    'Please refund invoice INV-' || (h3 % 500000) || ', I was charged twice.',
    'Cancel my subscription on the ' || (ARRAY['basic','team','business'])[1 + h1 % 3]
        || ' plan from next month.',
    'Summarise the support thread about the ' || (ARRAY['login','export','billing',
        'webhook','mobile app'])[1 + h3 % 5] || ' problem for the weekly report.',
    'Why was I charged ' || (5 + h3 % 400) || ' EUR on my last invoice?',
    'Research the competitors of ' || (ARRAY['Acme','Globex','Initech','Umbrella',
        'Hooli'])[1 + h3 % 5] || ' and list their prices.',
    'Triage this bug report: the dashboard shows a blank page after login (ticket '
        || (h3 % 200000) || ').',
    'Draft a reply to a customer asking for a duplicate charge to be reversed.',
    'Check the status of shipment ' || upper(substr(md5(g::text), 1, 10)) || '.',
    'Issue a credit of ' || (1 + h3 % 50) || ' EUR for the outage on '
        || to_char(t, 'YYYY-MM-DD') || '.',
    'Reset the password of account ' || (h3 % 1000000) || ' and tell the user.',
    'Classify these feedback notes by topic and sentiment.'
])[1 + (h2 / 10000) % 12]"""

_FAILURES = """CASE h3 % 4
    WHEN 0 THEN 'step tool:call_2 was given up on: delivered 5 times, it never finished'
    WHEN 1 THEN 'model request failed: 529 overloaded (after 6 attempts)'
    WHEN 2 THEN 'tool refund failed: upstream timed out after 30 s'
    ELSE 'the run took more than 24 steps'
END"""

_FAILURE_TYPES = """(ARRAY['StepFailedError', 'ModelError', 'ToolError',
    'MaxStepsExceededError'])[1 + h3 % 4]"""

FILL_RUNS = f"""
INSERT INTO runs (id, thread_id, agent, actor, input, status, output, error, error_type,
    metadata, runner, parent_run_id, root_run_id, depth, day, waiting_on, created_at,
    updated_at, finished_at)
SELECT md5('run' || g), 't' || (abs(hashint4(o)) %% {THREADS}),
    (ARRAY{list(AGENTS)!r})[1 + h1 %% {len(AGENTS)}],
    'user-' || floor({ACTORS} * power(abs(hashint4(o + 3)) / 2147483648.0, 2))::int,
    {_INPUTS.replace("%", "%%")},
    status,
    CASE WHEN status = 'completed' THEN 'Done: ' || left(md5(g::text), 20) END,
    CASE WHEN status = 'failed' THEN {_FAILURES.replace("%", "%%")} END,
    CASE WHEN status = 'failed' THEN {_FAILURE_TYPES.replace("%", "%%")}
         WHEN status = 'cancelled' THEN 'Cancelled' END,
    jsonb_build_object('ticket', 'ZX-' || (h3 %% 200000),
        'channel', (ARRAY['email', 'chat', 'phone', 'api'])[1 + h1 %% 4],
        'priority', (ARRAY['low', 'normal', 'high'])[1 + h2 %% 3],
        'region', (ARRAY['eu-west', 'us-east', 'ap-south'])[1 + h3 %% 3]),
    'durable',
    CASE WHEN g <> o THEN md5('run' || o) END, md5('run' || o),
    CASE WHEN g <> o THEN 1 ELSE 0 END,
    to_char(t, 'YYYY-MM-DD'),
    CASE WHEN status = 'awaiting_approval' THEN 'tool:call_1' END,
    t, t + interval '40 seconds',
    CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN t + interval '40 seconds' END
FROM ({_NUMBERED}) AS numbered
"""

FILL_CALLS = f"""
INSERT INTO tool_calls (run_id, call_id, thread_id, name, kind, args, status, decision,
    decided_by, decided_at, created_at, updated_at)
SELECT md5('run' || g), 'call_' || k, 't' || (abs(hashint4(o)) %% {THREADS}),
    CASE WHEN k = 2 THEN 'lookup_order'
         WHEN g %% 2000 = 3 THEN '{RARE_TOOL}'
         ELSE (ARRAY{list(ACTION_TOOLS)!r})[1 + h3 %% {len(ACTION_TOOLS)}] END,
    CASE WHEN k = 1 THEN 'action' ELSE 'read' END,
    jsonb_build_object('order_id', h3 %% 90000),
    CASE WHEN k = 1 AND status = 'awaiting_approval' THEN 'pending_approval'
         WHEN k = 1 THEN 'executed' ELSE 'auto_executed' END,
    CASE WHEN k = 1 AND status <> 'awaiting_approval' THEN 'approve' END,
    CASE WHEN k = 1 AND status <> 'awaiting_approval' THEN 'lead-' || (h1 %% 20) END,
    CASE WHEN k = 1 AND status <> 'awaiting_approval' THEN t + interval '20 seconds' END,
    t + interval '10 seconds', t + interval '20 seconds'
FROM ({_NUMBERED}) AS numbered
CROSS JOIN LATERAL (VALUES (1), (2)) AS calls (k)
WHERE (k = 1 AND (g %% 10 = 3 OR status = 'awaiting_approval')) OR (k = 2 AND g %% 4 = 0)
"""

FILL_JOURNAL = f"""
INSERT INTO journal (run_id, step, seq, state, intent, result, attempts, created_at,
    started_at, finished_at, worker)
SELECT md5('run' || g),
    CASE WHEN s %% 2 = 1 THEN 'model:' || (s / 2 + 1) ELSE 'tool:call_' || (s / 2) END,
    s, 'done',
    CASE WHEN s %% 2 = 1 THEN jsonb_build_object('model', 'claude', 'messages', s)
         ELSE jsonb_build_object('tool', 'lookup_order', 'args',
              jsonb_build_object('order_id', s)) END,
    jsonb_build_object('text', 'step ' || s || ' of run ' || g),
    1, t + interval '2 seconds' * s, t + interval '2 seconds' * s,
    t + interval '2 seconds' * s + interval '1 millisecond' * (50 + abs(hashint4(g + s)) %% 1500),
    'celery@worker-' || (s %% 3) || ':' || (1000 + s)
FROM ({_NUMBERED}) AS numbered CROSS JOIN generate_series(1, {STEPS}) AS s
WHERE g %% (%(n)s::int / {JOURNALED}) = 1
"""


def fill(url: str, n: int, statements: dict[str, str]) -> dict[str, float]:
    """Fill the tables of `statements` (each run over the runs' numbers, a chunk at a
    time); seconds each took."""
    took: dict[str, float] = {}
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        for name, statement in statements.items():
            started = time.perf_counter()
            for lo in range(1, n + 1, CHUNK):
                hi = min(n, lo + CHUNK - 1)
                conn.execute(statement, {"lo": lo, "hi": hi, "n": n})  # type: ignore[arg-type]
                print(f"  {name}: {hi:,} runs' worth", end="\r", file=sys.stderr, flush=True)
            took[name] = time.perf_counter() - started
            print(f"  {name}: {took[name]:.1f} s" + " " * 20, file=sys.stderr)
    return took


def fill_threads(url: str) -> float:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(
            "INSERT INTO threads (id, created_at, updated_at) SELECT 't' || g, "
            "timestamptz '2026-11-01 00:00:00+00', timestamptz '2026-11-01 00:00:00+00' "
            "FROM generate_series(0, %(k)s - 1) AS g",
            {"k": THREADS},
        )
        return time.perf_counter() - started


def vacuum(url: str) -> float:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute("VACUUM (ANALYZE) runs")
        conn.execute("VACUUM (ANALYZE) tool_calls")
        conn.execute("VACUUM (ANALYZE) journal")
        return time.perf_counter() - started


def sizes(url: str) -> dict[str, int]:
    """Bytes of the runs table, of tool_calls, and of each of their indexes."""
    with psycopg.connect(libpq(url)) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i') "
            "AND (c.relname IN ('runs', 'tool_calls') OR c.oid IN (SELECT indexrelid "
            "FROM pg_index WHERE indrelid IN ('runs'::regclass, 'tool_calls'::regclass))) "
            "ORDER BY 2 DESC"
        ).fetchall()
    return {name: size for name, size in rows}


# --- the cases -------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    where: RunFilter
    reader: Reader | None = None


def examples(url: str, n: int) -> dict[str, str]:
    """Values the cases ask for, taken from the data: a busy agent, an actor of middling
    activity, a thread with a few runs, a run in the middle, a rare ticket."""
    with psycopg.connect(libpq(url)) as conn:

        def one(query: str) -> str:
            found = conn.execute(query, {"middle": n // 2 + 1}).fetchone()  # type: ignore[arg-type]
            assert found is not None, query
            return str(found[0])

        return {
            "actor": one(
                "SELECT actor FROM (SELECT actor, row_number() OVER (ORDER BY count(*) DESC)"
                " AS rank, count(*) OVER () AS actors FROM runs GROUP BY actor) AS ranked "
                "WHERE rank = actors / 2"
            ),
            "quiet": one("SELECT actor FROM runs GROUP BY actor ORDER BY count(*), actor LIMIT 1"),
            "thread": one("SELECT thread_id FROM runs WHERE id = md5('run' || %(middle)s::int)"),
            "run": one("SELECT id FROM runs WHERE id = md5('run' || %(middle)s::int)"),
            "ticket": one(
                "SELECT metadata->>'ticket' FROM runs WHERE id = md5('run' || %(middle)s::int)"
            ),
            "journaled": one("SELECT run_id FROM journal ORDER BY run_id LIMIT 1"),
        }


def cases(found: dict[str, str]) -> list[Case]:
    day = datetime(2026, 11, 15, tzinfo=UTC)
    return [
        Case("no filter", RunFilter()),
        Case("status=failed", RunFilter(statuses=("failed",))),
        Case("status=running&status=queued", RunFilter(statuses=("running", "queued"))),
        Case("status=awaiting_approval", RunFilter(statuses=("awaiting_approval",))),
        Case("agent=billing", RunFilter(agent="billing")),
        Case(f"actor={found['actor']}", RunFilter(actor=found["actor"])),
        Case("thread_id=(a thread)", RunFilter(thread_id=found["thread"])),
        Case("q=invoice (a common word)", RunFilter(q="invoice")),
        Case("q=duplicate charge (rarer)", RunFilter(q="duplicate charge")),
        # The ticket as its metadata's JSON text ends it: that ticket's runs, no longer one's.
        Case(f'q={found["ticket"]}" (a ticket, ~5 runs)', RunFilter(q=found["ticket"] + '"')),
        Case("q=(a run id)", RunFilter(q=found["run"])),
        Case("since/until one day", RunFilter(since=day, until=day + timedelta(days=1))),
        Case("agent=billing&status=failed", RunFilter(agent="billing", statuses=("failed",))),
        Case(
            "status=failed&q=timed out&since 7 days",
            RunFilter(statuses=("failed",), q="timed out", since=day + timedelta(days=9)),
        ),
        Case(f"reader {found['quiet']}, no roles", RunFilter(), Reader(found["quiet"], NONE)),
        Case(
            f"reader {found['actor']}, approves issue_credit",
            RunFilter(),
            Reader(found["actor"], frozenset({"issue_credit"})),
        ),
        Case(
            f"reader {found['quiet']}, approves {RARE_TOOL} (rare)",
            RunFilter(),
            Reader(found["quiet"], frozenset({RARE_TOOL})),
        ),
        Case(
            "reader approves issue_credit, status=failed",
            RunFilter(statuses=("failed",)),
            Reader(found["quiet"], frozenset({"issue_credit"})),
        ),
    ]


# --- measuring -------------------------------------------------------------------------


def timings(call: Callable[[], Any], n: int) -> dict[str, float]:
    for _ in range(3):  # warm: the connection pool, the statement's compilation
        call()
    taken = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        taken.append((time.perf_counter() - started) * 1000)
    return {
        "p50": percentile(taken, 50),
        "p95": percentile(taken, 95),
        "max": max(taken),
    }


def deep_cursor(store: Store, case: Case, pages: int) -> tuple[str | None, int]:
    """The cursor of the page `pages` pages in (or of the last page there is), and its
    number."""
    cursor = None
    for number in range(1, pages):
        page = store.runs_page(case.where, reader=case.reader, cursor=cursor)
        if page.next_cursor is None:
            return cursor, number
        cursor = page.next_cursor
    return cursor, pages


_SCANS = re.compile(
    r"(Index Only Scan(?: Backward)? using \w+|Index Scan(?: Backward)? using \w+"
    r"|Bitmap Index Scan on \w+|Seq Scan on \w+)"
)


def plan(store: Store, case: Case, cursor: str | None) -> dict[str, Any]:
    """The case's plan as Postgres ran it: the scans, buffers, time and the whole text."""
    statement = list_runs_query(case.where, reader=case.reader, cursor=cursor)
    compiled = statement.compile(store.engine, compile_kwargs={"render_postcompile": True})
    with store.connect() as conn:  # with its parameters bound, as the list sends it
        explain = f"EXPLAIN (ANALYZE, BUFFERS) {compiled.string}"
        lines = list(conn.exec_driver_sql(explain, compiled.params).scalars())
    whole = "\n".join(lines)
    scans = sorted(set(_SCANS.findall(whole)))
    buffers = re.search(r"Buffers: (.*)", whole)
    took = re.search(r"Execution Time: ([\d.]+) ms", whole)
    return {
        "scans": scans,
        "seq_scan": any(s.startswith("Seq Scan") for s in scans),
        "buffers": buffers.group(1) if buffers else "",
        "ms": float(took.group(1)) if took else None,
        "text": whole,
    }


def measure(store: Store, case: Case, calls: int, deep: int) -> dict[str, Any]:
    first = timings(lambda: store.runs_page(case.where, reader=case.reader), calls)
    found = len(store.runs_page(case.where, reader=case.reader).runs)
    cursor, page = deep_cursor(store, case, deep)
    deeper = timings(lambda: store.runs_page(case.where, reader=case.reader, cursor=cursor), calls)
    return {
        "case": case.name,
        "first_page_runs": found,
        "first": first,
        "deep_page": page,
        "deep": deeper,
        "plan_first": plan(store, case, None),
        "plan_deep": plan(store, case, cursor),
    }


# --- through the HTTP API (`agent-jobs serve`, a process of its own) ---------------------

TOKENS = {"operator": "bench-operator", "quiet": "bench-quiet", "approver": "bench-approver"}


def http_cases(found: dict[str, str]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(name, token, path, query) of each request measured."""
    day = "2026-11-15T00:00:00Z"
    run = found["journaled"]
    return [
        ("operator: GET /v1/runs", "operator", "/v1/runs", {}),
        ("operator: status=failed", "operator", "/v1/runs", {"status": "failed"}),
        (
            "operator: status=running&status=queued",
            "operator",
            "/v1/runs",
            {"status": ["running", "queued"]},
        ),
        ("operator: agent=billing", "operator", "/v1/runs", {"agent": "billing"}),
        ("operator: actor=", "operator", "/v1/runs", {"actor": found["actor"]}),
        ("operator: q=invoice", "operator", "/v1/runs", {"q": "invoice"}),
        ("operator: q=(a run id)", "operator", "/v1/runs", {"q": found["run"]}),
        (
            "operator: since/until a day",
            "operator",
            "/v1/runs",
            {"since": day, "until": "2026-11-16T00:00:00Z"},
        ),
        ("a reader with no roles: GET /v1/runs", "quiet", "/v1/runs", {}),
        ("an approver of issue_credit: GET /v1/runs", "approver", "/v1/runs", {}),
        ("operator: GET /v1/runs/{id}", "operator", f"/v1/runs/{run}", {}),
        ("operator: GET /v1/runs/{id}/steps (15 steps)", "operator", f"/v1/runs/{run}/steps", {}),
    ]


def through_http(url: str, found: dict[str, str], calls: int) -> list[dict[str, Any]]:
    """Each request of `http_cases`, `calls` times one after another on a keep-alive
    connection to `agent-jobs serve` (durable, its own Redis): p50, p95, the longest."""
    redis_server = RedisServer().start()
    roles = {"bench-ops": ["operator"], found["quiet"]: [], found["actor"]: ["credit"]}
    actors = {"operator": "bench-ops", "quiet": found["quiet"], "approver": found["actor"]}
    env = service_env(
        redis_server.url(0),
        url,
        AGENT_JOBS_APP="bench.runs_list:app",
        AGENT_JOBS_API_TOKENS=json.dumps({TOKENS[k]: a for k, a in actors.items()}),
        AGENT_JOBS_DB_POOL_SIZE="4",
        **{ROLES: json.dumps(roles)},
    )
    port = free_port()
    serve = Process(
        [sys.executable, "-m", "agent_jobs.cli", "serve", "--port", str(port)], env, "serve"
    ).start(ready="Uvicorn running on")
    figures = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for name, who, path, query in http_cases(found):
                headers = {"Authorization": f"Bearer {TOKENS[who]}"}

                def get(path: str = path, query: Any = query, headers: Any = headers) -> Any:
                    answer = http.get(path, params=query, headers=headers)
                    answer.raise_for_status()
                    return answer.json()

                print(f"measuring {name} (HTTP)", file=sys.stderr)
                body = get()
                shown = len(body["runs"]) if "runs" in body else len(body.get("steps", [1]))
                figures.append({"case": name, "rows": shown, **timings(get, calls)})
    finally:
        serve.stop()
        redis_server.close()
    return figures


# --- the report ------------------------------------------------------------------------


def report(figures: dict[str, Any], whole_plans: bool) -> None:
    print(f"\nruns: {figures['runs']:,}")
    for name, seconds in figures.get("fill", {}).items():
        print(f"fill {name}: {seconds:.1f} s")
    if "migrate_0008" in figures:
        print(f"migration 0008 (the runs list's indexes): {figures['migrate_0008']:.1f} s")
        print(f"VACUUM ANALYZE: {figures['vacuum']:.1f} s")
    print("\nsizes (MB):")
    for name, size in figures["sizes"].items():
        print(f"  {name:28} {size / 2**20:8.1f}")
    print(
        f"\n{'case':52} {'rows':>4}  {'first p50/p95/max ms':>22}  "
        f"{'page':>4} {'deep p50/p95/max ms':>22}"
    )
    for row in figures["cases"]:
        first, deep = row["first"], row["deep"]
        print(
            f"{row['case'][:52]:52} {row['first_page_runs']:>4}  "
            f"{first['p50']:6.2f} {first['p95']:6.2f} {first['max']:7.2f}  "
            f"{row['deep_page']:>4} {deep['p50']:6.2f} {deep['p95']:6.2f} {deep['max']:7.2f}"
        )
    if figures.get("http"):
        print(f"\n{'through GET … (agent-jobs serve)':52} {'rows':>4}  {'p50/p95/max ms':>22}")
        for row in figures["http"]:
            print(
                f"{row['case'][:52]:52} {row['rows']:>4}  "
                f"{row['p50']:6.2f} {row['p95']:6.2f} {row['max']:7.2f}"
            )
    print("\nplans (first page | deep page): scans, buffers, server time")
    for row in figures["cases"]:
        print(f"- {row['case']}")
        for which in ("plan_first", "plan_deep"):
            found = row[which]
            seq = "  SEQ SCAN" if found["seq_scan"] else ""
            print(f"    {'; '.join(found['scans'])}{seq}")
            print(f"      buffers {found['buffers']}; {found['ms']} ms")
            if whole_plans:
                print("      " + found["text"].replace("\n", "\n      "))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--deep", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="measure an earlier run's data")
    parser.add_argument("--plans", action="store_true", help="print the plans whole")
    parser.add_argument("--no-http", action="store_true", help="measure the store alone")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.runs % JOURNALED:
        parser.error(f"--runs must be a multiple of {JOURNALED}")

    url = own_database(args.pg, args.reuse)
    figures: dict[str, Any] = {"runs": args.runs}
    store = Store.from_url(url, auto_upgrade=False) if args.reuse else None
    if store is None:
        print(f"filling {NAME} with {args.runs:,} runs", file=sys.stderr)
        migrate(url, "0007")  # the runs list's indexes come after: on a full table
        took = {"threads": fill_threads(url)}
        took |= fill(url, args.runs, {"runs": FILL_RUNS, "tool_calls": FILL_CALLS})
        figures["migrate_0008"] = migrate(url, "head")
        took |= fill(url, args.runs, {"journal": FILL_JOURNAL})  # journal.worker: 0008
        figures["fill"] = took
        figures["vacuum"] = vacuum(url)
        store = Store.from_url(url, auto_upgrade=False)
    figures["sizes"] = sizes(url)
    found = examples(url, args.runs)
    figures["cases"] = []
    for case in cases(found):
        print(f"measuring {case.name}", file=sys.stderr)
        figures["cases"].append(measure(store, case, args.calls, args.deep))
    store.engine.dispose()
    if not args.no_http:
        figures["http"] = through_http(url, found, args.calls)
    if args.json:
        for row in figures["cases"]:
            for which in ("plan_first", "plan_deep"):
                row[which].pop("text")
        print(json.dumps(figures, indent=2))
    else:
        report(figures, args.plans)


if __name__ == "__main__":
    main()
