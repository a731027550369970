"""Live frame streams: text deltas, tool calls and results, approvals, status, done/error.

A run's frames go to the stream of its top-level ancestor (so a person watching a
parent sees its children), each tagged with the run that produced it. In-process the
stream lives in memory; with the durable runner it is a Redis Stream per run.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

Frame = dict[str, Any]
FRAME_TYPES: tuple[str, ...] = (
    "text_delta",
    "tool_call_delta",
    "tool_call",
    "tool_result",
    "approval_request",
    "question",
    "outcome_unknown",
    "status",
    "done",
    "error",
)
END_TYPES = frozenset({"done", "error"})


def stream_key(run_id: str) -> str:
    return f"agent_jobs:stream:{run_id}"


class StreamBackend(Protocol):
    def append(self, stream_id: str, frame: Frame) -> str:
        """Append a frame; returns the entry id a reader can resume after."""
        ...

    def append_many(self, stream_id: str, frames: list[Frame]) -> None:
        """Append several frames in order (one round trip where the backend can)."""
        ...

    def end(self, stream_id: str) -> None:
        """The run is over: no more frames will come."""
        ...

    def ping(self) -> None:
        """Raise if the streams cannot be read now (their server does not answer)."""
        ...

    def read(
        self, stream_id: str, after: str | None = None, *, block: float | None = None
    ) -> Iterator[tuple[str, Frame]]:
        """Frames after entry `after`, following live until the stream ends (or `block`
        seconds pass with nothing new)."""
        ...


@dataclass
class _MemoryStream:
    frames: list[Frame] = field(default_factory=list)
    ended: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)


class MemoryStreams:
    """In-process streams for the inline runner; ended streams are kept, boundedly."""

    def __init__(self, keep_ended: int = 1000) -> None:
        self._streams: OrderedDict[str, _MemoryStream] = OrderedDict()
        self._lock = threading.Lock()
        self._keep_ended = keep_ended

    def _get(self, stream_id: str) -> _MemoryStream:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                stream = self._streams[stream_id] = _MemoryStream()
            return stream

    def append(self, stream_id: str, frame: Frame) -> str:
        stream = self._get(stream_id)
        with stream.changed:
            stream.frames.append(frame)
            stream.changed.notify_all()
            return str(len(stream.frames))

    def append_many(self, stream_id: str, frames: list[Frame]) -> None:
        for frame in frames:
            self.append(stream_id, frame)

    def ping(self) -> None:
        """This process's memory always answers."""

    def end(self, stream_id: str) -> None:
        stream = self._get(stream_id)
        with stream.changed:
            stream.ended = True
            stream.changed.notify_all()
        with self._lock:
            ended = [k for k, s in self._streams.items() if s.ended]
            for key in ended[: max(0, len(ended) - self._keep_ended)]:
                del self._streams[key]

    def read(
        self, stream_id: str, after: str | None = None, *, block: float | None = None
    ) -> Iterator[tuple[str, Frame]]:
        stream = self._get(stream_id)
        position = int(after or 0)
        while True:
            with stream.changed:
                if position >= len(stream.frames) and not stream.ended:
                    stream.changed.wait(timeout=block)
                batch = stream.frames[position:]
                ended = stream.ended
            for frame in batch:
                position += 1
                yield str(position), frame
            if ended and position >= len(stream.frames):
                return
            if not batch and block is not None:
                return


class RunStream:
    """Writes one run's frames into its stream; doubles as the model's delta sink."""

    def __init__(self, backend: StreamBackend, stream_id: str, run_id: str) -> None:
        self.backend = backend
        self.stream_id = stream_id
        self.run_id = run_id
        self.extra: dict[str, Any] = {}

    def emit(self, type: str, **fields: Any) -> str:
        frame: Frame = {"type": type, "run_id": self.run_id, **self.extra, **fields}
        return self.backend.append(self.stream_id, frame)

    def emit_many(self, frames: list[tuple[str, dict[str, Any]]]) -> None:
        if frames:
            self.backend.append_many(
                self.stream_id,
                [{"type": type, "run_id": self.run_id, **self.extra, **f} for type, f in frames],
            )

    def text(self, delta: str) -> None:
        if delta:
            self.emit("text_delta", text=delta)

    def tool_call_delta(
        self, call_id: str, name: str, args_delta: str, *, index: int, offset: int
    ) -> None:
        """The next piece of a tool call's arguments, as the model writes it."""
        if args_delta:
            self.emit(
                "tool_call_delta",
                call_id=call_id,
                name=name,
                index=index,
                offset=offset,
                args_delta=args_delta,
            )

    def end(self) -> None:
        """End the stream; only the top-level run ends it, never a delegated child."""
        if self.stream_id == self.run_id:
            self.backend.end(self.stream_id)


def frame_json(frame: Frame) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"), default=str)
