"""The model interface of the loop: one call streams deltas and returns the reply."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..messages import ModelRequest, ModelResponse


class DeltaSink(Protocol):
    """Where a model writes its text as it arrives."""

    def text(self, delta: str) -> None: ...


class NullDeltaSink:
    """A sink that drops every delta (replays, summaries, tests)."""

    def text(self, delta: str) -> None:
        return None


@runtime_checkable
class Model(Protocol):
    """An LLM adapter. `run_turn` streams text deltas to `sink` and returns the reply.

    Adapters raise `agent_jobs.errors.ModelError` (or a subclass) for provider failures,
    with `kind` classifying it for the request-error waterfall.
    """

    @property
    def name(self) -> str: ...

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse: ...
