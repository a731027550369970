"""Run history over HTTP: `GET /v1/runs` (filters, cursor, who sees what, live),
`GET /v1/runs/{run_id}/steps` (the journal with its timings and deciders), the fork preview,
and the role `operator` — with `agent-jobs serve` and a real worker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.doors import cli
from tests.support.serve import Stack, assert_error, events, open_stack
from tests.support.waiting import settled

HISTORY_BROKER_DB = 8


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("history")
    with open_stack(pg_url, redis_url, HISTORY_BROKER_DB, tmp, "serve-history") as made:
        yield made


def tag() -> str:
    """A word no other test's run has: what a test searches its own runs by."""
    return f"mark{uuid.uuid4().hex[:10]}"


def listed(stack: Stack, who: str, **params: Any) -> dict[str, Any]:
    reply = stack.call(who, "GET", "/v1/runs", params=params)
    assert reply.status_code == 200, reply.text
    page: dict[str, Any] = reply.json()
    return page


def ids(page: dict[str, Any]) -> list[str]:
    return [run["run_id"] for run in page["runs"]]


def approved(stack: Stack, actor: str, text: str) -> str:
    """A support run whose refund alice approved, completed."""
    run_id = stack.start(actor, text=text)
    stack.doors.wait_status(run_id, "awaiting_approval")
    [call] = stack.doors.store.pending_calls(run_id)
    reply = stack.call(
        "alice",
        "POST",
        f"/v1/runs/{run_id}/approvals/{call['call_id']}",
        json={"decision": "approve", "reason": "looks right"},
    )
    assert reply.status_code == 200, reply.text
    stack.doors.wait_status(run_id, "completed")
    return run_id


# --- the list ---------------------------------------------------------------------------


def test_the_list_is_newest_first_filtered_and_shows_each_caller_only_what_it_may_read(
    stack: Stack,
) -> None:
    word = tag()
    mine = [stack.start("user-7", agent="chat", text=f"{word} chat {i}") for i in range(3)]
    bobs = stack.start("bob", agent="chat", text=f"{word} bob's")
    parked = stack.start("user-7", text=f"{word} refund it")
    for run_id in [*mine, bobs]:
        stack.doors.wait_status(run_id, "completed")
    stack.doors.wait_status(parked, "awaiting_approval")

    # Newest first; each sees its own; bob never sees user-7's runs.
    assert ids(listed(stack, "user-7", q=word)) == [parked, *reversed(mine)]
    assert ids(listed(stack, "bob", q=word)) == [bobs]
    # A service and an operator read every run; an approver, the runs with its calls.
    everyone = [parked, bobs, *reversed(mine)]
    assert ids(listed(stack, "backend", q=word)) == everyone
    assert ids(listed(stack, "olga", q=word)) == everyone
    assert ids(listed(stack, "alice", q=word)) == [parked]
    assert ids(listed(stack, "eve", q=word)) == []

    # The filters, alone and together; `status` repeats.
    assert ids(listed(stack, "olga", q=word, status="awaiting_approval")) == [parked]
    both = listed(stack, "olga", q=word, status=["awaiting_approval", "completed"])
    assert ids(both) == everyone
    assert ids(listed(stack, "olga", q=word, agent="chat", actor="bob")) == [bobs]
    thread = stack.doors.store.get_run(mine[0]).thread_id
    assert ids(listed(stack, "olga", thread_id=thread)) == [mine[0]]
    assert ids(listed(stack, "olga", q=parked)) == [parked]  # by its id
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert ids(listed(stack, "olga", q=word, since=future)) == []
    assert ids(listed(stack, "olga", q=word, until=future)) == everyone

    row = listed(stack, "user-7", q=word, status="awaiting_approval")["runs"][0]
    assert set(row) >= {
        "run_id",
        "agent",
        "actor",
        "status",
        "thread_id",
        "parent_run_id",
        "created_at",
        "updated_at",
        "input",
        "error",
    }
    assert row["input"] == f"{word} refund it" and row["agent"] == "support"


