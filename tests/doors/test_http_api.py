"""The HTTP API as a client meets it: `agent-jobs serve` with a real worker, over HTTP.

Every refusal is checked for its status, its `{"error", "type"}` body, and for having
changed nothing in the database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import pytest

from tests.support.apps import executed
from tests.support.apps.http import ANSWER
from tests.support.doors import cli
from tests.support.serve import TOKENS, Stack, assert_error, open_stack
from tests.support.waiting import settled

HTTP_BROKER_DB = 12
MARKUP = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("http")
    with open_stack(pg_url, redis_url, HTTP_BROKER_DB, tmp, "serve-api") as made:
        yield made


def parked(stack: Stack, actor: str = "user-7", text: str = "refund it") -> tuple[str, str]:
    """A support run waiting for a lead's decision on its refund: (run id, call id)."""
    run_id = stack.start(actor, text=text)
    stack.doors.wait_status(run_id, "awaiting_approval")
    [call] = stack.doors.store.pending_calls(run_id)
    return run_id, str(call["call_id"])


# --- the service and the tokens ---------------------------------------------------------------


def test_healthz_needs_no_token_and_the_openapi_document_needs_one(stack: Stack) -> None:
    health = stack.call(None, "GET", "/healthz")
    assert health.status_code == 200 and health.json() == {"ok": True}

    assert_error(stack.call(None, "GET", "/openapi.json"), 401, "AuthenticationError")
    document = stack.call("eve", "GET", "/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/stream",
        "/v1/approvals",
        "/v1/approvals/stream",
        "/v1/runs/{run_id}/approvals/{call_id}",
        "/v1/runs/{run_id}/answers/{request_id}",
        "/v1/runs/{run_id}/messages",
        "/v1/runs/{run_id}/cancel",
        "/healthz",
        "/openapi.json",
    } <= set(document["paths"])
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    started = document["paths"]["/v1/runs"]["post"]
    assert {"201", "200", "401", "403", "422"} <= set(started["responses"])
    me = stack.call("backend", "GET", "/v1/me").json()
    assert me == {"actor": "backend", "roles": ["service"]}


