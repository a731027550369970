"""`run_agent_loop` driven by recording hooks: every branch of a turn, no services.

`RecordingHooks` answers each step from a small script (keyed by step name, else by
intent type, else a default) and records everything the loop asked: the steps with
their intents, the human waits, the delegations, the patches and the parallel
blocks. Its `trail` spells them with the journal's checkpoint names, so a test can
assert the exact shape a durable run would record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from agent_jobs import AgentApp, ScriptedModel, SlidingWindowHistory, summarize_with_model
from agent_jobs import checkpoints as names
from agent_jobs.checkpoints import (
    CallVerdict,
    Decision,
    DelegationOutcome,
    Prepared,
    ThreadSnapshot,
    ToolOutcome,
)
from agent_jobs.errors import (
    MaxStepsExceededError,
    QuotaExceededError,
    StepFailedError,
    StepRejectedError,
    Suspend,
)
from agent_jobs.history import SUMMARY_PREFIX
from agent_jobs.hooks import (
    AnswersWait,
    ApprovalRequests,
    ApprovalWait,
    Delegation,
    LoopHooks,
    ParallelBlock,
    Patch,
    Settled,
    StepCall,
    settle,
)
from agent_jobs.loop import (
    HISTORY_SELECT,
    MAX_QUESTION_ROUNDS,
    PARALLEL_TOOLS,
    LoopDeps,
    TurnInput,
    TurnResult,
    derive_title,
    run_agent_loop,
)
from agent_jobs.messages import (
    Message,
    ModelResponse,
    ModelSettings,
    ToolCall,
    Usage,
    args_sha256,
)
from agent_jobs.steps import (
    Intent,
    InvokeTool,
    LoadThread,
    ModelTurn,
    PersistAssistant,
    PersistToolCall,
    PersistToolExec,
    PersistUserMessage,
    PrepareStep,
    QuotaCheck,
    RecordUsage,
    SetTitle,
    Summarize,
)

T = TypeVar("T")
I = TypeVar("I", bound=Intent)  # noqa: E741

# --- the app ---------------------------------------------------------------------------
# Its models and tools never run: every step's result comes from the hooks' script.

APP = AgentApp(roles={"user-7": ["support"], "alice": ["lead"]})


@APP.tool(kind="read")
def lookup(order_id: str) -> dict[str, Any]:
    """Look up an order."""
    raise AssertionError("tools run inside steps, and the hooks answer the steps")


@APP.tool(kind="read")
def schedule(what: str) -> str:
    """Book something on a day the person picks."""
    raise AssertionError("tools run inside steps, and the hooks answer the steps")


@APP.tool(kind="action", roles=["support"], approvers=["lead"])
def refund(order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order."""
    raise AssertionError("tools run inside steps, and the hooks answer the steps")


_UNUSED = ScriptedModel([{"text": "the hooks answer model steps"}])
APP.agent(
    "support",
    model=_UNUSED,
    system="You are support.",
    tools=["lookup", "schedule", "refund", "clerk"],
    max_steps=3,
)
APP.agent("clerk", model=_UNUSED, tools=["lookup"])
APP.agent("windowed", model=_UNUSED, history=SlidingWindowHistory(max_messages=2))
APP.agent(
    "summarized",
    model=_UNUSED,
    history=SlidingWindowHistory(max_messages=2, summarize=summarize_with_model(_UNUSED)),
)

TURN = TurnInput(run_id="run-1", thread_id="thread-1", actor="user-7", text="Where is order 42?")
DAY = "2025-01-31"


def deps(agent: str = "support", quota: int | None = None) -> LoopDeps:
    spec = APP.get_agent(agent)
    return LoopDeps(
        app=APP,
        agent=spec,
        persona=None,
        system_prompt=APP.system_prompt(spec, None),
        day=DAY,
        quota_limit=quota,
    )


# --- recording hooks -------------------------------------------------------------------

Answer = Any  # a JSON value, a BaseModel, an exception to raise, or fn(StepCall) -> Answer


