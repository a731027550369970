"""Recorded journals replayed offline through `DurableHooks`: no database, no Redis.

Each fixture in `journals/` is a real durable run (recorded by `record_journals.py`).
Replaying it with today's loop must reach the recorded output without a single new
row, dispatch or use of the connection — the way Temporal's replayer tests catch a
workflow change that would break the runs in flight. A journal that no longer
matches the loop's shape must fail loudly with `NonDeterminismError`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Connection

from agent_jobs import ScriptedModel, SlidingWindowHistory, summarize_with_model
from agent_jobs.dispatch import MODEL_TURN
from agent_jobs.errors import NonDeterminismError, StepFailedError, Suspend
from agent_jobs.executor import StepEnv
from agent_jobs.hooks import Patch
from agent_jobs.loop import (
    APPROVALS_AT_ONCE,
    HISTORY_SELECT,
    PARALLEL_TOOLS,
    TurnResult,
    run_agent_loop,
)
from agent_jobs.runners.durable.replay import DurableHooks
from agent_jobs.runners.turn import turn_for
from agent_jobs.settings import Settings
from agent_jobs.store import RunView
from agent_jobs.store.model_requests import expand
from agent_jobs.streams.base import MemoryStreams, RunStream
from tests.support import apps

from .test_loop import RecordingHooks

JOURNALS = Path(__file__).resolve().parent / "journals"
FIXTURES = sorted(path.stem for path in JOURNALS.glob("*.json"))
PATCH_ROW = f"patch:{PARALLEL_TOOLS}"
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)  # the run row's timestamps: the replay reads none
_NO_MODEL = ScriptedModel([{"text": "a replay never calls a model"}])


class ConnectionUsed(BaseException):
    """The replay touched the database. A BaseException, so no `settle` swallows it."""


class NoConnection:
    """Stands in for the pass's connection: any use at all fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise ConnectionUsed(f"the replay used the connection (conn.{name})")


@dataclass(frozen=True)
class Row:
    """A journal row as `journal.load_for_replay` returns it."""

    step: str
    seq: int
    state: str
    result: Any = None
    error: str | None = None
    intent: Any = None


