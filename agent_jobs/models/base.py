"""The model interface of the loop: one call streams deltas and returns the reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ..messages import ModelRequest, ModelResponse


class DeltaSink(Protocol):
    """Where a model writes its text as it arrives.

    A sink may also take a tool call's arguments as they arrive, with a method
    `tool_call_delta(call_id, name, args_delta, *, index, offset)` (see `ArgsWriter`);
    adapters look for it with `args_writer`, so a sink without it still works.
    """

    def text(self, delta: str) -> None: ...


class ArgsWriter(Protocol):
    """Takes the next piece of a tool call's arguments (JSON text) as the model writes it.

    `index` is the call's position in the reply (from 0), `offset` how many characters
    (code points) of the call's arguments came before this piece.
    """

    def __call__(
        self, call_id: str, name: str, args_delta: str, *, index: int, offset: int
    ) -> None: ...


def args_writer(sink: DeltaSink) -> ArgsWriter | None:
    """The sink's `tool_call_delta`, or None for a sink that only takes text."""
    method: Callable[..., None] | None = getattr(sink, "tool_call_delta", None)
    return method if callable(method) else None


class NullDeltaSink:
    """A sink that drops every delta (replays, summaries, tests)."""

    def text(self, delta: str) -> None:
        return None

    def tool_call_delta(
        self, call_id: str, name: str, args_delta: str, *, index: int, offset: int
    ) -> None:
        return None


@runtime_checkable
class Model(Protocol):
    """An LLM adapter. `run_turn` streams text deltas (and, where the sink takes them,
    tool-call argument pieces) to `sink` and returns the reply.

    Adapters raise `agent_jobs.errors.ModelError` (or a subclass) for provider failures,
    with `kind` classifying it for the request-error waterfall.
    """

    @property
    def name(self) -> str: ...

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse: ...