class RecordingHooks(LoopHooks):
    """Answers steps from `script` and records every call the loop makes."""

    def __init__(
        self,
        script: Mapping[str, Answer] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        answers: Mapping[str, dict[str, Any]] | None = None,
        delegations: Mapping[str, DelegationOutcome] | None = None,
        patches: Mapping[str, bool] | None = None,
        reverse_parallel: bool = False,
    ) -> None:
        self.script = dict(script or {})
        self.decisions = dict(decisions or {})
        self.answers = dict(answers or {})
        self.delegations = dict(delegations or {})
        self.patches = dict(patches or {})
        self.reverse_parallel = reverse_parallel
        self.calls: list[StepCall] = []
        self.approvals: list[ApprovalWait] = []
        self.requested: list[list[str]] = []  # the calls of each request_approvals
        self.questions: list[AnswersWait] = []
        self.delegated: list[Delegation] = []
        self.patches_asked: list[str] = []
        self.blocks: list[int] = []  # the size of each parallel block
        self.trail: list[str] = []  # every checkpoint, as the durable journal names it
        self._ids = 0

    # --- what was asked ---------------------------------------------------------------

    @property
    def steps(self) -> list[str]:
        return [call.name for call in self.calls]

    def intent(self, name: str, kind: type[I]) -> I:
        [found] = [call.intent for call in self.calls if call.name == name]
        assert isinstance(found, kind), found
        return found

    def request(self, n: int) -> ModelTurn:
        return self.intent(names.model(n), ModelTurn)

    # --- the hooks --------------------------------------------------------------------

    def step(self, call: StepCall) -> Any:
        self.calls.append(call)
        self.trail.append(call.name)
        answer = self.script.get(call.name, self.script.get(str(getattr(call.intent, "type", ""))))
        if answer is None:
            answer = self._default(call)
        if callable(answer) and not isinstance(answer, type):
            answer = answer(call)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, BaseModel):
            answer = answer.model_dump(mode="json")
        return json.loads(json.dumps(answer))  # what a runner hands back: plain JSON

    def _default(self, call: StepCall) -> Any:
        intent = call.intent
        if isinstance(intent, QuotaCheck):
            return {"used": 0, "limit": intent.limit}
        if isinstance(intent, LoadThread):
            user = Message(role="user", content=TURN.text)
            return ThreadSnapshot(messages=[user])
        if isinstance(intent, PrepareStep):
            return Prepared()
        if isinstance(intent, PersistToolCall):
            return verdict_for(intent.call)
        if isinstance(intent, InvokeTool):
            return ToolOutcome(ok=True, result={"tool": intent.call.name, **intent.call.args})
        if isinstance(intent, RecordUsage | SetTitle):
            return {}
        if isinstance(intent, PersistUserMessage | PersistAssistant | PersistToolExec):
            self._ids += 1
            return {"message_id": self._ids}
        raise AssertionError(f"the script has no answer for {call.name}")

    def request_approvals(self, requests: ApprovalRequests) -> None:
        self.requested.append([wait.call.id for wait in requests.waits])
        self.trail.extend(names.approval(wait.call.id) for wait in requests.waits)

    def await_approval(self, wait: ApprovalWait) -> Decision:
        self.approvals.append(wait)
        if not wait.requested:  # else its checkpoint was written with the request
            self.trail.append(names.approval(wait.call.id))
        return self.decisions.get(wait.call.id, Decision(decision="approve", actor="alice"))

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        self.questions.append(wait)
        self.trail.append(names.answers(wait.request_id))
        return self.answers.get(wait.request_id, {"q1": "Friday"})

    def run_agent(self, delegation: Delegation) -> DelegationOutcome:
        self.delegated.append(delegation)
        self.trail.append(names.delegation(delegation.call.id))
        return self.delegations.get(
            delegation.agent, DelegationOutcome(ok=True, output=f"{delegation.agent} did it")
        )

    def parallel(self, block: ParallelBlock[T]) -> list[Settled[T]]:
        self.blocks.append(len(block.tasks))
        if not self.reverse_parallel:
            return [settle(task) for task in block.tasks]
        settled = [settle(task) for task in reversed(block.tasks)]
        return list(reversed(settled))

    def patched(self, patch: Patch) -> bool:
        self.patches_asked.append(patch.id)
        taken = self.patches.get(patch.id, True)
        if taken:
            self.trail.append(names.patch(patch.id))
        return taken


def verdict_for(call: ToolCall) -> CallVerdict:
    """What `persist:toolcall` decides for the app above, by the tool's kind."""
    kind = APP.kind_of(call.name)
    if kind == "action":
        return CallVerdict(kind="action", status="pending_approval")
    if kind == "read":
        return CallVerdict(kind="read", status="auto_executed")
    if kind == "agent":
        return CallVerdict(kind="agent", status="auto_executed")
    return CallVerdict(kind="read", status="failed", error=f"no tool named {call.name!r}")


