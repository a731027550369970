"""Tools: schemas from signatures and docstrings, async handlers, the app from the cwd."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from agent_jobs import AgentApp
from agent_jobs.errors import AppLoadError, ToolInputError
from agent_jobs.loading import load_app
from agent_jobs.tools import QuestionsAsked, Tool, ToolContext
from tests.support import encryption as test_encryption
from tests.support.apps import executed
from tests.support.harness import Harness
from tests.support.redis_server import RedisServer
from tests.support.waiting import TIMEOUT, eventually

BIN = Path(sys.executable).parent


def ctx_for(run_id: str = "r1", answers: dict[str, Any] | None = None) -> ToolContext:
    return ToolContext(
        run_id=run_id,
        step="tool:call_1",
        call_id="call_1",
        actor="user-7",
        idempotency_key=f"{run_id}:tool:call_1",
        answers=answers,
    )


def properties(tool: Tool) -> dict[str, Any]:
    return dict(tool.spec().input_schema["properties"])


# 3. Parameter descriptions -----------------------------------------------------------------


def test_annotated_field_descriptions_reach_the_schema() -> None:
    def lookup(
        order_id: Annotated[str, Field(description="The order's id, as printed on the receipt.")],
        limit: Annotated[int, Field(ge=1, description="How many lines at most.")] = 10,
        verbose: bool = False,
    ) -> dict[str, Any]:
        """Look up an order."""
        return {}

    tool = Tool(lookup, kind="read")
    props = properties(tool)
    assert props["order_id"]["description"] == "The order's id, as printed on the receipt."
    assert props["limit"]["description"] == "How many lines at most."
    assert props["limit"]["minimum"] == 1 and props["limit"]["default"] == 10
    assert "description" not in props["verbose"]
    assert tool.spec().input_schema["required"] == ["order_id"]
    assert tool.description == "Look up an order."
    # The metadata is kept for validation too, not only for the schema.
    with pytest.raises(ToolInputError, match="limit"):
        tool.validate({"order_id": "42", "limit": 0})


def test_google_args_describe_parameters_and_leave_the_description() -> None:
    def refund(order_id: str, amount: float, reason: str = "", ctx: Any = None) -> dict[str, Any]:
        """Refund an order, in part or in full.

        The money goes back to the card the order was paid with.

        Args:
            order_id: The order to refund.
            amount (float): How much to refund, in the order's currency;
                at most what was paid.
            reason: Why, in the customer's words.
            ctx: The run's context.

        Returns:
            The refund's reference.

        Raises:
            ValueError: The amount is more than was paid.
        """
        return {}

    tool = Tool(refund, kind="action")
    props = properties(tool)
    assert props["order_id"]["description"] == "The order to refund."
    assert props["amount"]["description"] == (
        "How much to refund, in the order's currency;\nat most what was paid."
    )
    assert props["reason"]["description"] == "Why, in the customer's words."
    assert set(props) == {"order_id", "amount", "reason"}  # ctx stays out of the schema
    assert tool.description == (
        "Refund an order, in part or in full.\n\n"
        "The money goes back to the card the order was paid with."
    )


def test_arguments_heading_is_read_like_args() -> None:
    def ship(order_id: str) -> str:
        """Ship an order.

        Arguments:
            order_id: Which order.
        """
        return ""

    tool = Tool(ship, kind="action")
    assert properties(tool)["order_id"]["description"] == "Which order."
    assert tool.description == "Ship an order."


def test_sphinx_params_describe_parameters() -> None:
    def track(order_id: str, carrier: str = "post") -> str:
        """Track an order's parcel.

        :param order_id: The order whose parcel to track.
        :param carrier: The carrier's short name,
            as on the label.
        :returns: where the parcel is.
        """
        return ""

    tool = Tool(track, kind="read")
    props = properties(tool)
    assert props["order_id"]["description"] == "The order whose parcel to track."
    assert props["carrier"]["description"] == "The carrier's short name,\nas on the label."
    assert tool.description == "Track an order's parcel."


def test_an_explicit_field_description_wins_over_the_docstring() -> None:
    def lookup(
        order_id: Annotated[str, Field(description="from Field")],
        region: str = Field(default="eu", description="from the default's Field"),
        page: Annotated[int, Field(ge=1)] = 1,
    ) -> str:
        """Look up an order.

        Args:
            order_id: from the docstring
            region: from the docstring too
            page: the page, from the docstring
        """
        return ""

    props = properties(Tool(lookup, kind="read"))
    assert props["order_id"]["description"] == "from Field"
    assert props["region"]["description"] == "from the default's Field"
    assert props["region"]["default"] == "eu"
    # A Field without a description leaves room for the docstring's, and keeps its rules.
    assert props["page"]["description"] == "the page, from the docstring"
    assert props["page"]["minimum"] == 1


class Address(BaseModel):
    street: str


def test_a_model_parameter_keeps_its_reference_and_gets_a_description() -> None:
    def deliver(to: Address) -> str:
        """Deliver.

        Args:
            to: Where to.
        """
        return ""

    props = properties(Tool(deliver, kind="action"))
    assert props["to"]["description"] == "Where to."
    assert props["to"]["$ref"] == "#/$defs/Address"


def test_a_plain_docstring_and_an_explicit_description_are_kept_as_written() -> None:
    def plain(order_id: str) -> str:
        """Look up an order: status, parcel.

        Nothing here is a section.
        Returns: not a heading, only a sentence."""
        return ""

    tool = Tool(plain, kind="read")
    assert tool.description == (
        "Look up an order: status, parcel.\n\n"
        "Nothing here is a section.\nReturns: not a heading, only a sentence."
    )
    assert "description" not in properties(tool)["order_id"]

    def described(order_id: str) -> str:
        """Internal notes.

        Args:
            order_id: The order.
        """
        return ""

    tool = Tool(described, kind="read", description="What the model reads.")
    assert tool.description == "What the model reads."
    assert properties(tool)["order_id"]["description"] == "The order."


def test_app_tool_registration_carries_the_descriptions() -> None:
    app = AgentApp()

    @app.tool(kind="read")
    def lookup(order_id: Annotated[str, Field(description="The order.")], page: int = 1) -> str:
        """Look up an order.

        Args:
            page: Which page.
        """
        return ""

    spec = app.registry.get("lookup").spec()
    assert spec.description == "Look up an order."
    assert spec.input_schema["properties"]["order_id"]["description"] == "The order."
    assert spec.input_schema["properties"]["page"]["description"] == "Which page."


# 2. Async tools ----------------------------------------------------------------------------


async def _track(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Track an order."""
    await asyncio.sleep(0)
    return {"order_id": order_id, "run": ctx.run_id, "thread": threading.get_ident()}