ROUTES = [
    ("GET", "/v1/me"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs/r1"),
    ("GET", "/v1/runs/r1/stream"),
    ("GET", "/v1/approvals"),
    ("GET", "/v1/approvals/stream"),
    ("POST", "/v1/runs/r1/approvals/call_1"),
    ("POST", "/v1/runs/r1/answers/q"),
    ("POST", "/v1/runs/r1/messages"),
    ("POST", "/v1/runs/r1/cancel"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/no-such-route"),
]


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        f"Basic {TOKENS['alice']}",
        "Bearer not-a-token",
        f"bearer {TOKENS['alice']}x",
    ],
    # The tokens are made per process: ids that name them differ between xdist's workers.
    ids=["none", "no-token", "basic-scheme", "unknown-token", "token-with-a-tail"],
)
def test_every_route_but_healthz_refuses_a_missing_or_unknown_token(
    stack: Stack, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    for method, path in ROUTES:
        reply = stack.call(None, method, path, headers=headers, json={})
        assert_error(reply, 401, "AuthenticationError")
        assert reply.headers["www-authenticate"] == "Bearer"
    # The scheme's name is not case-sensitive; the token is.
    mixed_case = {"Authorization": f"bEaReR {TOKENS['eve']}"}
    assert stack.call(None, "GET", "/v1/me", headers=mixed_case).status_code == 200


def test_unknown_routes_methods_and_oversized_bodies_answer_in_the_error_shape(
    stack: Stack,
) -> None:
    assert_error(stack.call("eve", "GET", "/v1/no-such-route"), 404, "NotFoundError")
    assert_error(stack.call("eve", "GET", "/metrics"), 404, "NotFoundError")  # metrics off
    assert_error(stack.call("eve", "DELETE", "/v1/approvals"), 405, "MethodNotAllowedError")
    before = stack.written()
    huge = {"agent": "chat", "input": "x" * (9 * 1024 * 1024)}
    assert_error(stack.call("user-7", "POST", "/v1/runs", json=huge), 413, "PayloadTooLargeError")
    chunks = iter([b'{"agent": "chat", ', b'"input": "in chunks"}'])  # no Content-Length
    chunked = stack.call("user-7", "POST", "/v1/runs", content=chunks)
    assert_error(chunked, 411, "LengthRequiredError")
    assert stack.written() == before


def post_head(path: str, actor: str | None, **headers: str) -> bytes:
    """The head of a POST as bytes, with the headers given (underscores as dashes)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if actor is not None:
        lines.append(f"Authorization: Bearer {TOKENS[actor]}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_body_is_not_read_before_its_token_is_checked(stack: Stack) -> None:
    """Without a token the answer is 401 before a byte of the body is read: the server
    neither waits for the body nor holds it."""
    size = 7 * 1024 * 1024  # under the body limit
    head = post_head("/v1/runs", None, Content_Length=str(size))
    status, said = stack.api.raw(head)  # the body is never sent: no wait for it
    assert status == 401 and json.loads(said)["type"] == "AuthenticationError"

    before = stack.written()
    baseline = stack.api.peak_memory(reset=True)
    body = json.dumps({"agent": "chat", "input": "x", "metadata": {"pad": "y" * size}})
    head = post_head("/v1/runs", None, Content_Length=str(len(body)))
    with suppress(OSError):  # the server answers and closes while the body is sent
        stack.api.raw(head, body.encode())
    grown = stack.api.peak_memory() - baseline
    assert grown < len(body) / 4, f"serve grew by {grown} bytes for a {len(body)}-byte body"
    assert stack.written() == before


def test_a_body_with_both_a_length_and_chunks_is_refused_unread(stack: Stack) -> None:
    """`Content-Length: 5` beside chunks once let an unbounded chunked body through."""
    before = stack.written()
    head = post_head("/v1/runs", "user-7", Content_Length="5", Transfer_Encoding="chunked")
    status, said = stack.api.raw(head)
    assert status == 400 and "not in chunks as well" in json.loads(said)["error"]
    assert stack.written() == before


def test_a_body_holds_a_bounded_number_of_values_and_depth(stack: Stack) -> None:
    before = stack.written()
    baseline = stack.api.peak_memory(reset=True)
    many = {"agent": "chat", "input": "x", "metadata": {f"k{n}": 0 for n in range(200_000)}}
    reply = stack.call("user-7", "POST", "/v1/runs", json=many)
    assert "more than 10000 JSON values" in assert_error(reply, 413, "PayloadTooLargeError")
    size = len(json.dumps(many))
    grown = stack.api.peak_memory() - baseline
    assert grown < 4 * size, f"serve grew by {grown} bytes for a {size}-byte body"
    deep: Any = "bottom"
    for _ in range(40):
        deep = [deep]
    reply = stack.call(
        "user-7", "POST", "/v1/runs", json={"agent": "chat", "input": "x", "metadata": {"d": deep}}
    )
    assert "nests deeper than 32" in assert_error(reply, 413, "PayloadTooLargeError")
    assert stack.written() == before
    # The largest input a run may have, all of it escaped in JSON, is still taken.
    largest = {"agent": "chat", "input": "\u2603" * 1_000_000}
    reply = stack.call("user-7", "POST", "/v1/runs", json=largest)
    assert reply.status_code == 201, reply.text


def test_a_nul_in_a_run_or_a_message_is_refused_naming_the_field(stack: Stack) -> None:
    """A NUL (U+0000) was a 500 on Postgres, and the log then held the statement with the
    request's data as its parameters."""
    canary = "nul-canary-" + TOKENS["eve"][-8:]
    run_id, _ = parked(stack)
    before = stack.written()
    for body, field in [
        ({"input": f"{canary}\u0000"}, "input"),
        ({"input": "x", "metadata": {f"{canary}\u0000": 1}}, "metadata"),
        ({"input": "x", "metadata": {"k": [f"{canary}\u0000"]}}, "metadata"),
    ]:
        reply = stack.call("user-7", "POST", "/v1/runs", json={"agent": "chat", **body})
        said = assert_error(reply, 422, "InvalidRequestError")
        assert f"{field}: " in said and "NUL" in said
    message = {"text": f"{canary}\u0000"}
    reply = stack.call("user-7", "POST", f"/v1/runs/{run_id}/messages", json=message)
    assert "NUL" in assert_error(reply, 422, "InvalidRequestError")
    assert stack.written() == before
    assert canary not in stack.api.proc.log_path.read_text(errors="replace")
    stack.call("user-7", "POST", f"/v1/runs/{run_id}/cancel", json={})


# --- starting runs ----------------------------------------------------------------------------


def test_the_same_run_id_starts_one_run(stack: Stack) -> None:
    body = {"agent": "chat", "input": "hello", "run_id": "http-idem-1", "metadata": {"ticket": 7}}
    first = stack.call("user-7", "POST", "/v1/runs", json=body)
    assert first.status_code == 201 and first.json() == {
        "run_id": "http-idem-1",
        "status": "queued",
    }
    stack.doors.wait_status("http-idem-1", "completed")

    again = stack.call("user-7", "POST", "/v1/runs", json={**body, "input": "hello again"})
    assert again.status_code == 200
    assert again.json() == {"run_id": "http-idem-1", "status": "completed"}
    run = stack.doors.store.get_run("http-idem-1")
    assert (run.input, run.actor, run.metadata) == ("hello", "user-7", {"ticket": 7})
    assert len(stack.doors.store.list_runs(thread_id="http-idem-1")) == 1
    # Another actor's run id is not theirs to see: it is taken, and nothing else is said.
    taken = stack.call("bob", "POST", "/v1/runs", json=body)
    assert "taken" in assert_error(taken, 409, "ConflictError")
    # Without a run_id, each request is a run of its own, the caller its actor.
    one, two = (stack.start("bob", agent="chat") for _ in range(2))
    assert one != two and stack.doors.store.get_run(one).actor == "bob"


def test_a_service_may_start_runs_for_another_actor_no_one_else_may(stack: Stack) -> None:
    before = stack.written()
    body = {"agent": "chat", "input": "for bob", "actor": "bob"}
    refused = stack.call("user-7", "POST", "/v1/runs", json=body)
    assert "service" in assert_error(refused, 403, "PermissionDeniedError")
    assert stack.written() == before

    run_id = stack.call("backend", "POST", "/v1/runs", json=body).json()["run_id"]
    assert stack.doors.store.get_run(run_id).actor == "bob"
    # Naming oneself is no different from naming nobody.
    mine = stack.call("user-7", "POST", "/v1/runs", json={**body, "actor": "user-7"})
    assert mine.status_code == 201


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"agent": "chat"}, "input: Field required"),
        ({"agent": "chat", "input": "   "}, "input"),
        (
            {"agent": "chat", "input": "x", "colour": "red"},
            "colour: Extra inputs are not permitted",
        ),
        ({"agent": "nobody", "input": "x"}, "unknown agent 'nobody'"),
        ({"agent": "chat", "input": "x", "persona": "pirate"}, "unknown persona 'pirate'"),
        ({"agent": "chat", "input": "x", "run_id": "no spaces please"}, "run_id"),
        ({"agent": "chat", "input": "x", "metadata": [1, 2]}, "metadata"),
        ([{"agent": "chat", "input": "x"}], "(request)"),
    ],
)
def test_a_bad_run_request_is_422_and_writes_nothing(stack: Stack, body: Any, says: str) -> None:
    before = stack.written()
    message = assert_error(stack.call("user-7", "POST", "/v1/runs", json=body), 422)
    assert says in message
    assert stack.written() == before