def test_the_cursor_pages_through_every_run_once_while_runs_are_added(stack: Stack) -> None:
    word = tag()
    first = [stack.start("user-7", agent="chat", text=f"{word} {i}") for i in range(5)]
    page = listed(stack, "user-7", q=word, limit=2)
    seen = ids(page)
    # Runs started between pages go before the first page: later pages neither skip nor
    # repeat a run.
    added = [stack.start("user-7", agent="chat", text=f"{word} later {i}") for i in range(2)]
    while page["next_cursor"] is not None:
        page = listed(stack, "user-7", q=word, limit=2, cursor=page["next_cursor"])
        seen += ids(page)
    assert seen == list(reversed(first))
    assert ids(listed(stack, "user-7", q=word, limit=50))[:2] == list(reversed(added))


def test_a_bad_filter_or_cursor_is_a_typed_422_and_changes_nothing(stack: Stack) -> None:
    before = stack.written()
    for params, says in (
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"status": "sleepy"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"q": "x" * 201}, "q"),
    ):
        reply = stack.call("olga", "GET", "/v1/runs", params=params)
        assert_error(reply, 422, "InvalidRequestError")
        assert says in reply.json()["error"], reply.text
    assert_error(stack.call(None, "GET", "/v1/runs"), 401, "AuthenticationError")
    assert stack.written() == before


def test_the_list_is_live_as_an_event_stream(stack: Stack) -> None:
    word = tag()
    seen: list[list[str]] = []
    started = None
    with stack.stream("user-7", "/v1/runs/stream", params={"q": word}) as reply:
        assert reply.status_code == 200
        for event in events(reply):
            if event.data is None:
                continue
            page = json.loads(event.data)
            seen.append([f"{r['run_id']} {r['status']}" for r in page["runs"]])
            if started is None:
                assert page["runs"] == []  # nothing yet: the first event comes at once
                started = stack.start("user-7", text=f"{word} live")
            elif seen[-1] == [f"{started} awaiting_approval"]:
                cancelled = stack.call("user-7", "POST", f"/v1/runs/{started}/cancel")
                assert cancelled.status_code == 202, cancelled.text
            elif seen[-1] == [f"{started} cancelled"]:
                break
    # It appeared, then changed status, each time without being asked again.
    assert seen[0] == [] and f"{started} awaiting_approval" in seen[-2]


# --- a run's steps ------------------------------------------------------------------------


def test_the_steps_say_what_ran_in_order_how_long_it_took_and_who_decided(stack: Stack) -> None:
    run_id = approved(stack, "user-7", f"{tag()} refund it")
    reply = stack.call("user-7", "GET", f"/v1/runs/{run_id}/steps")
    assert reply.status_code == 200, reply.text
    steps = reply.json()["steps"]
    assert [s["seq"] for s in steps] == sorted(s["seq"] for s in steps)
    by_name = {s["step"]: s for s in steps}
    kinds = {s["kind"] for s in steps}
    assert {"local", "model", "tool", "approval"} <= kinds
    assert kinds <= {"local", "model", "tool", "approval", "answers", "child", "timer"}
    [approval] = [s for s in steps if s["kind"] == "approval"]
    assert approval["decided_by"] == "alice" and approval["state"] == "done"
    assert approval["reason"] == "looks right"
    [tool] = [s for s in steps if s["kind"] == "tool"]
    assert tool["tool"] == "refund" and tool["effect"] == "action"
    assert tool["intent"] == {
        "call_id": tool["call_id"],
        "tool": "refund",
        "args": {
            "order_id": "42",
            "amount": 5,
            "note": by_name["persist:user"]["intent"]["content"],
        },
    }
    assert tool["result"]["ok"] is True
    for step in steps:
        assert set(step) >= {
            "step",
            "seq",
            "kind",
            "state",
            "attempts",
            "started_at",
            "finished_at",
            "duration_ms",
            "intent",
            "result",
            "error",
            "decided_by",
            "worker",
        }
        assert step["duration_ms"] is not None and step["duration_ms"] >= 0
        started = datetime.fromisoformat(step["started_at"])
        assert started <= datetime.fromisoformat(step["finished_at"])
    # The approval waited for alice: the longest wait of the run, from request to decision.
    assert approval["duration_ms"] == max(s["duration_ms"] for s in steps)
    # The worker that ran each remote step is named; the model's request shows its messages.
    model = by_name["model:1"]
    assert model["worker"] and tool["worker"]
    assert model["intent"]["messages"][-1]["role"] == "user"
    assert "type" not in model["intent"] and "request" not in model["intent"]

    # Someone who may not read the run learns nothing of it.
    assert_error(stack.call("bob", "GET", f"/v1/runs/{run_id}/steps"), 404, "UnknownRunError")
    assert_error(stack.call("eve", "GET", "/v1/runs/nope/steps"), 404, "UnknownRunError")