def reply(text: str = "", *calls: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    """A model's answer: text, and tool calls as (id, name, args)."""
    return ModelResponse(
        text=text,
        tool_calls=[ToolCall(id=i, name=n, args=a) for i, n, a in calls],
        usage=Usage(input_tokens=10, output_tokens=2),
        model="scripted",
    )


def turns(*replies: ModelResponse) -> dict[str, Answer]:
    """`model:1`, `model:2`, … answered in order."""
    return {names.model(n): r for n, r in enumerate(replies, start=1)}


def run(hooks: RecordingHooks, agent: str = "support", **kw: Any) -> TurnResult:
    return run_agent_loop(TURN, deps(agent, **kw), hooks)


PREFIX = ["quota:check", "persist:user", "load:thread"]


def step(n: int) -> list[str]:
    return [f"prepare:{n}", f"model:{n}", f"usage:{n}", f"persist:assistant:{n}"]


def tool_message(hooks: RecordingHooks, n: int, call_id: str) -> Message:
    """The tool message for `call_id` in model pass `n`'s request."""
    [found] = [m for m in hooks.request(n).request.messages if m.tool_call_id == call_id]
    return found


LOOKUP_42 = ("c1", "lookup", {"order_id": "42"})
LOOKUP_7 = ("c2", "lookup", {"order_id": "7"})
REFUND = ("c2", "refund", {"order_id": "42", "amount": 5})


# --- a reply with no tool calls ------------------------------------------------------------


def test_a_plain_reply_ends_a_first_turn_and_titles_the_thread() -> None:
    hooks = RecordingHooks(turns(reply("Hello.")))
    result = run(hooks)

    assert result == TurnResult(output="Hello.", model_calls=1)
    assert hooks.trail == [*PREFIX, *step(1), "persist:title"]
    assert hooks.intent("persist:title", SetTitle).title == "Where is order 42?"
    request = hooks.request(1).request
    assert request.system == "You are support."
    assert [(m.role, m.content) for m in request.messages] == [("user", "Where is order 42?")]
    assert [t.name for t in request.tools] == ["lookup", "schedule", "refund", "clerk"]
    assert request.step == 0 and request.run_id == "run-1"
    usage = hooks.intent("usage:1", RecordUsage)
    assert (usage.step, usage.day, usage.kind, usage.usage.input_tokens) == (
        "model:1",
        DAY,
        "model",
        10,
    )
    assert hooks.patches_asked == [] and hooks.blocks == []


@pytest.mark.parametrize(
    "snapshot",
    [{"answered": True}, {"title": "Earlier"}],
    ids=["answered", "titled"],
)
def test_no_title_once_the_thread_was_answered_or_titled(snapshot: dict[str, Any]) -> None:
    loaded = ThreadSnapshot(messages=[Message(role="user", content="hi")], **snapshot)
    hooks = RecordingHooks({"load:thread": loaded, **turns(reply("Hello."))})
    assert run(hooks).output == "Hello."
    assert hooks.trail == [*PREFIX, *step(1)]


def test_the_title_is_the_first_line_cut_at_a_word() -> None:
    assert derive_title("  \n") == "Untitled"
    assert derive_title("Where is order 42?\nmore detail") == "Where is order 42?"
    long = "word " * 20
    title = derive_title(long)
    assert title.endswith("…") and len(title) <= 61 and not title[:-1].endswith(" ")


# --- the quota and the step boundary ------------------------------------------------------


def test_an_exceeded_quota_stops_before_any_model_step() -> None:
    hooks = RecordingHooks({"quota:check": {"used": 120, "limit": 100}})
    with pytest.raises(QuotaExceededError) as caught:
        run(hooks, quota=100)
    assert hooks.trail == ["quota:check"]
    check = hooks.intent("quota:check", QuotaCheck)
    assert (check.actor, check.day, check.limit) == ("user-7", DAY, 100)
    assert "user-7" in str(caught.value)


def test_a_quota_with_room_left_and_no_quota_at_all_both_go_on() -> None:
    for verdict in ({"used": 99, "limit": 100}, {"used": 10_000, "limit": None}):
        hooks = RecordingHooks({"quota:check": verdict, **turns(reply("ok"))})
        assert run(hooks).output == "ok"
        assert "model:1" in hooks.steps


def test_a_rejected_step_boundary_fails_the_turn_there() -> None:
    script = {
        **turns(reply("", LOOKUP_42)),
        "prepare:2": Prepared(rejected="step 2 is closed"),
    }
    hooks = RecordingHooks(script)
    with pytest.raises(StepRejectedError) as caught:
        run(hooks)
    assert (caught.value.step, caught.value.reason) == (2, "step 2 is closed")
    assert hooks.trail == [
        *PREFIX,
        *step(1),
        "persist:toolcall:c1",
        "tool:c1",
        "persist:toolexec:c1",
        "prepare:2",
    ]


def test_max_steps_caps_the_model_passes() -> None:
    def always_a_call(call: StepCall) -> ModelResponse:
        assert isinstance(call.intent, ModelTurn)
        n = call.intent.request.step + 1
        return reply("again", (f"c{n}", "lookup", {"order_id": str(n)}))

    hooks = RecordingHooks({"model_turn": always_a_call})
    with pytest.raises(MaxStepsExceededError) as caught:
        run(hooks)  # support's max_steps is 3
    assert caught.value.max_steps == 3
    assert [s for s in hooks.steps if s.startswith("model:")] == ["model:1", "model:2", "model:3"]
    last = ["persist:assistant:3", "persist:toolcall:c3", "tool:c3", "persist:toolexec:c3"]
    assert hooks.trail[-4:] == last
    assert "prepare:4" not in hooks.steps and "persist:title" not in hooks.steps


# --- reads -----------------------------------------------------------------------------------


def test_one_read_runs_in_sequence_without_asking_the_patch() -> None:
    hooks = RecordingHooks(turns(reply("Checking.", LOOKUP_42), reply("It is lost.")))
    assert run(hooks) == TurnResult(output="It is lost.", model_calls=2)

    assert hooks.trail == [
        *PREFIX,
        *step(1),
        "persist:toolcall:c1",
        "tool:c1",
        "persist:toolexec:c1",
        *step(2),
        "persist:title",
    ]
    assert hooks.patches_asked == [] and hooks.blocks == []
    recorded = hooks.intent("persist:toolcall:c1", PersistToolCall)
    assert recorded.offered == ["lookup", "schedule", "refund", "clerk"] and recorded.depth == 0
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.result) == ("executed", {"tool": "lookup", "order_id": "42"})
    message = tool_message(hooks, 2, "c1")
    assert message.content == '{"order_id":"42","tool":"lookup"}'  # sorted keys, compact
    assert (message.role, message.name, message.is_error) == ("tool", "lookup", False)
    sent = hooks.request(2).request.messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    assert sent[1].tool_calls == [ToolCall(id="c1", name="lookup", args={"order_id": "42"})]


