"""Reading a run's text off its live stream, without the partial text of failed attempts.

A model step streams `text_delta` frames as the provider sends them. When a step runs
again (its worker was killed mid-stream, or the attempt failed and is retried), the
new attempt's frames start with the attempt marker

    {"type": "status", "status": "retrying", "step": "model:1", "attempt": 2, "run_id": …}

and the text the failed attempt streamed before it is void: the new attempt streams
its reply from the start. The rule a reader applies, per run:

- a `text_delta` adds to the text of the step in flight;
- a `tool_call_delta` (a piece of a tool call's arguments) is the step in flight too:
  it changes nothing of the text;
- any other frame of the run (a tool call, a status, …) closes that text: it stays;
- a `retrying` marker drops the text of the step in flight, that is every
  `text_delta` of the run since the run's previous non-text frame. Between a model
  step's scheduling and its result nothing else of the run is streamed, so that is
  exactly the failed attempt's text.

Text deltas that name their step (a `step` field, and optionally the `attempt`) are
matched by them instead: a marker drops every earlier delta of its step, and a delta
of an attempt older than the newest marker's is dropped as it arrives (an attempt
that lost its lease but still streams). The durable runner does not tag deltas yet;
the rule above is exact without the tags as long as a step's attempts do not overlap.

Frames of several runs (a parent and the agents it delegates to share the parent's
stream) are told apart by `run_id`; each run's rule is applied to its own frames.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RETRYING = "retrying"


def is_attempt_marker(frame: Mapping[str, Any]) -> bool:
    """True for the frame that opens a step's next attempt."""
    return frame.get("type") == "status" and frame.get("status") == RETRYING


@dataclass
class _RunText:
    # Positions (in `TextAssembler._pieces`) of this run's untagged text since its last
    # non-text frame: the step in flight, which a marker may still drop.
    open: list[int] = field(default_factory=list)
    # Tagged text by step, and the newest attempt a marker announced for each step.
    by_step: dict[str, list[int]] = field(default_factory=dict)
    attempt: dict[str, int] = field(default_factory=dict)


class TextAssembler:
    """Feeds on frames in stream order; `text` is what a reader should show now.

    A live reader can redraw from `text` after each frame: it only grows, except when
    a marker takes a failed attempt's text back (`dropped` counts the deltas taken).
    """

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id
        self._pieces: list[str | None] = []  # None: dropped
        self._runs: dict[str, _RunText] = {}
        self.dropped = 0

    def feed(self, frame: Mapping[str, Any]) -> None:
        """Take the next frame of the stream."""
        run = str(frame.get("run_id", ""))
        if self.run_id is not None and run != self.run_id:
            return
        state = self._runs.setdefault(run, _RunText())
        kind = frame.get("type")
        if kind == "text_delta":
            self._text(state, frame)
        elif kind == "tool_call_delta":
            return  # written by the step in flight, like its text: that text stays open
        elif is_attempt_marker(frame):
            step = frame.get("step")
            attempt = frame.get("attempt")
            self._drop(state.open)
            state.open = []
            if isinstance(step, str):
                self._drop(state.by_step.pop(step, []))
                if isinstance(attempt, int):
                    state.attempt[step] = max(attempt, state.attempt.get(step, 0))
        else:
            state.open = []

    def _text(self, state: _RunText, frame: Mapping[str, Any]) -> None:
        text = frame.get("text")
        if not isinstance(text, str) or not text:
            return
        step = frame.get("step")
        if not isinstance(step, str):
            state.open.append(len(self._pieces))
            self._pieces.append(text)
            return
        attempt = frame.get("attempt")
        if isinstance(attempt, int) and attempt < state.attempt.get(step, 0):
            self.dropped += 1  # a superseded attempt still streaming
            return
        state.by_step.setdefault(step, []).append(len(self._pieces))
        self._pieces.append(text)

    def _drop(self, indexes: list[int]) -> None:
        for index in indexes:
            self._pieces[index] = None
        self.dropped += len(indexes)

    def feed_all(self, frames: Iterable[Mapping[str, Any]]) -> TextAssembler:
        for frame in frames:
            self.feed(frame)
        return self

    @property
    def text(self) -> str:
        return "".join(piece for piece in self._pieces if piece is not None)


def assemble_text(frames: Iterable[Mapping[str, Any]], run_id: str | None = None) -> str:
    """The text the frames stream, without what failed attempts streamed before failing.

    `run_id` keeps one run's text; by default every run's text is kept, in stream order.
    """
    return TextAssembler(run_id).feed_all(frames).text