def test_the_cli_journal_shows_durations_and_deciders_and_runs_takes_the_filters(
    stack: Stack,
) -> None:
    word = tag()
    run_id = approved(stack, "user-7", f"{word} refund it")
    shown = cli("journal", run_id, env=stack.doors.env)
    assert shown.returncode == 0, shown.stderr
    head, *rows = shown.stdout.splitlines()
    assert head.split()[:7] == ["seq", "step", "kind", "state", "attempts", "took", "by"]
    [line] = [row for row in rows if row.split()[1:2] and row.split()[1].startswith("approval:")]
    assert line.split()[2:4] == ["approval", "done"] and "alice" in line.split()
    assert line.split()[-2] in ("ms", "s", "min") or line.split()[-1] == "alice"

    listed_ = cli(
        "runs", "--search", word, "--status", "completed", "--agent", "support", env=stack.doors.env
    )
    assert listed_.returncode == 0, listed_.stderr
    assert run_id in listed_.stdout
    none = cli("runs", "--search", word, "--status", "failed", env=stack.doors.env)
    assert none.returncode == 0 and "no runs match" in none.stdout


# --- a run's page and the operator -------------------------------------------------------


def test_a_run_says_what_the_caller_may_do_with_it(stack: Stack) -> None:
    run_id = stack.start("user-7", text=f"{tag()} refund it")
    stack.doors.wait_status(run_id, "awaiting_approval")

    def doc(actor: str) -> dict[str, Any]:
        reply = stack.call(actor, "GET", f"/v1/runs/{run_id}")
        assert reply.status_code == 200, reply.text
        found: dict[str, Any] = reply.json()
        return found

    def may(actor: str) -> dict[str, Any]:
        reply = stack.call(actor, "GET", f"/v1/runs/{run_id}/may")
        assert reply.status_code == 200, reply.text
        found: dict[str, Any] = reply.json()
        return found

    [pending] = doc("user-7")["pending_calls"]
    assert len(pending["args_sha256"]) == 64
    call = pending["call_id"]
    assert may("user-7") == {
        "controls": ["cancel", "pause", "fork", "message"],
        "decide": [],
        "reconcile": [],
    }
    assert may("olga") == {"controls": ["cancel", "pause", "fork"], "decide": [], "reconcile": []}
    assert may("alice") == {"controls": [], "decide": [call], "reconcile": []}
    assert_error(stack.call("bob", "GET", f"/v1/runs/{run_id}/may"), 404, "UnknownRunError")

    # The operator controls it but decides nothing and does not steer it.
    refused = stack.call(
        "olga", "POST", f"/v1/runs/{run_id}/approvals/{call}", json={"decision": "approve"}
    )
    assert "may not decide" in assert_error(refused, 403, "PermissionDeniedError")
    said = stack.call("olga", "POST", f"/v1/runs/{run_id}/messages", json={"text": "hi"})
    assert "may post to it" in assert_error(said, 403, "PermissionDeniedError")
    paused = stack.call("olga", "POST", f"/v1/runs/{run_id}/pause")
    assert paused.status_code == 202, paused.text
    assert "pause" not in may("olga")["controls"]  # asked for: not twice
    decided = stack.call(
        "alice",
        "POST",
        f"/v1/runs/{run_id}/approvals/{call}",
        json={"decision": "approve", "reason": "fine"},
    )
    assert decided.status_code == 200, decided.text
    stack.doors.wait_status(run_id, "paused")
    assert may("olga")["controls"] == ["cancel", "resume", "fork"]
    assert stack.call("olga", "POST", f"/v1/runs/{run_id}/resume").status_code == 202
    stack.doors.wait_status(run_id, "completed")
    assert may("olga")["controls"] == ["fork"] and may("user-7")["controls"] == ["fork"]
    [decision] = doc("user-7")["decisions"]
    assert decision["decided_by"] == "alice" and decision["reason"] == "fine"
    assert decision["decision"] == "approve" and decision["decided_at"]
    assert doc("user-7")["unknown_calls"] == []