class Replaying(DurableHooks):
    """`DurableHooks`, remembering what each patch question was answered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered: list[tuple[str, bool]] = []

    def patched(self, patch: Patch) -> bool:
        taken = super().patched(patch)
        self.answered.append((patch.id, taken))
        return taken


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((JOURNALS / f"{name}.json").read_text())
    return data


def rows_of(data: dict[str, Any]) -> list[Row]:
    return [Row(**row) for row in data["journal"]]


def steps_of(data: dict[str, Any]) -> list[str]:
    return [row["step"] for row in data["journal"]]


def run_view(data: dict[str, Any], **changes: Any) -> RunView:
    return RunView.model_validate(
        {**data["run"], "created_at": EPOCH, "updated_at": EPOCH, **changes}
    )


def hooks_for(
    data: dict[str, Any],
    rows: list[Row] | None = None,
    *,
    disabled: frozenset[str] = frozenset(),
    status: str | None = None,
) -> Replaying:
    run = run_view(data, **({"status": status} if status else {}))
    env = StepEnv(app=apps.app, stream=RunStream(MemoryStreams(), run.root_run_id, run.run_id))
    conn = cast(Connection, NoConnection())
    return Replaying(conn, run, rows if rows is not None else rows_of(data), env, disabled)


def replay(hooks: Replaying) -> TurnResult:
    # The settings a runner with no patch disabled and no default quota has.
    settings = Settings(daily_token_quota=None, disabled_patches="")
    turn, deps = turn_for(apps.app, hooks.run, settings)
    return run_agent_loop(turn, deps, hooks)


def renamed(data: dict[str, Any], seq: int, step: str) -> list[Row]:
    changed = copy.deepcopy(data)
    [row] = [r for r in changed["journal"] if r["seq"] == seq]
    row["step"] = step
    return rows_of(changed)


def seq_of(data: dict[str, Any], step: str) -> int:
    [seq] = [r["seq"] for r in data["journal"] if r["step"] == step]
    return int(seq)


# --- the fixtures replay to their recorded outcome ------------------------------------------


def test_there_are_fixtures_and_each_is_a_completed_durable_run() -> None:
    assert FIXTURES == [
        "boss",
        "planner",
        "support",
        "support_sequential",
        "two_refunds",
        "two_refunds_one_by_one",
    ]
    for name in FIXTURES:
        data = fixture(name)
        assert data["run"]["runner"] == "durable" and data["run"]["status"] == "completed"
        assert [r["seq"] for r in data["journal"]] == list(range(1, len(data["journal"]) + 1))
        assert all(r["state"] == "done" for r in data["journal"])


@pytest.mark.parametrize("name", FIXTURES)
def test_a_recorded_run_replays_to_its_output_without_io(name: str) -> None:
    data = fixture(name)
    hooks = hooks_for(data)

    result = replay(hooks)

    assert result.output == data["run"]["output"]
    assert result.model_calls == sum(1 for s in steps_of(data) if s.startswith("model:"))
    assert hooks.pos == len(data["journal"])  # every row was asked for, in order
    assert hooks.new_rows == [] and hooks.to_dispatch == [] and hooks.children == []
    assert hooks.env.frames == [] and hooks.env.events == []  # nothing streamed or logged


def test_the_old_shape_is_what_the_sequential_fixture_holds() -> None:
    new, old = fixture("support"), fixture("support_sequential")
    assert PATCH_ROW in steps_of(new) and PATCH_ROW not in steps_of(old)
    first_tool = steps_of(new).index("tool:call_1")
    assert steps_of(new)[first_tool - 2 : first_tool + 2] == [
        "persist:toolcall:call_1",
        "persist:toolcall:call_2",
        "tool:call_1",
        "tool:call_2",
    ]
    first_tool = steps_of(old).index("tool:call_1")
    assert steps_of(old)[first_tool - 1 : first_tool + 4] == [
        "persist:toolcall:call_1",
        "tool:call_1",
        "persist:toolexec:call_1",
        "persist:toolcall:call_2",
        "tool:call_2",
    ]


def test_todays_code_replays_the_old_shape_by_refusing_the_patch_there() -> None:
    old = fixture("support_sequential")
    hooks = hooks_for(old)  # no patch disabled: today's code
    assert replay(hooks).output == "Order 42 was refunded."
    assert hooks.answered == [(PARALLEL_TOOLS, False)]

    hooks = hooks_for(fixture("support"))
    replay(hooks)
    assert hooks.answered == [(PARALLEL_TOOLS, True)]


def test_a_runner_with_the_patch_disabled_replays_the_old_shape_too() -> None:
    hooks = hooks_for(fixture("support_sequential"), disabled=frozenset({PARALLEL_TOOLS}))
    assert replay(hooks).output == "Order 42 was refunded."
    assert hooks.answered == [(PARALLEL_TOOLS, False)]


def test_a_turns_approvals_are_journaled_at_once_and_today_replays_one_by_one_too() -> None:
    new, old = steps_of(fixture("two_refunds")), steps_of(fixture("two_refunds_one_by_one"))
    at = new.index(f"patch:{APPROVALS_AT_ONCE}")
    assert new[at : at + 4] == [
        "patch:agent:approvals-at-once",
        "approval:call_1",
        "approval:call_3",
        "tool:call_1",
    ]
    assert f"patch:{APPROVALS_AT_ONCE}" not in old
    assert old.index("approval:call_3") > old.index("persist:toolexec:call_2")
    for name, taken in (("two_refunds", True), ("two_refunds_one_by_one", False)):
        hooks = hooks_for(fixture(name))  # today's code
        assert replay(hooks).output == "two_refunds done"
        assert (APPROVALS_AT_ONCE, taken) in hooks.answered


def test_a_change_gated_by_a_patch_replays_runs_recorded_before_it() -> None:
    """The agent gained a summarising window since: the run finishes on the old shape."""
    window = SlidingWindowHistory(max_messages=1, summarize=summarize_with_model(_NO_MODEL))
    hooks = hooks_for(fixture("support"))
    turn, deps = turn_for(apps.app, hooks.run, Settings(daily_token_quota=None))
    deps = replace(deps, agent=replace(deps.agent, history=window))

    assert run_agent_loop(turn, deps, hooks).output == "Order 42 was refunded."
    assert hooks.answered[0] == (HISTORY_SELECT, False)
    assert hooks.pos == len(fixture("support")["journal"])


@pytest.mark.parametrize("name", FIXTURES)
def test_the_recording_hooks_spell_the_shape_a_durable_run_journals(name: str) -> None:
    """The two layers agree: the unit suite's `trail` is the durable journal's step list."""
    data = fixture(name)
    recorded = {row["step"]: row["result"] for row in data["journal"]}
    old_shape = PATCH_ROW not in recorded
    at_once = f"patch:{APPROVALS_AT_ONCE}" in recorded
    hooks = RecordingHooks(
        recorded, patches={PARALLEL_TOOLS: not old_shape, APPROVALS_AT_ONCE: at_once}
    )
    turn, deps = turn_for(apps.app, run_view(data), Settings(daily_token_quota=None))

    result = run_agent_loop(turn, deps, hooks)

    assert hooks.trail == steps_of(data)
    assert result.model_calls == sum(1 for step in recorded if step.startswith("model:"))


# --- a journal that no longer matches the loop ----------------------------------------------


def test_two_swapped_steps_raise_naming_the_position_and_both_steps() -> None:
    data = fixture("support")
    first = seq_of(data, "persist:toolexec:call_1")
    second = seq_of(data, "persist:toolexec:call_2")
    rows = renamed(data, first, "persist:toolexec:call_2")
    rows = [
        Row(**{**r.__dict__, "step": "persist:toolexec:call_1"}) if r.seq == second else r
        for r in rows
    ]

    with pytest.raises(NonDeterminismError) as caught:
        replay(hooks_for(data, rows))

    error = caught.value
    assert (error.seq, error.expected, error.got) == (
        first,
        "persist:toolexec:call_2",
        "persist:toolexec:call_1",
    )
    assert f"position {first}" in str(error)
    assert "'persist:toolexec:call_1'" in str(error) and "'persist:toolexec:call_2'" in str(error)


def test_the_members_of_a_fan_out_are_found_by_name_in_whatever_order_they_were_written() -> None:
    data = fixture("support")
    first, second = seq_of(data, "tool:call_1"), seq_of(data, "tool:call_2")
    rows = [
        Row(**{**r.__dict__, "seq": second if r.seq == first else first})
        if r.seq in (first, second)
        else r
        for r in rows_of(data)
    ]
    assert replay(hooks_for(data, rows)).output == data["run"]["output"]


def test_a_renamed_checkpoint_raises_where_it_is_met() -> None:
    data = fixture("planner")
    seq = seq_of(data, "tool:call_1:2")
    with pytest.raises(NonDeterminismError) as caught:
        replay(hooks_for(data, renamed(data, seq, "tool:call_1:round-2")))
    assert (caught.value.seq, caught.value.expected, caught.value.got) == (
        seq,
        "tool:call_1:round-2",
        "tool:call_1:2",
    )


def test_a_run_recorded_on_the_new_shape_fails_on_code_that_predates_the_patch() -> None:
    """Rolling back past a patch while its runs are in flight: caught, not misread."""
    data = fixture("support")
    marker = seq_of(data, PATCH_ROW)
    with pytest.raises(NonDeterminismError) as caught:
        replay(hooks_for(data, disabled=frozenset({PARALLEL_TOOLS})))
    assert (caught.value.seq, caught.value.expected, caught.value.got) == (
        marker,
        PATCH_ROW,
        "persist:toolcall:call_1",
    )


def test_an_ungated_shape_change_breaks_the_old_shape_journal() -> None:
    """Today's code with its `hooks.patched` gate dropped (always the parallel shape)."""

    class Ungated(Replaying):
        def patched(self, patch: Patch) -> bool:
            return True  # no position asked for: the change is not gated

    data = fixture("support_sequential")
    run = run_view(data)
    env = StepEnv(app=apps.app, stream=RunStream(MemoryStreams(), run.run_id, run.run_id))
    hooks = Ungated(cast(Connection, NoConnection()), run, rows_of(data), env, frozenset())

    with pytest.raises(NonDeterminismError) as caught:
        replay(hooks)

    second_record = seq_of(data, "persist:toolcall:call_1") + 1
    assert (caught.value.seq, caught.value.expected, caught.value.got) == (
        second_record,
        "tool:call_1",
        "persist:toolcall:call_2",
    )


