"""A fork inherits no decision: a decision is about one call of one run. Every `action`
call that runs again in a fork is asked again (its own pending entry, frames and
deadline), unless the one who forks may make that decision and keeps it, as their own.
On both runners (in this process, and on real workers for the durable one)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from agent_jobs.controls import Again
from agent_jobs.errors import DecisionRefusedError
from tests.support.apps import counted
from tests.support.harness import Harness
from tests.support.waiting import eventually

REFUND = "call_3"  # the `support` agent's refund: after two reads, in its second turn


def call_of(h: Harness, run_id: str, call_id: str) -> dict[str, Any]:
    [call] = [c for c in h.store.tool_calls(run_id) if c["call_id"] == call_id]
    return call


def unchanged(h: Harness, run_id: str) -> tuple[Any, ...]:
    """What a refused fork could have written: runs, the source's journal and calls."""
    return (
        sorted(r.run_id for r in h.store.list_runs(limit=1000)),
        h.store.journal(run_id),
        h.store.tool_calls(run_id),
    )


def test_a_fork_by_the_runs_own_actor_asks_the_approver_again_each_time(
    harness: Harness,
) -> None:
    source = harness.run_approving("support", "refund order 42")
    assert source.status == "completed" and counted(source.run_id, "refund") == 1

    # The run's actor (role support, no approver) forks at the approved refund three times.
    forks = [harness.fork(source.run_id, f"tool:{REFUND}", actor="user-7") for _ in range(3)]
    for forked in forks:
        assert forked.runs_again == [Again(f"tool:{REFUND}", "refund", REFUND)]
        assert forked.asked_again == [Again(f"approval:{REFUND}", "refund", REFUND)]
        assert forked.kept_decisions == []
        asked = harness.wait_frame(forked.run_id, "approval_request")
        assert asked["call_id"] == REFUND and asked["tool"] == "refund"
        harness.wait_status(forked.run_id, "awaiting_approval")
        [pending] = harness.store.pending_calls(forked.run_id)
        assert pending["call_id"] == REFUND and pending["decided_by"] is None
        assert pending["requested_at"] is not None
    assert [counted(f.run_id, "refund") for f in forks] == [0, 0, 0]

    # Each fork's call is decided on its own, by the lead.
    assert harness.decide(forks[0].run_id, REFUND, "approve", "alice")
    assert harness.decide(forks[1].run_id, REFUND, "reject", "alice")
    harness.cancel(forks[2].run_id)
    assert [harness.wait(f.run_id).status for f in forks] == [
        "completed",
        "completed",
        "cancelled",
    ]
    ran = [counted(run_id, "refund") for run_id in [source.run_id, *(f.run_id for f in forks)]]
    assert ran == [1, 1, 0, 0]  # one refund for each approval, no more
    approved, rejected = (call_of(harness, f.run_id, REFUND) for f in forks[:2])
    assert (approved["status"], approved["decided_by"]) == ("executed", "alice")
    assert (rejected["status"], rejected["decided_by"]) == ("rejected", "alice")
    assert approved["decided_at"] > call_of(harness, source.run_id, REFUND)["decided_at"]


def test_a_decision_is_kept_only_by_one_who_may_make_it_and_then_as_theirs(
    harness: Harness,
) -> None:
    source = harness.run_approving("support", "refund order 42").run_id
    before = unchanged(harness, source)
    with pytest.raises(DecisionRefusedError, match="needs one of the roles lead"):
        harness.fork(source, f"tool:{REFUND}", actor="user-7", keep_decisions=True)
    assert unchanged(harness, source) == before  # the refusal wrote nothing

    forked = harness.fork(source, f"tool:{REFUND}", actor="alice", keep_decisions=True)
    assert forked.kept_decisions == [Again(f"approval:{REFUND}", "refund", REFUND)]
    assert forked.asked_again == []
    run = harness.wait(forked.run_id)
    assert run.status == "completed" and counted(forked.run_id, "refund") == 1
    assert "approval_request" not in [f["type"] for f in harness.frames(forked.run_id)]
    call = call_of(harness, forked.run_id, REFUND)
    assert call["decided_by"] == "alice" and call["status"] == "executed"
    assert call["decision_reason"] == (f"kept when forking run {source} (decided there by alice)")
    [row] = [r for r in harness.store.journal(forked.run_id) if r["step"] == f"approval:{REFUND}"]
    assert row["result"]["actor"] == "alice" and row["result"]["reason"] == call["decision_reason"]


def test_a_forked_call_has_its_own_deadline_and_escalation(harness: Harness) -> None:
    source = harness.start("escalating", "refund 42")
    call_id = harness.wait_frame(source, "approval_request")["call_id"]
    eventually(
        lambda: call_of(harness, source, call_id)["escalated"],
        what="the source's call to be escalated at its deadline",
    )
    assert harness.decide(source, call_id, "approve", "mia")  # a manager, once escalated
    assert harness.wait(source).status == "completed"
    decided_at = call_of(harness, source, call_id)["decided_at"]

    # The lead may not keep a decision that had gone to the managers.
    with pytest.raises(DecisionRefusedError, match="needs one of the roles manager"):
        harness.fork(source, f"tool:{call_id}", actor="alice", keep_decisions=True)
    forked = harness.fork(source, f"tool:{call_id}", actor="user-7").run_id
    asked = harness.wait_frame(forked, "approval_request")
    assert "escalated" not in asked  # asked of the tool's approvers again, not the managers
    assert datetime.fromisoformat(asked["deadline"]) > decided_at  # a deadline of its own
    eventually(
        lambda: call_of(harness, forked, call_id)["escalated"],
        what="the fork's call to be escalated at its own deadline",
    )
    assert counted(forked, "refund_escalated") == 0
    assert harness.decide(forked, call_id, "approve", "mia")
    assert harness.wait(forked).status == "completed"
    assert counted(forked, "refund_escalated") == 1
    assert call_of(harness, forked, call_id)["decided_by"] == "mia"