def test_two_reads_take_the_parallel_shape_when_patched() -> None:
    hooks = RecordingHooks(turns(reply("", LOOKUP_42, LOOKUP_7), reply("Both found.")))
    assert run(hooks).output == "Both found."

    assert hooks.trail == [
        *PREFIX,
        *step(1),
        "patch:agent:parallel-tools",
        "persist:toolcall:c1",
        "persist:toolcall:c2",
        "tool:c1",
        "tool:c2",
        "persist:toolexec:c1",
        "persist:toolexec:c2",
        *step(2),
        "persist:title",
    ]
    assert hooks.patches_asked == [PARALLEL_TOOLS] and hooks.blocks == [2]
    assert [m.tool_call_id for m in hooks.request(2).request.messages if m.role == "tool"] == [
        "c1",
        "c2",
    ]


def test_two_reads_keep_the_sequential_shape_when_the_patch_is_refused() -> None:
    hooks = RecordingHooks(
        turns(reply("", LOOKUP_42, LOOKUP_7), reply("Both found.")),
        patches={PARALLEL_TOOLS: False},
    )
    assert run(hooks).output == "Both found."

    assert hooks.trail == [
        *PREFIX,
        *step(1),
        "persist:toolcall:c1",
        "tool:c1",
        "persist:toolexec:c1",
        "persist:toolcall:c2",
        "tool:c2",
        "persist:toolexec:c2",
        *step(2),
        "persist:title",
    ]
    assert hooks.patches_asked == [PARALLEL_TOOLS] and hooks.blocks == []


def test_the_order_parallel_reads_ran_in_does_not_change_what_is_persisted() -> None:
    hooks = RecordingHooks(
        turns(reply("", LOOKUP_42, LOOKUP_7), reply("ok")), reverse_parallel=True
    )
    run(hooks)
    tools_at = hooks.trail.index("patch:agent:parallel-tools") + 3
    assert hooks.trail[tools_at : tools_at + 4] == [
        "tool:c2",
        "tool:c1",
        "persist:toolexec:c1",
        "persist:toolexec:c2",
    ]
    assert hooks.intent("persist:toolexec:c1", PersistToolExec).result == {
        "tool": "lookup",
        "order_id": "42",
    }


def test_a_read_beside_an_action_asks_for_the_decision_first_then_runs_each_in_order() -> None:
    hooks = RecordingHooks(turns(reply("", LOOKUP_42, REFUND), reply("Refunded.")))
    run(hooks)
    assert hooks.trail[len(PREFIX) + 4 :][:9] == [
        "patch:agent:parallel-tools",
        "persist:toolcall:c1",
        "persist:toolcall:c2",
        "patch:agent:approvals-at-once",
        "approval:c2",  # asked for before the read runs
        "tool:c1",
        "persist:toolexec:c1",
        "tool:c2",
        "persist:toolexec:c2",
    ]
    assert hooks.requested == [["c2"]]
    assert [(w.call.id, w.requested) for w in hooks.approvals] == [("c2", True)]
    assert hooks.blocks == []  # not every journaled kind is read: no fan-out


