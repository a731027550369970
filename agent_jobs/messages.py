"""Neutral model messages: what the loop hands to any model adapter and gets back."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form hashes and signatures are taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_sha256(args: dict[str, Any]) -> str:
    """Hex SHA-256 of a call's arguments, as sent in an `approval_request` frame."""
    return hashlib.sha256(canonical_json(args).encode("utf-8")).hexdigest()


class ToolCall(BaseModel):
    """A tool call the model asked for."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    """One neutral message. Tool results are `role="tool"` with `tool_call_id`."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


class Usage(BaseModel):
    """Token usage of one model call, and its cost when it is known.

    `input_tokens` counts every input token, those read from or written to a provider's
    prompt cache included; `cache_read_tokens` and `cache_write_tokens` say how many of
    them were (a provider that reports none leaves them 0).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float | None = None
    # "provider" when the gateway reported the real cost, "price_table" when computed.
    cost_source: Literal["provider", "price_table"] | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ToolSpec(BaseModel):
    """A tool as a model sees it: name, description and JSON schema of its input."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ModelSettings(BaseModel):
    """Per-request knobs a model adapter may honour."""

    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    temperature: float | None = None


class ModelRequest(BaseModel):
    """Everything one model call needs; serialisable so it can be journaled."""

    run_id: str
    agent: str
    step: int  # 0-based index of this model call within the run
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    settings: ModelSettings = Field(default_factory=ModelSettings)


class ModelResponse(BaseModel):
    """The assembled reply of one model call."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
