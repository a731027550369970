"""The suite's layers, as pytest markers a developer selects with `-m`.

    unit      nothing but this process: the loop, the journal replays, SQLite, local
              fake providers; seconds
    processes no services, but processes of this project: the CLI on the embedded
              default as a user runs it, a fresh interpreter's imports, compose's commands
    services  Postgres and Redis in this process (a Redis server of the session's own),
              no worker subprocess: the inline runner on Postgres, the store, the
              listener's parsing, the durable runner driven in-process (`durable-local`)
    workers   real Celery worker, beat, listener or `serve` subprocesses
    crash     SIGKILLs and outages: killed workers, a Redis stopped and started again
    browser   a real headless chromium

Each test gets exactly one. An explicit mark on the test wins; else its module's entry in
MODULES below; else the fixtures it uses say (a durable `harness` → workers, `pg_url` →
services, …); else it is a unit test. The layers are checked while the tests run: a test
that reaches past its layer (a unit test that starts a process, a processes test that
connects to Postgres, a services test that starts a worker) fails and says what it reached
for, so `-m unit` and `-m "unit or processes or services"` stay true to their names.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

LAYERS = ("unit", "processes", "services", "workers", "crash", "browser")
_RANK = {"unit": 0, "processes": 1, "services": 2, "workers": 3, "crash": 4, "browser": 4}

# Modules (or single tests, `path::name`) whose tests need more than their fixtures show:
# they start processes through the support code (Doors, Cluster, the CLI against a
# broker) or kill them.
MODULES: dict[str, str] = {
    # crash: SIGKILLs and outages
    "tests/durable/test_durable.py": "crash",
    "tests/durable/test_recovery.py": "crash",
    "tests/durable/test_partition.py": "crash",
    "tests/durable/test_broker_outage.py": "crash",
    "tests/durable/test_time_limits.py": "crash",
    "tests/durable/test_eager.py": "crash",
    "tests/durable/test_sleeping.py": "crash",
    "tests/humans/test_reconcile.py": "crash",
    "tests/mcp/test_mcp_crash.py": "crash",
    "tests/runs/test_abandoned.py": "crash",
    "tests/models/test_durable_e2e.py::"
    "test_a_worker_killed_after_the_model_step_leaves_its_arguments_streamed_once": "crash",
    "tests/schedules/test_crash.py": "crash",
    "tests/models/test_genai_spans.py::"
    "test_a_model_step_replayed_by_another_worker_keeps_its_one_span": "crash",
    # workers: real worker, beat, listener or serve subprocesses
    "tests/encryption/test_at_rest.py": "workers",
    "tests/encryption/test_doors_sealed.py": "workers",
    "tests/controls/test_controls.py": "workers",
    "tests/runs/test_large_payloads.py": "workers",
    "tests/controls/test_controls_doors.py": "workers",
    "tests/doors/test_cli_hardening.py": "workers",
    "tests/doors/test_doors_cli.py": "workers",
    "tests/doors/test_doors_e2e.py": "workers",
    "tests/doors/test_enqueue.py": "workers",
    "tests/doors/test_http_api.py": "workers",
    "tests/doors/test_http_history.py": "workers",
    "tests/doors/test_http_connections.py": "workers",
    "tests/doors/test_http_streams.py": "workers",
    "tests/doors/test_http_serve.py": "workers",
    "tests/doors/test_http_inline.py": "workers",
    "tests/durable/test_poison_messages.py": "workers",
    "tests/flow/test_concurrency.py": "workers",
    "tests/flow/test_if_busy_doors.py": "workers",
    "tests/flow/test_rate_limits.py": "workers",
    "tests/flow/test_rate_limits_recovery.py": "workers",
    "tests/humans/test_approval_deadlines.py": "workers",
    "tests/humans/test_listener.py": "workers",
    "tests/humans/test_listener_hardening.py": "workers",
    "tests/humans/test_reconcile_doors.py": "workers",
    "tests/mcp/test_mcp_durable.py": "workers",
    "tests/models/test_durable_e2e.py": "workers",
    "tests/models/test_genai_spans.py::"
    "test_a_durable_run_has_one_span_per_step_with_the_genai_attributes": "workers",
    "tests/operations/test_drain.py": "workers",
    "tests/operations/test_flower.py": "workers",
    "tests/operations/test_http_observability.py": "workers",
    "tests/operations/test_metrics.py": "workers",
    "tests/operations/test_notifications_runs.py": "workers",
    "tests/operations/test_prune_beat.py": "workers",
    "tests/operations/test_tracing.py": "workers",
    "tests/schedules/test_beat.py": "workers",
    "tests/schedules/test_embedded.py::test_serve_without_a_broker_ticks_the_schedules": "workers",
    "tests/docs/test_signing_examples.py": "services",
    # services: a database or Redis server of the module's own
    "tests/operations/test_notifications.py": "services",
    "tests/store/test_data_keys.py": "services",
    "tests/store/test_schema_layout.py": "services",
    "tests/flow/test_rate_limits_buckets.py": "services",
    "tests/operations/test_compose.py::"
    "test_a_database_password_with_url_characters_reaches_postgres_intact": "services",
    "tests/operations/test_notifications.py::"
    "test_a_worker_with_a_webhook_but_no_secret_stops_at_start": "workers",
    "tests/operations/test_notifications.py::"
    "test_no_process_that_sends_logs_the_webhooks_path_or_query": "workers",
    "tests/runs/test_tools.py::test_a_worker_loads_the_app_from_its_working_directory": "workers",
    # processes: the CLI on the embedded default, a fresh interpreter, compose's commands
    "tests/doors/test_cli.py": "processes",
    "tests/mcp/test_mcp_inline.py": "processes",
    "tests/flow/test_cli_if_busy.py": "processes",
    "tests/schedules/test_embedded.py": "processes",
    "tests/doors/test_cli_redraw.py::test_run_json_prints_the_finished_run_alone": "processes",
    "tests/doors/test_cli_redraw.py::"
    "test_run_on_a_terminal_erases_a_retried_model_steps_void_text": "processes",
    "tests/doors/test_cli_redraw.py::"
    "test_run_sets_a_retried_model_steps_void_text_apart": "processes",
    "tests/operations/test_compose.py::"
    "test_each_command_is_a_real_entry_point_of_this_project": "processes",
    "tests/operations/test_compose.py::"
    "test_each_long_running_service_has_a_health_check": "processes",
    "tests/operations/test_prune.py::test_the_command_says_so_when_redis_is_down": "processes",
    "tests/runs/test_face.py::test_only_loading_the_demo_imports_it": "processes",
    "tests/runs/test_face.py::test_the_app_module_does_not_import_the_demo": "processes",
    "tests/runs/test_tools.py::test_the_cli_loads_the_app_from_its_working_directory": "processes",
    # browser
    "tests/doors/test_console_page.py": "browser",
    "tests/doors/test_console_sealed.py": "browser",
    "tests/doors/test_inbox_page.py": "browser",
    "tests/operations/test_flower_page.py": "browser",
}

_SERVICE_FIXTURES = {"pg_url", "redis_url", "redis_server", "durable_broker"}
_WORKER_FIXTURES = {"shared_workers", "both_harnesses", "cluster", "worker_pool"}


def _inferred(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "browser_page" in names:
        return "browser"
    if names & _WORKER_FIXTURES:
        return "workers"
    if "harness" in names:
        kind = str(params.get("harness", "durable"))
        return "services" if kind in ("inline", "durable-local") else "workers"
    if names & _SERVICE_FIXTURES:
        return "services"
    if ("db_url" in names or "store" in names) and params.get("db_url") != "sqlite":
        return "services"
    return "unit"


def layer_of(item: pytest.Item) -> str:
    marked = {m.name for m in item.iter_markers() if m.name in LAYERS}
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked with two layers: {sorted(marked)}")
    if marked:
        return marked.pop()
    path = item.path.relative_to(item.config.rootpath).as_posix()
    floor = _inferred(item)
    name = f"{path}::{getattr(item, 'originalname', item.name)}"
    listed = MODULES.get(name, MODULES.get(path))
    if listed is None:
        return floor
    return listed if _RANK[listed] >= _RANK[floor] else floor


def assign(items: list[pytest.Item]) -> None:
    for item in items:
        layer = layer_of(item)
        item.stash[_LAYER] = layer
        if not any(m.name == layer for m in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, layer))


# --- the check, while the tests run ----------------------------------------------------

_LAYER = pytest.StashKey[str]()
_REACHED = pytest.StashKey[list[str]]()
_current: dict[str, pytest.Item | None] = {"item": None}
_started_by: dict[int, pytest.Item | None] = {}  # id(thread) -> the test that started it


def _owner() -> pytest.Item | None:
    """The test this thread works for: the main thread's is the running test; another's
    is the test that started it, if that test is still running (a thread a finished
    test left behind is not counted against the next one)."""
    item = _current["item"]
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return item
    return item if _started_by.get(id(thread)) is item else None


def _reach(needs: str, what: str) -> None:
    item = _owner()
    if item is None:
        return
    layer = item.stash.get(_LAYER, "unit")
    if _RANK[needs] > _RANK[layer] and not (layer == "browser" and needs != "browser"):
        item.stash.setdefault(_REACHED, []).append(f"{what} (needs the {needs} layer)")


_CELERY_SERVICES = ("worker", "beat", "flower", "events")
_OURS = ("agent_jobs", "agent-jobs", "celery", "tasks", "tests.")  # processes of the project
_OUR_SERVICES = ("listen", "serve")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen":
        argv = [str(a) for a in (args[1] or [])] if isinstance(args[1], list | tuple) else []
        line = " ".join(argv) or str(args[0])
        env = args[3] if len(args) > 3 and isinstance(args[3], dict) else {}
        if "--help" in argv:  # a service's command, asked how it is used: it serves nothing
            _reach("processes", f"started {line[:80]!r}")
        elif "redis-server" in line:
            _reach("services", f"started {line[:80]!r}")
        elif ("celery" in line and any(w in argv for w in _CELERY_SERVICES)) or (
            ("agent-jobs" in line or "agent_jobs.cli" in line)
            and any(w in argv for w in _OUR_SERVICES)
        ):
            _reach("workers", f"started {line[:80]!r}")
        elif "chromium" in line or "chrome" in line:
            _reach("browser", f"started {line[:80]!r}")
        elif env.get("AGENT_JOBS_BROKER_URL") or "postgresql" in str(
            env.get("AGENT_JOBS_DATABASE_URL", "")
        ):
            _reach("services", f"started {line[:80]!r} against Postgres or a broker")
        elif any(ours in line for ours in _OURS) and "ruff" not in argv:  # a tool is not one
            _reach("processes", f"started {line[:80]!r}")
    elif event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2 and address[1] in (5432, 6379):
            _reach("services", f"connected to {address[0]}:{address[1]}")


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    if "psycopg" in type(dbapi_connection).__module__:
        _reach("services", "connected to Postgres")


def install() -> None:
    """Watch subprocesses, sockets and database connections for the rest of the run."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    sys.addaudithook(_audit)
    event.listen(Pool, "connect", _on_connect)
    start = threading.Thread.start

    def tagged(self: threading.Thread) -> None:
        _started_by[id(self)] = _owner()
        start(self)

    threading.Thread.start = tagged  # type: ignore[method-assign]


def watch(item: pytest.Item) -> Iterator[None]:
    """Attribute what happens while `item` runs (its fixtures included) to it."""
    _current["item"] = item
    try:
        yield
    finally:
        _current["item"] = None


def verdict(item: pytest.Item) -> str | None:
    reached = item.stash.get(_REACHED, [])
    if not reached:
        return None
    layer = item.stash.get(_LAYER, "unit")
    return (
        f"this test is in the {layer} layer but reached past it: "
        + "; ".join(reached[:5])
        + " (mark it, or list its module in tests/support/layers.py MODULES)"
    )
