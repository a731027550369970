"""`GET /v1/runs/{run_id}/stream` against a durable run: resumed without a frame lost or
repeated, not ended by a forged frame, and a client that leaves takes nothing with it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.settings import Settings
from tests.support.apps.http import ANSWER
from tests.support.doors import wait_for
from tests.support.redis_server import RedisServer
from tests.support.serve import Event, Stack, assert_error, events, open_stack

STREAM_BROKER_DB = 14


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("sse")
    with open_stack(pg_url, redis_url, STREAM_BROKER_DB, tmp, "serve-sse") as made:
        yield made


def approve(stack: Stack, run_id: str, frame: dict[str, Any]) -> None:
    path = f"/v1/runs/{run_id}/approvals/{frame['call_id']}"
    body = {"decision": "approve", "args_sha256": frame["args_sha256"]}
    assert stack.call("alice", "POST", path, json=body).status_code == 200


def test_a_client_that_leaves_and_comes_back_gets_every_frame_once_in_order(stack: Stack) -> None:
    run_id = stack.start("user-7", agent="talker", text="resume me")
    got: list[tuple[str, dict[str, Any]]] = []
    # First visit: a few frames, then away while the model keeps streaming.
    with stack.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
        assert reply.headers["cache-control"] == "no-store"
        for event in events(reply):
            if event.data is not None:
                got.append((str(event.id), event.frame))
            if len(got) == 8:
                break
    # Away while the model streams on: frames we have not seen are in the stream.
    wait_for(lambda: len(stack.frames(run_id)) >= len(got) + 5, "the model to stream on")
    # Back with Last-Event-ID (and a stale ?after= that the header overrides).
    headers = {"Last-Event-ID": got[-1][0]}
    path = f"/v1/runs/{run_id}/stream?after={got[0][0]}"
    with stack.stream("user-7", path, headers=headers) as reply:
        for event in events(reply):
            if event.data is None:
                continue
            got.append((str(event.id), event.frame))
            if event.frame["type"] == "approval_request":
                approve(stack, run_id, event.frame)
    # The response ended by itself, after the run's end.
    assert got[-1][1] == {"type": "done", "run_id": run_id, "output": ANSWER}
    assert stack.doors.store.get_run(run_id).status == "completed"
    assert got == stack.frames(run_id)  # every frame, once, in order, as Redis has them
    assert len({entry for entry, _ in got}) == len(got)
    deltas = [f for _, f in got if f["type"] == "text_delta"]
    assert len(deltas) > 40

    # `?after=` alone resumes too, and a finished run's stream still ends.
    middle = got[len(got) // 2][0]
    with stack.stream("user-7", f"/v1/runs/{run_id}/stream?after={middle}") as reply:
        rest = [(str(e.id), e.frame) for e in events(reply) if e.data is not None]
    assert rest == got[len(got) // 2 + 1 :]


def test_a_forged_done_frame_does_not_end_the_stream(stack: Stack) -> None:
    run_id = stack.start("user-7", text="forge me")
    # The approver may read the run once its action call is recorded (before that it is
    # not theirs to see: 404); the stream then starts from the run's first frame.
    stack.doors.wait_status(run_id, "awaiting_approval")
    key = f"agent_jobs:stream:{run_id}"
    forged_id = ""
    seen: list[Event] = []
    keepalives_after_forgery = 0
    with stack.stream("alice", f"/v1/runs/{run_id}/stream") as reply:  # the approver's
        for event in events(reply):
            seen.append(event)
            if event.data is not None and event.frame["type"] == "approval_request":
                request = event.frame
                forged = {"type": "done", "run_id": run_id, "output": "forged"}
                forged_id = stack.doors.redis.xadd(key, {"frame": json.dumps(forged)}).decode()
            elif event.comment == "keep-alive" and forged_id:
                keepalives_after_forgery += 1
                # Long enough for the follower to have read the forgery and checked the
                # run's row (it waits up to two seconds between checks).
                if keepalives_after_forgery == 6:
                    approve(stack, run_id, request)
    frames = [e for e in seen if e.data is not None]
    assert forged_id and forged_id not in {e.id for e in frames}
    assert keepalives_after_forgery >= 6
    assert frames[-1].frame == {"type": "done", "run_id": run_id, "output": ANSWER}
    assert stack.doors.store.get_run(run_id).status == "completed"
    assert f"ignored the frame {forged_id}" in stack.api.log()


DEFAULT_KEEPALIVE = Settings.model_fields["api_keepalive"].default


def test_keep_alive_comments_flow_while_the_run_waits(stack: Stack) -> None:
    run_id = stack.start("user-7", text="wait")
    stack.doors.wait_status(run_id, "awaiting_approval")
    started = time.monotonic()
    comments = 0
    with stack.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
        for event in events(reply):
            comments += event.comment == "keep-alive"
            if comments == 3:
                break
    # Three keep-alives, half a second apart (AGENT_JOBS_API_KEEPALIVE=0.5 here): never
    # sooner, and at the setting's pace, not the default's (three in less time than the
    # default's one).
    assert 1.0 <= time.monotonic() - started < DEFAULT_KEEPALIVE


def blocked_readers(stack: Stack) -> list[dict[str, Any]]:
    """The server's Redis connections blocked in a read, as Redis lists them."""
    clients: list[dict[str, Any]] = stack.doors.redis.client_list()
    return [c for c in clients if c.get("name") == "agent-jobs-serve" and "b" in c["flags"]]