def test_a_step_the_journal_holds_at_another_position_raises() -> None:
    data = fixture("boss")
    shifted = [Row(**{**r.__dict__, "seq": r.seq + 1}) for r in rows_of(data)]
    with pytest.raises(NonDeterminismError) as caught:
        replay(hooks_for(data, shifted))
    assert (caught.value.seq, caught.value.expected, caught.value.got) == (1, None, "quota:check")
    assert "elsewhere" in str(caught.value)


# --- a journal that ends early: where a pass would stop -------------------------------------


def _cut(data: dict[str, Any], before: str, **states: str) -> list[Row]:
    """The rows before `before`, with the states given by step name."""
    rows = rows_of(data)[: seq_of(data, before) - 1]
    return [Row(**{**r.__dict__, "state": states.get(r.step, r.state)}) for r in rows]


def test_a_fan_out_in_flight_parks_on_every_read_without_io() -> None:
    data = fixture("support")
    rows = _cut(
        data,
        "persist:toolexec:call_1",
        **{"tool:call_1": "scheduled", "tool:call_2": "started"},
    )
    hooks = hooks_for(data, rows, status="running")
    with pytest.raises(Suspend):
        replay(hooks)
    assert hooks.parked.labels == ["tool:call_1", "tool:call_2"]
    assert hooks.new_rows == [] and hooks.to_dispatch == []