def test_the_fork_preview_names_what_would_run_again_and_writes_nothing(stack: Stack) -> None:
    run_id = approved(stack, "user-7", f"{tag()} refund it")
    steps = stack.call("user-7", "GET", f"/v1/runs/{run_id}/steps").json()["steps"]
    [model] = [s["step"] for s in steps if s["step"] == "model:1"]
    before = stack.written()
    reply = stack.call("olga", "GET", f"/v1/runs/{run_id}/fork", params={"at": model})
    assert reply.status_code == 200, reply.text
    preview = reply.json()
    assert [a["tool"] for a in preview["runs_again"]] == ["refund"]
    assert [a["tool"] for a in preview["asked_again"]] == ["refund"]
    assert stack.written() == before
    assert_error(
        stack.call("olga", "GET", f"/v1/runs/{run_id}/fork", params={"at": "no:such"}),
        422,
        "InvalidRequestError",
    )
    assert_error(
        stack.call("bob", "GET", f"/v1/runs/{run_id}/fork", params={"at": model}),
        404,
        "UnknownRunError",
    )
    assert settled(stack.written, what="the runs and threads") == before


# --- a sleeping run ----------------------------------------------------------------------


def test_a_sleeping_run_shows_its_wake_time_everywhere_and_a_message_wakes_it(
    stack: Stack,
) -> None:
    word = tag()
    run_id = stack.start("user-7", agent="sleeper", text=json.dumps({"seconds": 3600}))
    stack.doors.wait_status(run_id, "sleeping")

    doc = stack.call("user-7", "GET", f"/v1/runs/{run_id}").json()
    assert doc["status"] == "sleeping" and doc["wake_at"]
    wake_at = datetime.fromisoformat(doc["wake_at"])
    assert doc["waiting_on"].startswith("sleeping until ")
    # The list's `sleeping` filter has it (the tag is not in its input: look by its id).
    assert ids(listed(stack, "olga", q=run_id, status="sleeping")) == [run_id]
    assert ids(listed(stack, "olga", q=run_id, status="completed")) == []
    row = listed(stack, "user-7", q=run_id)["runs"][0]
    assert row["status"] == "sleeping" and row["waiting_on"] == doc["waiting_on"]
    # The journal holds the sleep as a `timer` step, waiting, with its wake time.
    steps = stack.call("user-7", "GET", f"/v1/runs/{run_id}/steps").json()["steps"]
    [timer] = [s for s in steps if s["kind"] == "timer"]
    assert timer["state"] == "waiting"
    assert datetime.fromisoformat(timer["intent"]["wake_at"]) == wake_at
    # Its live stream has the `timer` frame, with the call and the wake time.
    with stack.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
        frame = next(
            e.frame for e in events(reply) if e.data is not None and e.frame["type"] == "timer"
        )
    assert frame["call_id"] == timer["call_id"] and frame["run_id"] == run_id
    assert datetime.fromisoformat(frame["wake_at"]) == wake_at

    # A message wakes it long before its time; it reads the message and completes.
    said = stack.call(
        "user-7", "POST", f"/v1/runs/{run_id}/messages", json={"text": f"{word} green"}
    )
    assert said.status_code == 202, said.text
    done = stack.doors.wait_status(run_id, "completed")
    assert json.loads(done.output or "")["messages"] == [f"{word} green"]
    after = stack.call("user-7", "GET", f"/v1/runs/{run_id}").json()
    assert after["status"] == "completed" and after["wake_at"] is None
    steps = stack.call("user-7", "GET", f"/v1/runs/{run_id}/steps").json()["steps"]
    [timer] = [s for s in steps if s["kind"] == "timer"]
    assert timer["state"] == "done" and timer["result"]["woke"] == "message"
    assert datetime.fromisoformat(timer["result"]["at"]) < wake_at