def test_every_action_of_a_turn_is_asked_for_at_once_and_runs_in_call_order() -> None:
    refund_7 = ("c3", "refund", {"order_id": "7", "amount": 3})
    no = Decision(decision="reject", actor="alice", reason="not this one")
    hooks = RecordingHooks(
        turns(reply("", REFUND, LOOKUP_42, refund_7), reply("Done.")), decisions={"c2": no}
    )
    run(hooks)
    assert hooks.requested == [["c2", "c3"]]  # both, before any call runs
    assert [w.call.id for w in hooks.approvals] == ["c2", "c3"]  # awaited in call order
    after = hooks.trail[hooks.trail.index("patch:agent:approvals-at-once") :]
    assert after[:8] == [
        "patch:agent:approvals-at-once",
        "approval:c2",
        "approval:c3",
        "persist:toolexec:c2",  # rejected: the model is told, nothing runs
        "tool:c1",
        "persist:toolexec:c1",
        "tool:c3",
        "persist:toolexec:c3",
    ]
    assert hooks.intent("persist:toolexec:c2", PersistToolExec).status == "rejected"
    assert "tool:c2" not in hooks.steps


def test_a_run_that_waited_under_the_old_shape_asks_for_each_decision_in_turn() -> None:
    hooks = RecordingHooks(
        turns(reply("", LOOKUP_42, REFUND), reply("Refunded.")),
        patches={"agent:approvals-at-once": False},
    )
    run(hooks)
    assert hooks.requested == []
    assert [(w.call.id, w.requested) for w in hooks.approvals] == [("c2", False)]
    assert hooks.trail[len(PREFIX) + 4 :][:8] == [
        "patch:agent:parallel-tools",
        "persist:toolcall:c1",
        "persist:toolcall:c2",
        "tool:c1",
        "persist:toolexec:c1",
        "approval:c2",
        "tool:c2",
        "persist:toolexec:c2",
    ]
    assert hooks.blocks == []  # not every journaled kind is read: no fan-out


def test_a_refused_read_in_a_fan_out_is_left_out_of_the_block() -> None:
    refused = CallVerdict(kind="read", status="failed", error="bad arguments")
    script = {
        **turns(reply("", LOOKUP_42, LOOKUP_7), reply("ok")),
        "persist:toolcall:c2": refused,
    }
    hooks = RecordingHooks(script)
    run(hooks)
    assert hooks.blocks == [1]
    assert "tool:c2" not in hooks.steps
    assert hooks.trail.index("persist:toolexec:c1") < hooks.trail.index("persist:toolexec:c2")
    assert hooks.intent("persist:toolexec:c2", PersistToolExec).status == "failed"


# --- failures --------------------------------------------------------------------------------


def test_a_refused_call_reaches_the_model_as_an_error_without_running() -> None:
    refused = CallVerdict(kind="read", status="failed", error="actor may not use lookup")
    hooks = RecordingHooks(
        {**turns(reply("", LOOKUP_42), reply("Sorry.")), "persist:toolcall:c1": refused}
    )
    assert run(hooks).output == "Sorry."

    assert "tool:c1" not in hooks.steps
    assert hooks.trail[len(PREFIX) + 4 : len(PREFIX) + 6] == [
        "persist:toolcall:c1",
        "persist:toolexec:c1",
    ]
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.error) == ("failed", "actor may not use lookup")
    message = tool_message(hooks, 2, "c1")
    assert message.is_error and json.loads(message.content) == {"error": "actor may not use lookup"}


def test_a_refused_call_without_a_reason_still_says_so() -> None:
    refused = CallVerdict(kind="action", status="failed")
    hooks = RecordingHooks(
        {**turns(reply("", LOOKUP_42), reply("ok")), "persist:toolcall:c1": refused}
    )
    run(hooks)
    assert hooks.intent("persist:toolexec:c1", PersistToolExec).error == "the call was refused"
    assert hooks.approvals == []  # a refused action never waits for a person


def test_a_tool_that_fails_is_persisted_as_failed() -> None:
    hooks = RecordingHooks(
        {**turns(reply("", LOOKUP_42), reply("ok")), "tool:c1": ToolOutcome(ok=False)}
    )
    run(hooks)
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.error) == ("failed", "the tool failed")
    assert tool_message(hooks, 2, "c1").is_error


# --- actions ---------------------------------------------------------------------------------