def test_a_body_that_is_not_json_is_422(stack: Stack) -> None:
    reply = stack.call(
        "user-7",
        "POST",
        "/v1/runs",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert_error(reply, 422, "InvalidRequestError")


# --- reading runs -----------------------------------------------------------------------------


def test_a_run_reads_as_status_json_prints_it_for_those_who_may_read_it(stack: Stack) -> None:
    run_id, _ = parked(stack)
    shown = stack.call("user-7", "GET", f"/v1/runs/{run_id}")
    assert shown.status_code == 200
    printed = cli("status", run_id, "--json", env=stack.doors.env)
    assert printed.returncode == 0, printed.stderr
    assert shown.json() == json.loads(printed.stdout)
    assert shown.json()["status"] == "awaiting_approval"
    assert shown.json()["pending_calls"][0]["tool"] == "refund"

    # A lead may decide its refund, so reads it; a service reads every run.
    for reader in ("alice", "carol", "backend"):
        assert stack.call(reader, "GET", f"/v1/runs/{run_id}").json() == shown.json()
    # Anyone else is told there is no such run, exactly as for an id that does not exist.
    for stranger in ("eve", "bob"):
        hidden = assert_error(stack.call(stranger, "GET", f"/v1/runs/{run_id}"), 404)
        missing = assert_error(stack.call(stranger, "GET", "/v1/runs/no-such-run"), 404)
        assert hidden.replace(run_id, "X") == missing.replace("no-such-run", "X")
    assert_error(stack.call("user-7", "GET", "/v1/runs/no-such-run"), 404, "UnknownRunError")


# --- decisions ----------------------------------------------------------------------------


def test_an_approval_through_the_api_releases_the_durable_run(stack: Stack) -> None:
    run_id, call_id = parked(stack, text=f"refund {MARKUP}")
    [listed] = stack.pending("alice", run_id)
    request = next(f for _, f in stack.frames(run_id) if f["type"] == "approval_request")
    assert listed == {
        "run_id": run_id,
        "call_id": call_id,
        "tool": "refund",
        "args": {"order_id": "42", "amount": 5, "note": f"refund {MARKUP}"},
        "args_sha256": request["args_sha256"],
        "actor": "user-7",
        "agent": "support",
        "input": f"refund {MARKUP}",
        "input_cut": False,
        "said": "Refunding. ",
        "requested_at": listed["requested_at"],
        "deadline": None,  # the tool has no approval_timeout
        "escalated": False,
        "then": None,
    }
    # Only those whose roles may decide it see it.
    assert stack.pending("carol", run_id) and not stack.pending("user-7", run_id)
    assert not stack.pending("eve", run_id) and not stack.pending("backend", run_id)

    path = f"/v1/runs/{run_id}/approvals/{call_id}"
    before = stack.doors.snapshot(run_id)
    refusals = [
        ("user-7", {"decision": "approve"}, 403),  # may read the run, may not decide
        ("eve", {"decision": "approve"}, 404),  # may not even see it
        ("alice", {"decision": "maybe"}, 422),
        ("alice", {"decision": "approve", "why": "extra"}, 422),
        ("alice", {"decision": "approve", "args_sha256": "abc"}, 422),
        ("alice", {"decision": "approve", "args_sha256": "0" * 64}, 409),  # other arguments
    ]
    for actor, body, status in refusals:
        assert_error(stack.call(actor, "POST", path, json=body), status)
    assert_error(
        stack.call(
            "alice", "POST", f"/v1/runs/{run_id}/approvals/call_9", json={"decision": "approve"}
        ),
        404,
        "UnknownCallError",
    )
    assert stack.doors.snapshot(run_id) == before
    assert stack.doors.store.get_run(run_id).status == "awaiting_approval"

    body = {"decision": "approve", "reason": "fine", "args_sha256": listed["args_sha256"]}
    decided = stack.call("alice", "POST", path, json=body)
    assert decided.status_code == 200 and decided.json() == {"recorded": True}
    stack.doors.wait_status(run_id, "completed")
    assert stack.doors.store.get_run(run_id).output == ANSWER
    call = stack.doors.store.tool_call(run_id, call_id)
    assert call is not None and (call["decided_by"], call["decision_reason"]) == ("alice", "fine")
    assert executed(run_id).count(("refund", f"{run_id}:tool:{call_id}")) == 1
    # The first decision won; the next is refused and changes nothing.
    again = stack.call("carol", "POST", path, json={"decision": "reject"})
    assert "already decided" in assert_error(again, 409, "ConflictError")
    assert not stack.pending("alice", run_id)


def test_a_call_of_a_run_that_ended_cannot_be_decided(stack: Stack) -> None:
    run_id, call_id = parked(stack)
    assert_error(stack.call("alice", "POST", f"/v1/runs/{run_id}/cancel"), 403)
    cancelled = stack.call("user-7", "POST", f"/v1/runs/{run_id}/cancel", json={})
    assert cancelled.status_code == 202 and cancelled.json() == {"cancelling": [run_id]}
    stack.doors.wait_status(run_id, "cancelled")
    before = stack.doors.snapshot(run_id)
    ended = stack.call(
        "alice", "POST", f"/v1/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"}
    )
    assert "has ended" in assert_error(ended, 409, "ConflictError")
    assert stack.doors.snapshot(run_id) == before
    assert not stack.pending("alice", run_id)
    # Cancelling what has ended is accepted and asks nothing of anyone.
    again = stack.call("backend", "POST", f"/v1/runs/{run_id}/cancel", json={"keep_inbox": True})
    assert again.status_code == 202 and again.json() == {"cancelling": []}
    assert_error(stack.call("user-7", "POST", f"/v1/runs/{run_id}/cancel", json={"keep": 1}), 422)


