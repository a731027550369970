"""`ScriptedModel`: a deterministic model for tests and demos."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigurationError
from ..messages import ModelRequest, ModelResponse, ToolCall, Usage
from .base import DeltaSink


class _ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptedTurn(BaseModel):
    """One entry of a script: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    tool_calls: list[_ScriptedCall] = Field(default_factory=list)
    # Seconds to spread over the streamed chunks: lets tests catch a model step in flight.
    delay: float = 0.0


def estimate_tokens(text: str) -> int:
    """The `len(text) // 4` estimate, at least one token for anything non-empty."""
    return max(1, len(text) // 4) if text else 0


class ScriptedModel:
    """The n-th model call of a run receives `turns[n]`; the last entry repeats.

    Call ids are deterministic: `call_1`, `call_2`, … counted over the run's script.
    """

    def __init__(self, turns: Sequence[Mapping[str, Any]], *, name: str = "scripted") -> None:
        if not turns:
            raise ConfigurationError("ScriptedModel needs at least one turn")
        try:
            self.turns = [ScriptedTurn.model_validate(dict(turn)) for turn in turns]
        except ValidationError as exc:
            raise ConfigurationError(f"ScriptedModel: a turn is malformed: {exc}") from exc
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def _turn(self, n: int) -> ScriptedTurn:
        return self.turns[min(n, len(self.turns) - 1)]

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        turn = self._turn(request.step)
        first_id = 1 + sum(len(self._turn(k).tool_calls) for k in range(request.step))
        calls = [
            ToolCall(id=call.id or f"call_{first_id + i}", name=call.name, args=call.args)
            for i, call in enumerate(turn.tool_calls)
        ]
        chunks = re.findall(r"\S+\s*|\s+", turn.text) if turn.text else []
        pause = turn.delay / max(1, len(chunks))
        for chunk in chunks:
            if pause:
                time.sleep(pause)
            sink.text(chunk)
        if turn.delay and not chunks:
            time.sleep(turn.delay)
        prompt = request.system + "".join(
            m.content + json.dumps([c.model_dump() for c in m.tool_calls]) for m in request.messages
        )
        reply = turn.text + json.dumps([c.model_dump() for c in calls]) if calls else turn.text
        return ModelResponse(
            text=turn.text,
            tool_calls=calls,
            usage=Usage(input_tokens=estimate_tokens(prompt), output_tokens=estimate_tokens(reply)),
            model=self._name,
        )
