"""Large payloads on both runners: kept apart over the inline limit, refused over the
maximum, and a long run's journal holding what each step adds."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from agent_jobs.settings import get_settings
from tests.support.apps import executed
from tests.support.apps.payloads import digest, filled, memory
from tests.support.harness import Harness

SEED = "abcd"
MB = 1_000_000


def sizing(h: Harness, size: int, *, turns: int = 1, seed: str = SEED, noisy: bool = False) -> str:
    """A run of the `sizing` agent, once completed: its id."""
    asked = {"size": size, "turns": turns, "seed": seed, "noisy": noisy}
    run_id = h.start("sizing", json.dumps(asked))
    view = h.wait_status(run_id, "completed")
    assert view.output == f"read {turns} results"
    return run_id


def seen(run_id: str) -> list[str]:
    """What the model read back after each tool call: `length:is_error:digest or text`."""
    return [key for what, key in executed(run_id) if what == "seen"]


def journal_sizes(h: Harness, run_id: str) -> list[tuple[str, int, int]]:
    """Each journal row of the run: (step, its payloads' JSON length, their stored size
    as Postgres keeps them, compressed)."""
    query = text(
        "SELECT step, coalesce(length(intent::text), 0) + coalesce(length(result::text), 0),"
        " coalesce(pg_column_size(intent), 0) + coalesce(pg_column_size(result), 0)"
        " FROM journal WHERE run_id = :run_id ORDER BY seq"
    )
    with h.store.engine.connect() as conn:
        return [(str(s), int(n), int(k)) for s, n, k in conn.execute(query, {"run_id": run_id})]


def blobs(h: Harness) -> dict[str, int]:
    with h.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT sha256, size FROM payload_blobs")).all()
    return {str(d): int(s) for d, s in rows}


def largest_stored(h: Harness, run_id: str) -> int:
    """The largest payload any row of the run keeps inline, in bytes of its text."""
    query = text(
        "SELECT greatest("
        " (SELECT max(length(intent::text) + coalesce(length(result::text), 0))"
        "  FROM journal WHERE run_id = :r),"
        " (SELECT max(length(content)) FROM messages WHERE run_id = :r),"
        " (SELECT max(coalesce(length(result::text), 0)) FROM tool_calls WHERE run_id = :r))"
    )
    with h.store.engine.connect() as conn:
        return int(conn.execute(query, {"r": run_id}).scalar_one())


@pytest.mark.parametrize("size", [300_000, 10 * MB], ids=["300KB", "10MB"])
def test_a_result_over_the_inline_limit_is_kept_apart_and_read_whole(
    harness: Harness, size: int
) -> None:
    h = harness
    run_id = sizing(h, size)

    result = filled(size, SEED)
    assert seen(run_id) == [f"{size}:False:{digest(result)[:16]}"]  # the model read it all
    assert blobs(h).get(digest(result)) == size  # kept apart, as its bytes
    rows = journal_sizes(h, run_id)
    assert max(n for _, n, _ in rows) < 4096, rows  # the journal holds references
    assert largest_stored(h, run_id) < 4096
    [call] = h.store.tool_calls(run_id)
    assert (call["status"], call["result"]) == ("executed", result)


def test_the_same_result_in_two_runs_is_stored_once(harness: Harness) -> None:
    h = harness
    seed = secrets.token_hex(8)
    first = sizing(h, 300_000, seed=seed)
    after_first = blobs(h)
    second = sizing(h, 300_000, seed=seed)

    assert blobs(h) == after_first  # nothing more kept for the second run
    assert digest(filled(300_000, seed)) in after_first
    assert seen(first) == seen(second)


def test_a_result_over_the_maximum_fails_its_call_and_the_run_goes_on(
    harness: Harness, capsys: Any
) -> None:
    h = harness
    size = 100 * MB
    most = get_settings().payload_max
    run_id = sizing(h, size)

    [read] = seen(run_id)
    _, is_error, said = read.split(":", 2)
    assert is_error == "True" and "AGENT_JOBS_PAYLOAD_MAX" in said, read  # the model read why
    [call] = h.store.tool_calls(run_id)
    assert call["status"] == "failed" and call["result"] is None
    assert f"{size:,} bytes or more" in call["error"] and "AGENT_JOBS_PAYLOAD_MAX" in call["error"]
    # Nothing of it in Postgres nor on the run's stream in Redis.
    assert largest_stored(h, run_id) < 4096
    assert max(blobs(h).values(), default=0) <= most
    assert len(repr(h.frames(run_id))) < MB
    # Refused without a copy: the worker's peak memory grew by the result, and little more.
    [where] = [key for what, key in executed(run_id) if what == "memory"]
    pid, before = (int(part) for part in where.split(":"))
    peak = memory("VmHWM", Path(f"/proc/{pid}/status"))
    assert peak - before < size + 50 * MB, (peak - before) / MB
    with capsys.disabled():
        print(f"\n[{type(h).__name__}] a {size:,}-byte result: peak memory +{peak - before:,}")


def test_a_reply_over_the_maximum_fails_its_model_step(harness: Harness) -> None:
    h = harness
    run_id = h.start("wordy", str(40 * MB))
    view = h.wait_status(run_id, "failed")

    assert "AGENT_JOBS_PAYLOAD_MAX" in (view.error or ""), view.error
    assert largest_stored(h, run_id) < 4096
    assert max(blobs(h).values(), default=0) <= get_settings().payload_max


def test_a_long_run_journals_what_each_turn_adds(harness: Harness, capsys: Any) -> None:
    """100 turns of a 10.5 KB result each: the whole history, journaled at every turn,
    would be 53 MB; the journal grows by about the same at each turn."""
    h = harness
    turns, size = 100, 10_500
    kept = blobs(h)
    run_id = sizing(h, size, turns=turns, seed=secrets.token_hex(4), noisy=True)
    assert blobs(h) == kept  # nothing of it moved out of the journal to look small

    assert len(seen(run_id)) == turns
    rows = journal_sizes(h, run_id)
    per_turn: list[int] = []  # the JSON each turn added: a model step and what follows it
    for step, n, _ in rows:
        if step.startswith("model:") or not per_turn:
            per_turn.append(0)
        per_turn[-1] += n
    assert len(per_turn) == turns + 2  # what comes before the first model step, then each
    second, middle, last = per_turn[2], per_turn[turns // 2], per_turn[turns]
    assert last < 1.5 * second and middle < 1.5 * second, per_turn  # flat, not growing
    total = sum(per_turn)
    stored = sum(k for _, _, k in rows)
    avoided = sum(k * size for k in range(turns + 1))  # each model step's history
    assert avoided > 50 * MB and total * 4 < avoided
    with capsys.disabled():
        print(
            f"\n[{type(h).__name__}] journal of {turns} turns: {len(rows)} rows, "
            f"{total:,} bytes of JSON ({stored:,} as stored), {total // turns:,} a turn; "
            f"turns 2/{turns // 2 + 1}/{turns}: {second:,}/{middle:,}/{last:,} bytes; "
            f"the whole history journaled at each turn would be {avoided:,}"
        )