def test_questions_are_answered_through_the_api(stack: Stack) -> None:
    run_id = stack.start("user-7", agent="planner", text="book me")
    stack.doors.wait_status(run_id, "awaiting_answers")
    inbox = stack.call("user-7", "GET", "/v1/approvals").json()
    [asked] = [q for q in inbox["questions"] if q["run_id"] == run_id]
    assert asked["tool"] == "schedule" and asked["actor"] == "user-7"
    assert [q["question"] for q in asked["questions"]] == [
        "Which day suits you?",
        "Morning or afternoon?",
    ]
    served = stack.call("backend", "GET", "/v1/approvals").json()["questions"]
    assert any(q["run_id"] == run_id for q in served)
    assert not any(
        q["run_id"] == run_id
        for q in stack.call("alice", "GET", "/v1/approvals").json()["questions"]
    )

    path = f"/v1/runs/{run_id}/answers/{asked['request_id']}"
    before = stack.doors.snapshot(run_id)
    assert_error(
        stack.call("eve", "POST", path, json={"answers": {"q1": "Tuesday", "q2": "Morning"}}), 404
    )
    assert_error(stack.call("user-7", "POST", path, json={"answers": {"q1": "Tuesday"}}), 422)
    assert_error(
        stack.call("user-7", "POST", path, json={"answers": {"q1": "Tuesday", "q2": 2}}), 422
    )
    long_answer = {"answers": {"q1": "T" * 10_001, "q2": "Morning"}}
    assert_error(stack.call("user-7", "POST", path, json=long_answer), 422)
    assert_error(
        stack.call(
            "user-7", "POST", f"/v1/runs/{run_id}/answers/nope", json={"answers": {"q1": "x"}}
        ),
        404,
        "NotFoundError",
    )
    assert stack.doors.snapshot(run_id) == before

    answers = {"answers": {"q1": "Tuesday", "q2": "Morning"}}
    assert stack.call("user-7", "POST", path, json=answers).json() == {"recorded": True}
    stack.doors.wait_status(run_id, "completed")
    assert assert_error(stack.call("backend", "POST", path, json=answers), 409)
    results = [c["result"] for c in stack.doors.store.tool_calls(run_id)]
    assert results == ["a call booked for Tuesday (Morning)"]


