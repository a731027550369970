"""Record the journal fixtures of `tests/unit/journals/` from real durable runs.

The journals stand for runs in flight, recorded by the code of their day: a change to a
turn's shape must leave them replaying, so add the new shape's journals beside them
rather than re-recording the old ones. Record the scenarios that have no fixture yet
(or those named) with:

    .venv/bin/python -m tests.unit.record_journals [NAME ...]

It needs what the full suite needs: the Postgres at `AGENT_JOBS_TEST_POSTGRES_URL`
(default `postgresql+psycopg://postgres@127.0.0.1:5432/test`; a database of its own is
created and dropped) and `redis-server` on the path (a server of its own is started).
Two real Celery workers run the apps of `tests/apps.py` on the durable runner: one as
today's code, one with `AGENT_JOBS_DISABLED_PATCHES=agent:parallel-tools` (code that
predates the parallel-tools patch), each on a queue of its own (and one per other patch a
scenario disables). Each scenario's
approvals and answers are given as a person would, through the `Client`.

Each fixture is the run row's fields that `turn_for` and `DurableHooks` read, the
run's outcome, and its journal rows as `journal.load_for_replay` returns them (step,
seq, state, result, error): intents and timestamps are left out, a replay needs
neither. The unit tests replay them offline (`tests/unit/test_replay.py`).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.settings import Settings
from agent_jobs.store import RunView, Store
from agent_jobs.store import journal as journal_rows
from tests.support import apps
from tests.support.redis_server import RedisServer
from tests.support.services import own_database
from tests.support.waiting import TIMEOUT, eventually
from tests.support.workers import Process, service_env, start_worker

JOURNALS = Path(__file__).resolve().parent / "journals"
PARALLEL_TOOLS = "agent:parallel-tools"
APPROVALS_AT_ONCE = "agent:approvals-at-once"

# The run row's fields a replay reads (`turn_for`, `DurableHooks`), and its outcome.
RUN_FIELDS = (
    "run_id",
    "agent",
    "actor",
    "persona",
    "thread_id",
    "input",
    "depth",
    "day",
    "runner",
    "root_run_id",
    "parent_run_id",
    "status",
    "output",
    "error",
)


@dataclass(frozen=True)
class Scenario:
    """One fixture: an agent, a request, and how a person answers what the run asks."""

    name: str
    agent: str
    text: str
    disabled_patches: str
    about: str
    respond: Callable[[Client, str], None]


def _until(what: str, check: Callable[[], bool]) -> None:
    eventually(check, what=what, every=0.05)


def approve_all(client: Client, run_id: str) -> None:
    """Approve every call waiting for a decision (a child's too), as alice, until the
    run ends."""

    def settled() -> bool:
        for call in client.store.pending_calls():
            client.approve(call["run_id"], call["call_id"], actor="alice")
        return client.store.get_run(run_id).finished

    _until(f"{run_id} to finish", settled)


def answer_questions(client: Client, run_id: str) -> None:
    """Answer the run's question with Friday, as bob, once it is asked."""
    _until(f"{run_id} to ask", lambda: bool(client.store.open_questions(run_id)))
    for asked in client.store.open_questions(run_id):
        client.answer(run_id, asked["request_id"], {"q1": "Friday"}, actor="bob")


SCENARIOS = (
    Scenario(
        "support",
        "support",
        "Where is order 42?",
        "",
        "two reads on the parallel shape, then a refund approved by alice",
        approve_all,
    ),
    Scenario(
        "support_sequential",
        "support",
        "Where is order 42?",
        PARALLEL_TOOLS,
        "the support scenario recorded by code that predates the parallel-tools patch",
        approve_all,
    ),
    Scenario(
        "planner",
        "planner",
        "set up a call",
        "",
        "a read that asks a question, answered by bob, then run again",
        answer_questions,
    ),
    Scenario(
        "two_refunds",
        "two_refunds",
        "refund both",
        "",
        "two refunds and a read in one turn: both asked for at once, approved by alice, run "
        "in call order",
        approve_all,
    ),
    Scenario(
        "two_refunds_one_by_one",
        "two_refunds",
        "refund both",
        APPROVALS_AT_ONCE,
        "the two_refunds scenario recorded by code that predates the approvals-at-once patch",
        approve_all,
    ),
    Scenario(
        "boss",
        "boss",
        "sort out order 42",
        "",
        "the parent of a delegation chain (boss -> manager -> clerk, the clerk's refund "
        "approved by alice)",
        approve_all,
    ),
)


def fixture_of(store: Store, scenario: Scenario, run: RunView) -> dict[str, Any]:
    with store.connect() as conn:
        rows = journal_rows.load_for_replay(conn, run.run_id)
    view = run.model_dump(mode="json")
    return {
        "scenario": scenario.about,
        "recorded_with": {
            "runner": "durable (a Celery worker on Postgres)",
            "disabled_patches": scenario.disabled_patches,
            "command": ".venv/bin/python -m tests.unit.record_journals",
        },
        "run": {field: view[field] for field in RUN_FIELDS},
        "journal": [
            {
                "step": row.step,
                "seq": row.seq,
                "state": row.state,
                "result": row.result,
                "error": row.error,
            }
            for row in rows
        ],
    }


def record(
    url: str, broker: str, scenarios: tuple[Scenario, ...] = SCENARIOS
) -> dict[str, dict[str, Any]]:
    os.environ["AGENT_JOBS_DATABASE_URL"] = url  # the side table of tests/apps.py
    store = Store.from_url(url)
    workers: dict[str, tuple[Process, Client]] = {}
    recorded: dict[str, dict[str, Any]] = {}
    try:
        for disabled in sorted({s.disabled_patches for s in scenarios}):
            queue = f"agent_jobs_fixtures_{uuid.uuid4().hex[:8]}"
            env = service_env(
                broker, url, AGENT_JOBS_QUEUE=queue, AGENT_JOBS_DISABLED_PATCHES=disabled
            )
            proc = start_worker(env, concurrency=2, name=f"fixtures{disabled or '-today'}")
            settings = Settings(broker_url=broker, database_url=url, queue=queue)
            dispatcher = CeleryDispatcher(celery_client(broker, queue))
            client = Client(store, apps.app, settings, dispatcher)
            workers[disabled] = (proc, client)
        for scenario in scenarios:
            _, client = workers[scenario.disabled_patches]
            run_id = client.enqueue_run(
                scenario.agent,
                scenario.text,
                actor="user-7",
                run_id=f"fixture-{scenario.name}",
                thread_id=f"fixture-{scenario.name}",
            )
            scenario.respond(client, run_id)
            run = client.wait(run_id, timeout=TIMEOUT)
            if run.status != "completed":
                raise RuntimeError(f"{scenario.name}: the run ended {run.status}: {run.error}")
            recorded[scenario.name] = fixture_of(store, scenario, run)
            rows = len(recorded[scenario.name]["journal"])
            print(f"{scenario.name}: {rows} rows, {run.output!r}")
    except BaseException:
        for proc, _ in workers.values():
            sys.stderr.write(proc.log()[-4000:])
        raise
    finally:
        for proc, client in workers.values():
            proc.stop()
            if client.dispatcher is not None:
                client.dispatcher.celery.close()
        store.engine.dispose()
    return recorded


def main() -> None:
    """Record the scenarios named on the command line; with none, those that have no
    fixture yet (a fixture of the past is never recorded again by accident)."""
    names = set(sys.argv[1:])
    scenarios = tuple(
        s
        for s in SCENARIOS
        if s.name in names or (not names and not (JOURNALS / f"{s.name}.json").exists())
    )
    if not scenarios:
        print("every scenario has its fixture; name the ones to record again")
        return
    server = RedisServer().start()
    try:
        with own_database("agent_jobs_fixtures") as url:
            recorded = record(url, server.url(0), scenarios)
    finally:
        server.close()
    JOURNALS.mkdir(exist_ok=True)
    for name, fixture in recorded.items():
        path = JOURNALS / f"{name}.json"
        path.write_text(json.dumps(fixture, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