def test_an_async_tool_is_awaited_when_no_loop_runs() -> None:
    tool = Tool(_track, kind="read")
    assert set(properties(tool)) == {"order_id"}
    result = tool.invoke({"order_id": "42"}, ctx_for("r9"))
    assert result["order_id"] == "42" and result["run"] == "r9"


def test_an_async_tool_is_awaited_on_a_thread_of_its_own_inside_a_running_loop() -> None:
    tool = Tool(_track, kind="read")

    async def caller() -> Any:
        return tool.invoke({"order_id": "7"}, ctx_for())  # a sync call from a coroutine

    result = asyncio.run(caller())
    assert result["order_id"] == "7"
    assert result["thread"] != threading.get_ident()  # the caller's loop was not reentered


def test_an_async_tools_failures_and_questions_come_out_as_raised() -> None:
    async def boom(message: str) -> str:
        await asyncio.sleep(0)
        raise RuntimeError(message)

    with pytest.raises(RuntimeError, match="kaput"):
        Tool(boom, kind="read").invoke({"message": "kaput"}, ctx_for())

    async def schedule(what: str, ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        if ctx.answers is None:
            ctx.ask(["Which day?"])
        return f"{what} on {ctx.answers['q1']}"

    tool = Tool(schedule, kind="read")
    with pytest.raises(QuestionsAsked) as asked:
        tool.invoke({"what": "a call"}, ctx_for())
    assert asked.value.questions == [{"id": "q1", "question": "Which day?"}]
    assert tool.invoke({"what": "a call"}, ctx_for(answers={"q1": "Monday"})) == (
        "a call on Monday"
    )


def test_a_sync_decorator_around_an_async_handler_is_awaited_too() -> None:
    def traced(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    @traced
    async def lookup(order_id: str) -> str:
        await asyncio.sleep(0)
        return f"order {order_id}"

    assert Tool(lookup, kind="read").invoke({"order_id": "3"}, ctx_for()) == "order 3"


def test_an_async_tools_result_reaches_the_thread_and_the_model(harness: Harness) -> None:
    run = harness.wait(harness.start("tracker", "Where are my parcels?"))

    assert run.status == "completed", run.error
    assert run.output == "both parcels tracked"
    tool_messages = [
        (m.content, m.tool_call_id, m.is_error)
        for m in harness.store.thread_messages(run.thread_id)
        if m.role == "tool"
    ]
    assert tool_messages == [
        ('{"awaited":true,"order_id":"42","parcel":"PX-42"}', "call_1", False),
        ('{"awaited":true,"order_id":"7","parcel":"PX-7"}', "call_2", False),
    ]
    calls = {c["call_id"]: c for c in harness.store.tool_calls(run.run_id)}
    assert calls["call_1"]["status"] == "executed"
    assert calls["call_1"]["result"] == {"order_id": "42", "parcel": "PX-42", "awaited": True}
    assert sorted(what for what, _ in executed(run.run_id)) == ["model", "model", "track", "track"]
    results = [f for f in harness.frames(run.run_id) if f["type"] == "tool_result"]
    assert [f["result"]["parcel"] for f in results] == ["PX-42", "PX-7"]


# 1. AGENT_JOBS_APP from the current directory ------------------------------------------------

MYAGENTS = '''
from agent_jobs import AgentApp, ScriptedModel

from {helper} import greeting

app = AgentApp()


@app.tool(kind="read")
def greet(name: str) -> str:
    """Greet someone."""
    return greeting(name)


app.agent(
    "greeter",
    model=ScriptedModel(
        [{{"tool_calls": [{{"name": "greet", "args": {{"name": "cwd"}}}}]}}, {{"text": "greeted"}}]
    ),
    tools=["greet"],
)
'''


def write_app(directory: Path, module: str = "myagents") -> None:
    """An app module beside a helper it imports: a project's own directory."""
    helper = f"{module}_helper"
    (directory / f"{module}.py").write_text(MYAGENTS.format(helper=helper))
    (directory / f"{helper}.py").write_text(
        "def greeting(name: str) -> str:\n    return f'hello {name}'\n"
    )


def bare_env(**extra: str) -> dict[str, str]:
    """The environment without any AGENT_JOBS_ setting (but the suite's encryption keys)
    or PYTHONPATH."""
    return test_encryption.bare_environ(drop=("PYTHONPATH",)) | extra


def test_load_app_imports_from_the_current_directory_and_leaves_sys_path_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"cwdapp_{uuid.uuid4().hex[:8]}"
    write_app(tmp_path, module)
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    try:
        app = load_app(f"{module}:app")
        assert sorted(app.agents) == ["greeter"]
        assert app.registry.get("greet").invoke({"name": "x"}, ctx_for()) == "hello x"
        assert sys.path == path_before
    finally:
        sys.modules.pop(module, None)
        sys.modules.pop(f"{module}_helper", None)


def test_an_app_missing_from_the_current_directory_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    with pytest.raises(AppLoadError, match="cannot import 'nowhere_to_be_found'") as failed:
        load_app("nowhere_to_be_found:app")
    assert str(tmp_path) in str(failed.value)
    assert sys.path == path_before


def test_the_cli_loads_the_app_from_its_working_directory(tmp_path: Path) -> None:
    write_app(tmp_path)
    # The console script, not `python -m`: `-m` would put the cwd on sys.path by itself.
    done = subprocess.run(
        [str(BIN / "agent-jobs"), "run", "--yes", "--json", "--agent", "greeter", "hi"],
        cwd=tmp_path,
        env=bare_env(
            AGENT_JOBS_APP="myagents:app",
            AGENT_JOBS_DATABASE_URL=f"sqlite:///{tmp_path / 'agent_jobs.db'}",
        ),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["status"] == "completed" and doc["output"] == "greeted"


@pytest.fixture
def cwd_worker(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, request: pytest.FixtureRequest
) -> Iterator[dict[str, str]]:
    """A worker started as `celery -A tasks worker` in the app's own directory; or as
    `celery -A agent_jobs.worker worker` in a directory that also has a `tasks.py` of its
    own, which `-A tasks` would import in the installed app's place."""
    write_app(tmp_path)
    module = getattr(request, "param", "tasks")
    if module != "tasks":
        (tmp_path / "tasks.py").write_text(
            'raise RuntimeError("the project\'s own tasks.py was imported as the worker")\n'
        )
    env = bare_env(
        AGENT_JOBS_APP="myagents:app",
        AGENT_JOBS_BROKER_URL=redis_server.url(7),
        AGENT_JOBS_DATABASE_URL=pg_url,
        AGENT_JOBS_QUEUE=f"agent_jobs_cwd_{uuid.uuid4().hex[:8]}",
    )
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                module,
                "worker",
                "--loglevel=INFO",
                "--concurrency=1",
                "--pool=prefork",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                f"--hostname=cwd-{uuid.uuid4().hex[:6]}@%h",
                f"--queues={env['AGENT_JOBS_QUEUE']}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            return "ready." in log_path.read_text(errors="replace")

        eventually(
            ready,
            what="the worker to say it is ready",
            every=0.05,
            context=lambda: log_path.read_text(errors="replace"),
        )
        yield env | {"WORKER_LOG": str(log_path)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.parametrize("cwd_worker", ["tasks", "agent_jobs.worker"], indirect=True)
def test_a_worker_loads_the_app_from_its_working_directory(
    tmp_path: Path, cwd_worker: dict[str, str]
) -> None:
    env = {k: v for k, v in cwd_worker.items() if k != "WORKER_LOG"}
    try:
        done = subprocess.run(
            [str(BIN / "agent-jobs"), "run", "--yes", "--json", "--agent", "greeter", "hi"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the run never finished:\n" + Path(cwd_worker["WORKER_LOG"]).read_text())
    assert done.returncode == 0, done.stderr + Path(cwd_worker["WORKER_LOG"]).read_text()
    doc = json.loads(done.stdout)
    assert doc["status"] == "completed" and doc["output"] == "greeted"