def test_an_approval_says_what_the_run_was_asked_and_what_the_model_said(
    stack: Stack,
) -> None:
    """An approver could not judge a refund from the tool and its arguments alone."""
    run_id, call_id = parked(stack, text=f"please refund {MARKUP}")
    [item] = stack.pending("alice", run_id)
    assert item["call_id"] == call_id and item["agent"] == "support"
    assert item["input"] == f"please refund {MARKUP}" and item["input_cut"] is False
    assert item["said"].strip() == "Refunding."
    assert item["then"] is None  # the tool has no deadline
    stack.call("user-7", "POST", f"/v1/runs/{run_id}/cancel", json={})


def test_messages_steer_a_run_its_actor_owns(stack: Stack) -> None:
    run_id, _ = parked(stack)
    path = f"/v1/runs/{run_id}/messages"
    before = stack.doors.snapshot(run_id)
    assert_error(
        stack.call("alice", "POST", path, json={"text": "hi"}), 403, "PermissionDeniedError"
    )
    assert_error(stack.call("eve", "POST", path, json={"text": "hi"}), 404)
    assert_error(stack.call("user-7", "POST", path, json={"text": "hi", "when": "later"}), 422)
    assert_error(stack.call("user-7", "POST", path, json={"text": ""}), 422)
    assert stack.doors.snapshot(run_id) == before

    queued = stack.call("user-7", "POST", path, json={"text": "also check 7", "when": "next-step"})
    assert queued.status_code == 202 and queued.json() == {"thread_id": run_id}
    spliced = [e for e in stack.doors.client.events(run_id) if e.type == "agent/inbox/spliced"]
    assert "also check 7" in json.dumps([e.data for e in spliced])
    nxt = stack.call("backend", "POST", path, json={"text": "then order 7", "when": "next-turn"})
    assert nxt.status_code == 202