def test_a_wait_for_a_decision_parks_the_run_awaiting_approval() -> None:
    data = fixture("support")
    rows = _cut(data, "tool:call_3", **{"approval:call_3": "waiting"})
    hooks = hooks_for(data, rows, status="awaiting_approval")
    with pytest.raises(Suspend):
        replay(hooks)
    assert hooks.parked.status == "awaiting_approval"
    assert hooks.parked.labels == ["awaiting_approval refund call_3"]


def test_a_missing_remote_step_is_scheduled_without_touching_the_database() -> None:
    """The process that scheduled model:1 knows its whole request: model:2's is journaled
    against it with no read."""
    data = fixture("planner")
    earlier = hooks_for(data, _cut(data, "model:1"), status="running")
    with pytest.raises(Suspend):
        replay(earlier)  # the pass that scheduled model:1
    hooks = hooks_for(data, _cut(data, "model:2"), status="running")
    hooks.known_model = ("model:1", earlier.whole_intent("model:1"))
    with pytest.raises(Suspend):
        replay(hooks)
    assert hooks.to_dispatch == [(MODEL_TURN, "model:2")]
    [new] = hooks.new_rows
    assert (new["step"], new["seq"], new["state"]) == (
        "model:2",
        seq_of(data, "model:2"),
        "scheduled",
    )
    # Journaled as what changed since model:1; the step that calls the model gets it whole.
    assert new["intent"]["since"]["step"] == "model:1"
    journaled = {"model:1": earlier.new_rows[-1]["intent"], "model:2": new["intent"]}
    assert expand(new["intent"], journaled.get) == hooks.whole_intent("model:2")
    whole = hooks.whole_intent("model:2")["request"]["messages"]
    assert len(new["intent"]["request"]["messages"]) < len(whole)


def test_a_model_step_this_process_did_not_schedule_reads_the_one_before() -> None:
    data = fixture("planner")
    hooks = hooks_for(data, _cut(data, "model:2"), status="running")
    with pytest.raises(ConnectionUsed, match=r"conn\."):
        replay(hooks)


def test_a_failed_step_fails_the_turn() -> None:
    data = fixture("planner")
    rows = _cut(data, "answers:call_1:1", **{"tool:call_1": "failed"})
    with pytest.raises(StepFailedError) as caught:
        replay(hooks_for(data, rows, status="running"))
    assert caught.value.step == "tool:call_1"


def test_a_new_local_step_is_the_first_use_of_the_connection() -> None:
    """The guard itself: at the frontier a local step runs in the pass's transaction."""
    data = fixture("boss")
    with pytest.raises(ConnectionUsed):
        replay(hooks_for(data, _cut(data, "persist:title"), status="running"))


# --- a bug found here -----------------------------------------------------------------------


def _two_questions(data: dict[str, Any]) -> list[Row]:
    """The planner's first model pass with two question-asking reads, both answered with
    questions: what a real durable run records (seen with two `schedule` calls)."""
    journal = copy.deepcopy(data["journal"])[: seq_of(data, "persist:toolcall:call_1")]
    model = journal[seq_of(data, "model:1") - 1]["result"]
    [call] = model["tool_calls"]
    model["tool_calls"] = [call, {**call, "id": "call_2", "args": {"what": "a visit"}}]
    asked = data["journal"][seq_of(data, "tool:call_1") - 1]["result"]
    seq = len(journal)
    journal[-1:] = [
        {"step": PATCH_ROW, "seq": seq, "state": "done", "result": True},
        {**journal[-1], "seq": seq + 1},
        {**journal[-1], "seq": seq + 2, "step": "persist:toolcall:call_2"},
        {"step": "tool:call_1", "seq": seq + 3, "state": "done", "result": asked},
        {"step": "tool:call_2", "seq": seq + 4, "state": "done", "result": asked},
    ]
    return [Row(**row) for row in journal]


def test_two_reads_that_ask_questions_in_one_fan_out_replay_to_their_wait() -> None:
    data = fixture("planner")
    rows = _two_questions(data)
    assert [r.step for r in rows][-4:] == [
        "persist:toolcall:call_1",
        "persist:toolcall:call_2",
        "tool:call_1",
        "tool:call_2",
    ]
    hooks = hooks_for(data, rows, status="running")
    # Expected: the replay reaches the frontier at the first answers wait (which puts the
    # question on the record, in the pass's transaction) or parks on it.
    with pytest.raises((ConnectionUsed, Suspend)):
        replay(hooks)