def test_an_approved_action_waits_then_runs() -> None:
    call = ("c1", "refund", {"order_id": "42", "amount": 5})
    hooks = RecordingHooks(turns(reply("Refunding.", call), reply("Refunded.")))
    assert run(hooks).output == "Refunded."

    assert hooks.trail[len(PREFIX) + 4 :] == [
        "persist:toolcall:c1",
        "approval:c1",
        "tool:c1",
        "persist:toolexec:c1",
        *step(2),
        "persist:title",
    ]
    [wait] = hooks.approvals
    assert (wait.run_id, wait.call.id) == ("run-1", "c1")
    assert wait.args_sha256 == args_sha256({"order_id": "42", "amount": 5})


def test_a_rejected_action_never_runs_and_the_model_reads_the_rejection() -> None:
    call = ("c1", "refund", {"order_id": "42", "amount": 5})
    no = Decision(decision="reject", actor="alice", reason="too much")
    hooks = RecordingHooks(turns(reply("", call), reply("I could not.")), decisions={"c1": no})
    assert run(hooks).output == "I could not."

    assert "tool:c1" not in hooks.steps
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.error) == ("rejected", "too much")
    message = tool_message(hooks, 2, "c1")
    assert message.is_error
    assert message.content == '{"by":"alice","reason":"too much","rejected":true}'


# --- questions -------------------------------------------------------------------------------


def test_a_tool_that_asks_runs_again_with_the_answers() -> None:
    asks = ToolOutcome(ok=True, questions=[{"id": "q1", "question": "Which day?"}])
    script = {
        **turns(reply("", ("c1", "schedule", {"what": "a call"})), reply("Planned.")),
        "tool:c1": asks,
        "tool:c1:2": ToolOutcome(ok=True, result="a call booked for Friday"),
    }
    hooks = RecordingHooks(script, answers={"c1:1": {"q1": "Friday"}})
    assert run(hooks).output == "Planned."

    assert hooks.trail[len(PREFIX) + 4 :][:5] == [
        "persist:toolcall:c1",
        "tool:c1",
        "answers:c1:1",
        "tool:c1:2",
        "persist:toolexec:c1",
    ]
    [wait] = hooks.questions
    assert (wait.request_id, wait.questions, wait.call.name) == (
        "c1:1",
        [{"id": "q1", "question": "Which day?"}],
        "schedule",
    )
    assert hooks.intent("tool:c1", InvokeTool).answers is None
    assert hooks.intent("tool:c1:2", InvokeTool).answers == {"q1": "Friday"}
    assert tool_message(hooks, 2, "c1").content == "a call booked for Friday"  # a str, as is


def test_a_tool_that_keeps_asking_is_given_up_on() -> None:
    asks = ToolOutcome(ok=True, questions=[{"id": "q1", "question": "Which day?"}])
    script = {
        **turns(reply("", ("c1", "schedule", {"what": "a call"})), reply("Gave up.")),
        "invoke_tool": asks,
    }
    hooks = RecordingHooks(script)
    run(hooks)

    rounds = range(1, MAX_QUESTION_ROUNDS + 1)
    expected = ["persist:toolcall:c1", "tool:c1"]
    for k in rounds:
        expected += [f"answers:c1:{k}", f"tool:c1:{k + 1}"]
    start = hooks.trail.index("persist:toolcall:c1")
    assert hooks.trail[start : start + len(expected) + 1] == [*expected, "persist:toolexec:c1"]
    assert [w.request_id for w in hooks.questions] == [f"c1:{k}" for k in rounds]
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.error) == (
        "failed",
        "the tool kept asking questions; giving up",
    )


# --- delegation ------------------------------------------------------------------------------


def test_a_delegation_runs_the_other_agent_and_persists_its_answer() -> None:
    call = ("c1", "clerk", {"task": "refund order 42"})
    hooks = RecordingHooks(turns(reply("", call), reply("The clerk did it.")))
    assert run(hooks).output == "The clerk did it."

    assert hooks.trail[len(PREFIX) + 4 :][:3] == [
        "persist:toolcall:c1",
        "agent:c1",
        "persist:toolexec:c1",
    ]
    [delegation] = hooks.delegated
    assert (delegation.agent, delegation.task, delegation.depth, delegation.run_id) == (
        "clerk",
        "refund order 42",
        1,
        "run-1",
    )
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.result, executed.content) == (
        "executed",
        "clerk did it",
        "clerk did it",
    )


def test_a_failed_delegation_is_a_failed_call() -> None:
    call = ("c1", "clerk", {"what": "no task field"})
    failed = DelegationOutcome(ok=False, error="the delegated agent failed: boom")
    hooks = RecordingHooks(turns(reply("", call), reply("ok")), delegations={"clerk": failed})
    run(hooks)

    assert hooks.delegated[0].task == '{"what":"no task field"}'  # the arguments, as JSON
    executed = hooks.intent("persist:toolexec:c1", PersistToolExec)
    assert (executed.status, executed.error) == ("failed", "the delegated agent failed: boom")
    assert tool_message(hooks, 2, "c1").is_error


