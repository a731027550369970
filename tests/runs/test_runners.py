"""The same scripted scenarios on both runners: same threads, records and answers."""

from __future__ import annotations

from typing import Any

from agent_jobs import RunView
from tests.support.apps import executed
from tests.support.harness import Harness


def conversation(h: Harness, run: RunView) -> list[tuple[Any, ...]]:
    return [
        (m.role, m.content, [c.id for c in m.tool_calls], m.tool_call_id, m.is_error)
        for m in h.store.thread_messages(run.thread_id)
    ]


def records(h: Harness, run: RunView) -> list[tuple[Any, ...]]:
    return [
        (c["call_id"], c["name"], c["kind"], c["status"], c["decision"], c["result"], c["error"])
        for c in h.store.tool_calls(run.run_id)
    ]


def test_support_scenario_gives_the_same_thread_records_and_answer(harness: Harness) -> None:
    h = harness
    run = h.run_approving("support", "Where is order 42?")

    assert run.status == "completed", run.error
    assert run.output == "Order 42 was refunded."
    assert h.store.thread_title(run.thread_id) == "Where is order 42?"
    assert conversation(h, run) == [
        ("user", "Where is order 42?", [], None, False),
        ("assistant", "Checking. ", ["call_1", "call_2"], None, False),
        ("tool", '{"order_id":"42","status":"lost"}', [], "call_1", False),
        ("tool", '{"order_id":"7","status":"shipped"}', [], "call_2", False),
        ("assistant", "Refunding. ", ["call_3"], None, False),
        ("tool", '{"order_id":"42","refunded":5.0}', [], "call_3", False),
        ("assistant", "Order 42 was refunded.", [], None, False),
    ]
    assert records(h, run) == [
        ("call_1", "lookup", "read", "executed", None, {"order_id": "42", "status": "lost"}, None),
        (
            "call_2",
            "lookup",
            "read",
            "executed",
            None,
            {"order_id": "7", "status": "shipped"},
            None,
        ),
        (
            "call_3",
            "refund",
            "action",
            "executed",
            "approve",
            {"order_id": "42", "refunded": 5.0},
            None,
        ),
    ]
    assert [what for what, _ in executed(run.run_id)].count("model") == 3
    assert sorted(executed(run.run_id))[-1] == ("refund", f"{run.run_id}:tool:call_3")
    usage = h.store.totals(run.run_id)
    assert usage["model_calls"] == 3 and usage["input_tokens"] > 0
    frames = h.frames(run.run_id)
    kinds = [f["type"] for f in frames]
    assert kinds[-1] == "done" and frames[-1]["output"] == "Order 42 was refunded."
    assert kinds.count("approval_request") == 1 and kinds.count("tool_result") == 3
    approval = next(f for f in frames if f["type"] == "approval_request")
    assert approval["call_id"] == "call_3" and approval["args"] == {"order_id": "42", "amount": 5}
    assert "".join(f["text"] for f in frames if f["type"] == "text_delta") == (
        "Checking. Refunding. Order 42 was refunded."
    )


def test_a_rejection_reaches_the_model_in_both_runners(harness: Harness) -> None:
    run = harness.run_approving("support", "Where is order 42?", decision="reject")
    assert run.status == "completed"
    assert ("refund", f"{run.run_id}:tool:call_3") not in executed(run.run_id)
    rejected = conversation(harness, run)[5]
    assert rejected[0] == "tool" and '"rejected":true' in rejected[1] and rejected[4] is True
    assert records(harness, run)[2][3:5] == ("rejected", "reject")


def test_a_failing_read_is_a_tool_error_and_its_siblings_are_kept(harness: Harness) -> None:
    run_id = harness.start("mixed", "go")
    run = harness.wait(run_id)
    assert run.status == "completed" and run.output == "Done with what I could."
    calls = records(harness, run)
    assert [(c[0], c[3]) for c in calls] == [
        ("call_1", "executed"),
        ("call_2", "failed"),
        ("call_3", "executed"),
        ("call_4", "failed"),
    ]
    assert calls[1][6] == "RuntimeError: kaput"
    assert "order_id" in calls[3][6]  # the bad arguments, refused inside persist:toolcall
    tools = [row for row in conversation(harness, run) if row[0] == "tool"]
    assert [t[3] for t in tools] == ["call_1", "call_2", "call_3", "call_4"]
    # Every read ran exactly once; the failing one was not retried into a second run.
    ran = [what for what, _ in executed(run_id) if what != "model"]
    assert sorted(ran) == ["boom", "lookup", "lookup"]


def test_eight_reads_of_a_turn_run_at_once(harness: Harness) -> None:
    # Each read waits until all eight have started: the run ends only if they overlapped
    # (one after another, the first read would wait for good).
    run = harness.wait(harness.start("fanout8", "go"))
    assert run.status == "completed" and run.output == "eight done", run.error
    tools = [row for row in conversation(harness, run) if row[0] == "tool"]
    assert [t[1] for t in tools] == [str(i * 10) for i in range(8)]
    # Every read started before any of them ended, each once.
    ran = [what for what, _ in executed(run.run_id) if what != "model"]
    assert ran[:8] == ["together:start"] * 8 and ran[8:] == ["together"] * 8
