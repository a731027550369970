"""`assemble_text`: a reader's rule for the attempt marker of a retried step."""

from __future__ import annotations

from typing import Any

from agent_jobs.streams.text import TextAssembler, assemble_text, is_attempt_marker


def delta(text: str, run: str = "r1", **tags: Any) -> dict[str, Any]:
    return {"type": "text_delta", "run_id": run, "text": text, **tags}


def marker(step: str, attempt: int, run: str = "r1") -> dict[str, Any]:
    return {"type": "status", "run_id": run, "status": "retrying", "step": step, "attempt": attempt}


def frame(type: str, run: str = "r1", **fields: Any) -> dict[str, Any]:
    return {"type": type, "run_id": run, **fields}


def test_without_markers_the_text_is_every_delta_in_order() -> None:
    frames = [
        frame("status", status="running"),
        delta("Checking "),
        delta("both. "),
        frame("tool_call", call_id="c1"),
        frame("tool_result", call_id="c1"),
        delta("Done."),
        frame("done", output="Done."),
    ]
    assert assemble_text(frames) == "Checking both. Done."


def test_a_marker_drops_the_failed_attempts_partial_text_only() -> None:
    frames = [
        delta("Checking. "),  # model:1, finished
        frame("tool_call", call_id="c1"),
        frame("tool_result", call_id="c1"),
        delta("The order "),  # model:2, attempt 1: its worker dies here
        delta("is lo"),
        marker("model:2", 2),
        delta("Order 42 "),
        delta("shipped."),
        frame("done", output="Order 42 shipped."),
    ]
    assert assemble_text(frames) == "Checking. Order 42 shipped."


def test_several_failed_attempts_and_one_that_streamed_nothing() -> None:
    frames = [
        delta("a1 "),
        marker("model:1", 2),
        marker("model:1", 3),  # attempt 2 died before its first delta
        delta("a3 partial"),
        marker("model:1", 4),
        delta("final"),
    ]
    assembler = TextAssembler().feed_all(frames)
    assert assembler.text == "final"
    assert assembler.dropped == 2


def test_the_live_text_shrinks_when_a_marker_takes_text_back() -> None:
    assembler = TextAssembler()
    seen = []
    for f in [delta("Hel"), delta("lo"), marker("model:1", 2), delta("Hi")]:
        assembler.feed(f)
        seen.append(assembler.text)
    assert seen == ["Hel", "Hello", "", "Hi"]


def test_a_tool_steps_marker_leaves_the_models_closed_text() -> None:
    frames = [
        delta("Looking it up. "),
        frame("tool_call", call_id="c1"),
        marker("tool:c1", 2),
        frame("tool_result", call_id="c1"),
        delta("Found it."),
    ]
    assert assemble_text(frames) == "Looking it up. Found it."


def test_runs_sharing_a_stream_are_assembled_apart() -> None:
    frames = [
        delta("parent ", run="p"),
        frame("tool_call", run="p", call_id="c1"),
        delta("child partial", run="c"),
        delta("answer ", run="p"),
        marker("model:1", 2, run="c"),
        delta("child final", run="c"),
    ]
    assert assemble_text(frames, run_id="c") == "child final"
    assert assemble_text(frames, run_id="p") == "parent answer "
    assert assemble_text(frames) == "parent answer child final"


def test_tagged_deltas_are_matched_by_step_and_attempt() -> None:
    frames = [
        delta("one ", step="model:1", attempt=1),
        frame("tool_call", call_id="c1"),  # does not close tagged text
        delta("stale ", step="model:2", attempt=1),
        marker("model:2", 2),
        delta("fresh", step="model:2", attempt=2),
        delta(" late", step="model:2", attempt=1),  # the superseded attempt still streams
    ]
    assembler = TextAssembler().feed_all(frames)
    assert assembler.text == "one fresh"
    assert assembler.dropped == 2


def test_frames_that_are_not_text_or_malformed_are_ignored() -> None:
    frames: list[dict[str, Any]] = [
        {"type": "text_delta", "run_id": "r1"},
        {"type": "text_delta", "run_id": "r1", "text": 5},
        {"type": "text_delta", "run_id": "r1", "text": ""},
        delta("ok"),
        {"type": "status", "run_id": "r1", "status": "awaiting_approval"},
    ]
    assert assemble_text(frames) == "ok"
    assert is_attempt_marker(marker("model:1", 2))
    assert not is_attempt_marker(frame("status", status="running"))


def test_tool_call_arguments_streaming_leave_the_step_in_flight_open() -> None:
    # An untagged attempt that streamed text, then a call's arguments, then died: its
    # text is void all the same, the arguments pieces being part of the same step.
    frames = [
        delta("Checking. "),  # model:1, finished
        frame("tool_call", call_id="c1"),
        frame("tool_result", call_id="c1"),
        delta("Refunding "),  # model:2, attempt 1
        frame("tool_call_delta", call_id="c2", name="refund", args_delta='{"order', offset=0),
        delta("now. "),
        frame("tool_call_delta", call_id="c2", name="refund", args_delta='_id"', offset=7),
        marker("model:2", 2),
        delta("Refunding it."),
        frame("tool_call_delta", call_id="c2", name="refund", args_delta="{}", offset=0),
        frame("tool_call", call_id="c2"),
    ]
    assert assemble_text(frames) == "Checking. Refunding it."
