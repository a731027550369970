"""The `wait` tool at the seam: its arguments read into a wake time (or a tool error the
model reads), its offer to an agent with `timers=True`, and the loop's sleep as a runner
sees it (a `timer:<call id>` wait whose result the model reads), with no services."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs import checkpoints as names
from agent_jobs.errors import ToolError
from agent_jobs.hooks import LoopHooks, StepCall, TimerWait
from agent_jobs.loop import LoopDeps, TurnInput, run_agent_loop
from agent_jobs.messages import ModelResponse, ToolCall, Usage
from agent_jobs.steps import ModelTurn, PersistToolCall, PersistToolExec
from agent_jobs.timers import SPEC, WAIT, wake_time

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
WEEK = 7 * 86400.0


@pytest.mark.parametrize(
    ("args", "wakes"),
    [
        ({"seconds": 90}, NOW + timedelta(seconds=90)),
        ({"seconds": 0.5, "reason": "a build"}, NOW + timedelta(seconds=0.5)),
        ({"until": "2026-12-05T14:00:00+01:00"}, NOW + timedelta(hours=1)),
        ({"until": "2026-12-06T12:00:00Z"}, NOW + timedelta(days=1)),
        ({"until": "2026-12-01T00:00:00Z"}, NOW),  # past: at once
        ({"seconds": WEEK}, NOW + timedelta(seconds=WEEK)),
    ],
)
def test_a_wait_wakes_at_the_time_its_arguments_say(args: dict[str, Any], wakes: datetime) -> None:
    assert wake_time(args, NOW, WEEK) == wakes


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({}, "one of"),
        ({"seconds": 1, "until": "2026-12-06T12:00:00Z"}, "one of"),
        ({"seconds": "ten"}, "a number"),
        ({"seconds": True}, "a number"),
        ({"seconds": float("nan")}, "finite"),
        ({"seconds": -1}, "0 or more"),
        ({"seconds": WEEK + 1}, "AGENT_JOBS_MAX_SLEEP"),
        ({"until": "2027-01-05T12:00:00Z"}, "AGENT_JOBS_MAX_SLEEP"),
        ({"until": "next monday"}, "ISO 8601"),
        ({"until": 1765000000}, "ISO 8601"),
        ({"until": "2026-12-06T12:00:00"}, "offset"),
        ({"seconds": 1, "reason": 7}, "reason"),
        ({"seconds": 1, "minutes": 2}, "not ['minutes']"),
    ],
)
def test_bad_arguments_are_a_tool_error_that_says_what_to_fix(
    args: dict[str, Any], said: str
) -> None:
    with pytest.raises(ToolError, match=said.replace("[", r"\[").replace("]", r"\]")):
        wake_time(args, NOW, WEEK)


def _app(timers: bool) -> AgentApp:
    app = AgentApp()
    app.agent("a", model=ScriptedModel([{"text": "x"}]), timers=timers)
    return app


def test_only_an_agent_with_timers_is_offered_the_wait_tool() -> None:
    for timers in (True, False):
        app = _app(timers)
        offered = app.offered_tools(app.get_agent("a"), "anyone", None)
        assert (WAIT in offered) is timers
        assert (SPEC in app.tool_specs(offered)) is timers


class Sleepy(LoopHooks):
    """Answers each step as a first run would, and wakes every wait by a message."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.waits: list[TimerWait] = []

    def step(self, call: StepCall) -> Any:
        self.asked.append(call.name)
        intent = call.intent
        if isinstance(intent, ModelTurn):
            if intent.request.step == 0:
                wait = ToolCall(id="t1", name=WAIT, args={"seconds": 60})
                return ModelResponse(text="", tool_calls=[wait], usage=Usage()).model_dump()
            return ModelResponse(text="awake", usage=Usage()).model_dump()
        if isinstance(intent, PersistToolCall):
            return {"kind": "timer", "status": "auto_executed"}
        if isinstance(intent, PersistToolExec):
            assert json.loads(intent.content) == {"woke": "message", "at": "then"}
        if call.name == names.QUOTA_CHECK:
            return {"used": 0}
        if call.name == names.LOAD_THREAD:
            return {"messages": []}
        return {}

    def await_timer(self, wait: TimerWait) -> dict[str, Any]:
        self.waits.append(wait)
        self.asked.append(names.timer(wait.call.id))
        return {"woke": "message", "at": "then"}


def test_the_loop_sleeps_on_a_timer_step_and_the_model_reads_how_it_woke() -> None:
    app = _app(True)
    agent = app.get_agent("a")
    deps = LoopDeps(app, agent, None, "", "2026-12-05", None)
    hooks = Sleepy()
    result = run_agent_loop(TurnInput("r1", "t1", "anyone", "hi"), deps, hooks)
    assert result.output == "awake"
    [wait] = hooks.waits
    assert (wait.run_id, wait.call.id) == ("r1", "t1")
    i = hooks.asked.index("timer:t1")
    assert hooks.asked[i - 1 : i + 2] == ["persist:toolcall:t1", "timer:t1", "persist:toolexec:t1"]
    assert names.parse("timer:t1") == names.Name("timer", "t1")