def test_the_default_hooks_cannot_delegate() -> None:
    outcome = LoopHooks().run_agent(
        Delegation("run-1", ToolCall(id="c1", name="clerk"), "clerk", "x", 1)
    )
    assert not outcome.ok and outcome.error


# --- call ids --------------------------------------------------------------------------------


def test_duplicate_and_empty_call_ids_get_unique_ids() -> None:
    first = reply(
        "",
        ("", "lookup", {"order_id": "1"}),
        ("dup", "lookup", {"order_id": "2"}),
        ("dup", "lookup", {"order_id": "3"}),
    )
    second = reply("", ("dup", "lookup", {"order_id": "4"}), ("x" * 200, "lookup", {}))
    hooks = RecordingHooks(turns(first, second, reply("done")))
    run(hooks)

    recorded = [s.removeprefix("persist:toolcall:") for s in hooks.steps if "toolcall" in s]
    assert recorded == ["call_1_1", "dup", "dup~1.3", "dup~2.1", "x" * 150]
    persisted = hooks.intent("persist:assistant:1", PersistAssistant).tool_calls
    assert [c.id for c in persisted] == ["call_1_1", "dup", "dup~1.3"]
    assert [c.args["order_id"] for c in persisted] == ["1", "2", "3"]
    assert len(set(hooks.steps)) == len(hooks.steps)  # no checkpoint name twice


def test_a_suffixed_id_never_collides_with_an_id_the_model_gave() -> None:
    calls = reply("", ("x", "lookup", {}), ("x~1.3", "lookup", {}), ("x", "lookup", {}))
    hooks = RecordingHooks(turns(calls, reply("done")), patches={PARALLEL_TOOLS: False})
    run(hooks)
    ids = [c.id for c in hooks.intent("persist:assistant:1", PersistAssistant).tool_calls]
    assert len(set(ids)) == 3, ids


# --- steering --------------------------------------------------------------------------------


def test_steering_and_listener_messages_are_carried_into_the_request() -> None:
    prepared = Prepared(
        claimed=["actually, order 43"],
        messages=["(policy: be brief)"],
        settings=ModelSettings(model="m2", reasoning_effort="low"),
    )
    script = {**turns(reply("", LOOKUP_42), reply("ok")), "prepare:1": prepared}
    hooks = RecordingHooks(script)
    run(hooks)

    first = hooks.request(1).request
    assert [(m.role, m.content) for m in first.messages] == [
        ("user", "Where is order 42?"),
        ("user", "actually, order 43"),
        ("user", "(policy: be brief)"),
    ]
    assert (first.settings.model, first.settings.reasoning_effort) == ("m2", "low")
    # What was carried in stays in the history of the next pass.
    assert [m.content for m in hooks.request(2).request.messages][:3] == [
        "Where is order 42?",
        "actually, order 43",
        "(policy: be brief)",
    ]


def test_a_new_series_starts_the_request_over_from_what_was_carried() -> None:
    script = {
        **turns(reply("", LOOKUP_42), reply("fresh")),
        "prepare:2": Prepared(messages=["start over from here"], new_series=True),
    }
    hooks = RecordingHooks(script)
    run(hooks)
    sent = hooks.request(2).request.messages
    assert [(m.role, m.content) for m in sent] == [("user", "start over from here")]


def test_the_boundary_is_asked_with_the_agents_defaults() -> None:
    hooks = RecordingHooks(turns(reply("ok")))
    run(hooks)
    boundary = hooks.intent("prepare:1", PrepareStep)
    assert (boundary.step, boundary.agent, boundary.actor) == (1, "support", "user-7")


# --- the history window ----------------------------------------------------------------------

OLD = [
    Message(role="user", content="one"),
    Message(role="assistant", content="first answer"),
    Message(role="user", content="two"),
    Message(role="assistant", content="second answer"),
    Message(role="user", content="Where is order 42?"),
]


def _loaded(messages: Sequence[Message] = OLD) -> ThreadSnapshot:
    return ThreadSnapshot(messages=list(messages), answered=True, title="one")


def test_the_window_bounds_the_request_under_its_patch() -> None:
    hooks = RecordingHooks({"load:thread": _loaded(), **turns(reply("ok"))})
    run(hooks, agent="windowed")

    assert hooks.trail == [*PREFIX, "patch:agent:history-select", *step(1)]
    assert hooks.intent("load:thread", LoadThread).message_limit == 2
    sent = hooks.request(1).request.messages
    assert [m.content for m in sent] == ["second answer", "Where is order 42?"]
    assert hooks.patches_asked == [HISTORY_SELECT]