def test_a_client_that_leaves_frees_the_servers_thread_and_redis_connection(
    stack: Stack,
) -> None:
    run_ids = [stack.start("user-7", text=f"leave {n}") for n in range(3)]
    for run_id in run_ids:
        stack.doors.wait_status(run_id, "awaiting_approval")
    with stack.api.client("user-7") as client:
        streams = [client.stream("GET", f"/v1/runs/{r}/stream") for r in run_ids]
        replies = [s.__enter__() for s in streams]
        readers = [events(reply) for reply in replies]
        for reader in readers:  # each is following: its first frame has come
            assert next(e for e in reader if e.data is not None)
        wait_for(lambda: len(blocked_readers(stack)) == 3, "three readers blocked on Redis")
        following = stack.api.threads()  # three of them read the three streams
        for stream in streams:
            stream.__exit__(None, None, None)
    # Within a quarter of a second (the follower's reads wait no longer while a reader
    # may be told to stop) each is gone: no thread, no Redis connection blocked for a
    # client that left. Well before the two seconds a quiet stream's row check takes.
    wait_for(lambda: not blocked_readers(stack), "the readers to let go of Redis", timeout=1.5)
    wait_for(lambda: stack.api.threads() <= following - 3, "the readers' threads to end", timeout=2)
    assert not blocked_readers(stack)  # their threads are gone: none can block again
    # The connections are back in the pool, not leaked: a new reader reuses one.
    named = [c for c in stack.doors.redis.client_list() if c.get("name") == "agent-jobs-serve"]
    with stack.stream("user-7", f"/v1/runs/{run_ids[0]}/stream") as reply:
        assert next(e for e in events(reply) if e.data is not None)
    after = [c for c in stack.doors.redis.client_list() if c.get("name") == "agent-jobs-serve"]
    assert len(after) <= len(named)


def test_stream_refusals(stack: Stack) -> None:
    run_id = stack.start("user-7", text="refusals")
    assert_error(stack.call("eve", "GET", f"/v1/runs/{run_id}/stream"), 404, "UnknownRunError")
    assert_error(stack.call("user-7", "GET", "/v1/runs/nope/stream"), 404, "UnknownRunError")
    bad = stack.call("user-7", "GET", f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "x"})
    assert "entry id" in assert_error(bad, 422, "InvalidRequestError")
    bad = stack.call("user-7", "GET", f"/v1/runs/{run_id}/stream?after=1-2-3")
    assert_error(bad, 422, "InvalidRequestError")
    assert_error(stack.call(None, "GET", f"/v1/runs/{run_id}/stream"), 401)


def test_with_redis_down_a_stream_is_503_before_it_begins_and_says_so_after(
    pg_url: str, tmp_path: Path
) -> None:
    """It was a 200 that ended at once with no frame: a client could not tell an outage
    from a stream that is over, and an EventSource asked again every second."""
    server = RedisServer().start()
    try:
        with open_stack(pg_url, server.url(0), 0, tmp_path, "serve-sse-outage") as stack:
            run_id = stack.start("user-7")  # a refund that waits for a lead
            stack.doors.wait_status(run_id, "awaiting_approval")
            with stack.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
                seen: list[Event] = []
                for event in events(reply):
                    seen.append(event)
                    if event.data and event.frame.get("type") == "approval_request":
                        server.stop()  # while the stream follows the waiting run
                last = seen[-1]
            assert last.name == "error" and last.id is None, seen[-3:]
            assert json.loads(last.data or "")["type"] == "ServiceUnavailableError"
            for _ in range(2):  # no stream begins while Redis does not answer
                said = assert_error(
                    stack.call("user-7", "GET", f"/v1/runs/{run_id}/stream"),
                    503,
                    "ServiceUnavailableError",
                )
                assert "Redis does not answer" in said
            server.start()  # back (empty), for the stack to close on
    finally:
        server.close()
