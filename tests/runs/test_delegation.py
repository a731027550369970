"""Delegation to other agents, questions to a person, personas — in both runners."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs.errors import DecisionRefusedError
from tests.support.apps import executed
from tests.support.harness import Harness
from tests.support.waiting import eventually


def test_three_levels_with_an_approval_in_the_grandchild(harness: Harness) -> None:
    root = harness.start("boss", "sort out order 42")
    request = harness.wait_frame(root, "approval_request")  # from the top-level stream
    clerk = request["run_id"]
    assert clerk != root and request["tool"] == "refund"
    parked = harness.store.get_run(clerk)
    assert parked.status == "awaiting_approval" and parked.depth == 2
    manager = harness.store.get_run(parked.parent_run_id or "")
    assert manager.agent == "manager" and manager.depth == 1 and manager.parent_run_id == root
    assert {clerk, manager.run_id} <= {r.run_id for r in harness.store.list_runs()}

    assert harness.decide(clerk, request["call_id"], "approve", "alice")
    run = harness.wait(root)

    assert run.status == "completed" and run.output == "boss: all handled"
    assert harness.store.get_run(clerk).output == "clerk: refunded 42"
    assert executed(clerk).count(("refund", f"{clerk}:tool:call_1")) == 1
    boss_thread = harness.store.thread_messages(run.thread_id)
    assert ("tool", "manager: clerk did it") in [(m.role, m.content) for m in boss_thread]
    # The children's usage rolls up into the parent's totals, and the actor's quota.
    assert harness.store.totals(root)["model_calls"] == 6
    total = harness.store.totals(root)
    assert harness.store.tokens_used("user-7", run.day) == (
        total["input_tokens"] + total["output_tokens"]
    )
    # The children's frames are in the top-level stream, tagged with their run ids.
    frames = harness.frames(root)
    assert {f["run_id"] for f in frames} == {root, manager.run_id, clerk}
    assert frames[-1] == {"type": "done", "run_id": root, "output": "boss: all handled"}


def test_delegation_beyond_the_depth_budget_is_refused(harness: Harness) -> None:
    run = harness.wait(harness.start("recurse", "go deep"))
    assert run.status == "completed" and run.output == "stopped"
    chain = sorted(
        (r for r in harness.store.list_runs(limit=50) if r.agent == "recurse"),
        key=lambda r: r.depth,
    )
    assert [r.depth for r in chain] == [0, 1, 2, 3]
    refused = harness.store.tool_calls(chain[-1].run_id)[0]
    assert refused["status"] == "failed" and "the budget is 3" in refused["error"]


def test_cancelling_the_parent_cancels_the_children(harness: Harness) -> None:
    root = harness.start("boss", "sort out order 42")
    request = harness.wait_frame(root, "approval_request")
    clerk = request["run_id"]
    harness.cancel(root)
    assert harness.wait(root).status == "cancelled"
    assert harness.wait(clerk).status == "cancelled"
    assert harness.store.get_run(clerk).cancel_cause == "parent"
    assert "refund" not in [what for what, _ in executed(clerk)]


def test_a_question_is_asked_and_answered(harness: Harness) -> None:
    run_id = harness.start("planner", "set up a call")
    question = harness.wait_frame(run_id, "question")
    assert question["questions"] == [{"id": "q1", "question": "Which day suits you?"}]
    parked = harness.store.get_run(run_id)
    assert parked.status == "awaiting_answers"
    [open_question] = harness.store.open_questions(run_id)
    assert open_question["request_id"] == question["request_id"]
    assert parked.waiting_on == f"awaiting_answers schedule {question['request_id']}"
    too_long = {"q1": "F" * 10_001}  # an answer has a bound, as a decision's reason has
    with pytest.raises(DecisionRefusedError, match="at most 10000 characters"):
        harness.client.answer(run_id, question["request_id"], too_long, actor="bob")
    assert harness.store.open_questions(run_id) == [open_question]
    answered = harness.client.answer(run_id, question["request_id"], {"q1": "Friday"}, actor="bob")
    assert answered
    assert not harness.client.answer(run_id, question["request_id"], {"q1": "Monday"}, actor="x")
    run = harness.wait(run_id)
    assert run.status == "completed" and run.output == "planned"
    [record] = harness.store.tool_calls(run_id)
    assert record["result"] == "a call booked for Friday"
    assert [what for what, _ in executed(run_id)].count("schedule") == 1


def test_two_reads_of_one_turn_that_both_ask_wait_for_both_answers(harness: Harness) -> None:
    run_id = harness.start("planner2", "set up a call and a visit")
    answered: set[str] = set()
    days = iter(["Friday", "Monday"])

    def answer_both() -> bool:
        # Looked at before answering: once both are answered the run may end at once.
        run = harness.store.get_run(run_id)
        assert not run.finished, f"{run.status}: {run.error}"
        for asked in harness.store.open_questions(run_id):
            if asked["request_id"] not in answered:
                day = next(days)
                assert harness.client.answer(run_id, asked["request_id"], {"q1": day}, actor="bob")
                answered.add(asked["request_id"])
        return len(answered) == 2

    eventually(
        answer_both,
        what="both questions to be asked and answered",
        every=0.05,
        context=lambda: (answered, harness.store.get_run(run_id).status),
    )
    run = harness.wait(run_id)
    assert run.status == "completed", run.error
    assert run.output == "planned both"
    results = sorted(str(c["result"]) for c in harness.store.tool_calls(run_id))
    assert results == ["a call booked for Friday", "a visit booked for Monday"] or results == [
        "a call booked for Monday",
        "a visit booked for Friday",
    ]
    assert [what for what, _ in executed(run_id)].count("schedule") == 2


def test_a_persona_wraps_the_prompt_and_narrows_the_tools(harness: Harness) -> None:
    run_id = harness.start("support", "hello", persona="pirate")

    def steps() -> dict[str, Any] | None:
        found = {j["step"]: j for j in harness.store.journal(run_id)}
        return found if "model:1" in found else None

    request = eventually(steps, what="the journal to hold model:1", every=0.05)["model:1"]
    request = request["intent"]["request"]
    assert request["system"] == "Arr, matey.\nYou are support."
    assert [t["name"] for t in request["tools"]] == ["lookup"]
    harness.cancel(run_id)
    harness.wait(run_id)


# --- a bounded history ------------------------------------------------------------------------


def _turns(harness: Harness, agent: str, texts: list[str]) -> list[str]:
    thread: str | None = None
    ids = []
    for text in texts:
        run = harness.wait(harness.start(agent, text, thread_id=thread))
        assert run.status == "completed", run.error
        thread = run.thread_id
        ids.append(run.run_id)
    return ids


def test_the_window_bounds_the_read_and_the_request(harness: Harness) -> None:
    first, _, third = _turns(harness, "windowed", ["one", "two", "three"])
    journal = {j["step"]: j for j in harness.store.journal(third)}
    loaded = journal["load:thread"]["result"]["messages"]
    assert [m["content"] for m in loaded] == ["windowed answer", "two", "windowed answer", "three"]
    assert journal["load:thread"]["intent"]["message_limit"] == 4  # bounded by the database
    sent = [m["content"] for m in journal["model:1"]["intent"]["request"]["messages"]]
    assert sent == ["windowed answer", "two", "windowed answer", "three"]
    assert journal["load:thread"]["result"]["answered"] is True  # asked of the whole thread
    assert "patch:agent:history-select" in journal or harness.kind == "inline"
    assert harness.store.thread_title(harness.store.get_run(first).thread_id) == "one"


def test_what_the_window_drops_is_summarised_once(harness: Harness) -> None:
    _, second = _turns(harness, "summarized", ["one", "two"])
    journal = {j["step"]: j for j in harness.store.journal(second)}
    assert journal["load:thread"]["intent"]["message_limit"] is None  # a summary needs it all
    sent = journal["model:1"]["intent"]["request"]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].endswith("they talked about orders")
    assert [m["content"] for m in sent[1:]] == ["summarized answer", "two"]
    kinds = [(u["kind"], u["step"]) for u in harness.store.usage(second)]
    assert kinds == [("summary", "history:summarize"), ("model", "model:1")]
    assert [what for what, _ in executed(second)].count("summary") == 1