def test_the_window_is_not_applied_when_its_patch_is_refused() -> None:
    hooks = RecordingHooks(
        {"load:thread": _loaded(), **turns(reply("ok"))}, patches={HISTORY_SELECT: False}
    )
    run(hooks, agent="windowed")
    assert hooks.trail == [*PREFIX, *step(1)]
    assert len(hooks.request(1).request.messages) == len(OLD)


def test_what_the_window_drops_is_summarised_in_its_own_steps() -> None:
    summary = ModelResponse(
        text="they talked about orders", usage=Usage(input_tokens=40, output_tokens=5), model="s"
    )
    script = {"load:thread": _loaded(), "history:summarize": summary, **turns(reply("ok"))}
    hooks = RecordingHooks(script)
    run(hooks, agent="summarized")

    assert hooks.trail == [
        *PREFIX,
        "patch:agent:history-select",
        "history:summarize",
        "usage:summary",
        *step(1),
    ]
    assert hooks.intent("load:thread", LoadThread).message_limit is None  # a summary needs all
    dropped = hooks.intent("history:summarize", Summarize).messages
    assert [m.content for m in dropped] == ["one", "first answer", "two"]
    usage = hooks.intent("usage:summary", RecordUsage)
    assert (usage.kind, usage.step, usage.model) == ("summary", "history:summarize", "s")
    sent = hooks.request(1).request.messages
    assert (sent[0].role, sent[0].content) == ("system", SUMMARY_PREFIX + summary.text)
    assert [m.content for m in sent[1:]] == ["second answer", "Where is order 42?"]


def test_nothing_is_summarised_when_nothing_was_dropped() -> None:
    short = _loaded([Message(role="user", content="Where is order 42?")])
    hooks = RecordingHooks({"load:thread": short, **turns(reply("ok"))})
    run(hooks, agent="summarized")
    assert hooks.trail == [*PREFIX, "patch:agent:history-select", *step(1)]


def test_no_summary_when_the_history_patch_is_refused() -> None:
    hooks = RecordingHooks(
        {"load:thread": _loaded(), **turns(reply("ok"))}, patches={HISTORY_SELECT: False}
    )
    run(hooks, agent="summarized")
    assert "history:summarize" not in hooks.steps
    assert [m.content for m in hooks.request(1).request.messages] == [m.content for m in OLD]


def test_an_agent_without_a_window_never_asks_the_history_patch() -> None:
    hooks = RecordingHooks(turns(reply("ok")))
    run(hooks)
    assert HISTORY_SELECT not in hooks.patches_asked


# --- unwinding from a parallel block ---------------------------------------------------------


@pytest.mark.parametrize(
    "raised",
    [Suspend("tool:c1"), StepFailedError("tool:c1", "gave up after 3 attempts")],
    ids=["suspend", "failure"],
)
def test_a_signal_in_one_read_unwinds_only_after_every_read_settled(
    raised: BaseException,
) -> None:
    third = ("c3", "lookup", {"order_id": "9"})
    script = {**turns(reply("", LOOKUP_42, LOOKUP_7, third)), "tool:c1": raised}
    hooks = RecordingHooks(script)
    with pytest.raises(type(raised)) as caught:
        run(hooks)

    assert caught.value is raised
    assert hooks.trail[len(PREFIX) + 4 :] == [
        "patch:agent:parallel-tools",
        "persist:toolcall:c1",
        "persist:toolcall:c2",
        "persist:toolcall:c3",
        "tool:c1",
        "tool:c2",  # the siblings still ran
        "tool:c3",
    ]
    assert not any(s.startswith("persist:toolexec:") for s in hooks.steps)


def test_the_first_failure_in_call_order_is_the_one_raised() -> None:
    first, second = Suspend("tool:c1"), StepFailedError("tool:c2", "boom")
    script = {**turns(reply("", LOOKUP_42, LOOKUP_7)), "tool:c1": first, "tool:c2": second}
    with pytest.raises(Suspend) as caught:
        run(RecordingHooks(script, reverse_parallel=True))
    assert caught.value is first


def test_settle_captures_control_flow_signals_and_errors() -> None:
    def suspend() -> int:
        raise Suspend("x")

    def fail() -> int:
        raise ValueError("y")

    tasks: list[Callable[[], int]] = [lambda: 1, suspend, fail]
    settled = LoopHooks().parallel(ParallelBlock(tasks))
    assert settled[0].value == 1 and settled[0].error is None
    assert isinstance(settled[1].error, Suspend) and isinstance(settled[2].error, ValueError)