def test_no_token_is_ever_logged(stack: Stack) -> None:
    stack.call("alice", "GET", "/v1/approvals")
    log = stack.api.log()
    assert "GET /v1/approvals" in log  # the access log is there…
    for token in TOKENS.values():
        assert token not in log  # …and no token in it
    assert all(token not in " ".join(stack.api.proc.args) for token in TOKENS.values())


def test_a_rejection_through_the_api_goes_back_to_the_model(stack: Stack) -> None:
    run_id, call_id = parked(stack)
    body = {"decision": "reject", "reason": "not this one"}
    assert stack.call(
        "carol", "POST", f"/v1/runs/{run_id}/approvals/{call_id}", json=body
    ).json() == {"recorded": True}
    stack.doors.wait_status(run_id, "completed")
    call = stack.doors.store.tool_call(run_id, call_id)
    assert call is not None and call["status"] == "rejected"
    assert not [what for what, _ in executed(run_id) if what == "refund"]


def test_a_threads_model_is_switched_over_http_and_the_cli_from_its_next_step(
    stack: Stack,
) -> None:
    """Choosing a thread's model, at the doors of a durable deployment: refusals change
    nothing; the last choice is the model of the step after the decision."""
    run_id, call_id = parked(stack)
    path = f"/v1/runs/{run_id}/model"
    before = stack.doors.snapshot(run_id)
    said = assert_error(stack.call("alice", "POST", path, json={"model": "m2"}), 403)
    assert "switch its model" in said
    assert_error(stack.call("eve", "POST", path, json={"model": "m2"}), 404)
    assert "name a model" in assert_error(stack.call("user-7", "POST", path, json={}), 422)
    assert_error(stack.call("user-7", "POST", path, json={"model": "m2", "seed": 1}), 422)
    assert stack.doors.snapshot(run_id) == before

    by_cli = cli("model", run_id, "--model", "m3", "--json", env=stack.doors.env)
    assert by_cli.returncode == 0, by_cli.stderr
    assert json.loads(by_cli.stdout)["thread_id"] == run_id
    switched = stack.call("backend", "POST", path, json={"model": "m2"})
    assert switched.status_code == 202 and switched.json() == {"thread_id": run_id}
    chosen = [
        e.data["model"] for e in stack.doors.client.events(run_id) if e.type.endswith("selected")
    ]
    assert chosen == ["m3", "m2"]

    decided = stack.call(
        "alice", "POST", f"/v1/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    assert stack.doors.wait_status(run_id, "completed")
    steps = {row["step"]: row for row in stack.doors.store.journal(run_id)}
    assert steps["model:1"]["intent"]["request"]["settings"]["model"] != "m2"
    assert steps["model:2"]["intent"]["request"]["settings"]["model"] == "m2"
    # The module's later tests compare every run's row before and after a refusal.
    settled(lambda: stack.doors.snapshot(run_id), what=f"the rows of {run_id}")
