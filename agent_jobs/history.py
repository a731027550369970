"""A bounded history: threads grow for months; the model request does not grow with them.

`SlidingWindowHistory` keeps the newest messages that fit a message count, a token
budget, or both. `select` is pure and runs outside any checkpoint (its input, the
`load:thread` result, already is one). With `summarize`, what the window left out is
folded into a leading system message made by a model, inside `history:summarize`, so a
resumed run reads the summary back instead of asking again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .messages import Message, ModelRequest, ModelResponse
from .models.base import Model, NullDeltaSink

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
SUMMARY_PROMPT = (
    "Summarise the conversation below for the assistant that continues it: the user's "
    "goals, facts established, decisions made and anything still open. Be brief."
)


def estimate_tokens(message: Message) -> int:
    """A message's size in tokens, estimated as characters / 4."""
    calls = json.dumps([c.model_dump() for c in message.tool_calls]) if message.tool_calls else ""
    return max(1, (len(message.content) + len(calls)) // 4)


@dataclass(frozen=True)
class Window:
    kept: list[Message]
    dropped: list[Message]


class ModelSummarizer:
    """Summarises messages with a model; its usage is recorded as a `summary` row."""

    def __init__(self, model: Model, prompt: str = SUMMARY_PROMPT) -> None:
        self.model = model
        self.prompt = prompt

    def summarize(self, run_id: str, agent: str, messages: Sequence[Message]) -> ModelResponse:
        transcript = "\n".join(f"{m.role}: {m.content}" for m in messages if m.content)
        request = ModelRequest(
            run_id=run_id,
            agent=agent,
            step=0,
            system=self.prompt,
            messages=[Message(role="user", content=transcript)],
        )
        return self.model.run_turn(request, NullDeltaSink())


def summarize_with_model(model: Model, prompt: str = SUMMARY_PROMPT) -> ModelSummarizer:
    return ModelSummarizer(model, prompt)


class SlidingWindowHistory:
    """Keep the newest messages that fit; optionally summarise the rest."""

    def __init__(
        self,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        summarize: ModelSummarizer | None = None,
    ) -> None:
        if max_messages is None and max_tokens is None:
            raise ValueError("a window needs max_messages, max_tokens or both")
        self.max_messages = max_messages
        self.max_tokens = max_tokens
        self.summarizer = summarize

    @property
    def message_limit(self) -> int | None:
        """The bound a store may apply when it reads the thread.

        None when the window summarises (the summary needs what the window drops) or
        budgets tokens (no row count follows from a token budget).
        """
        if self.summarizer is not None or self.max_tokens is not None:
            return None
        return self.max_messages

    def select(self, messages: Sequence[Message]) -> Window:
        """Split into what rides the request and what is left out. Pure."""
        kept: list[Message] = []
        tokens = 0
        for message in reversed(messages):
            if self.max_messages is not None and len(kept) >= self.max_messages:
                break
            cost = estimate_tokens(message)
            if self.max_tokens is not None and kept and tokens + cost > self.max_tokens:
                break
            kept.append(message)
            tokens += cost
        kept.reverse()
        # A tool result without the assistant message that asked for it cannot be sent.
        while kept and kept[0].role == "tool":
            kept.pop(0)
        return Window(kept=kept, dropped=list(messages[: len(messages) - len(kept)]))


def summary_message(text: str) -> Message:
    return Message(role="system", content=SUMMARY_PREFIX + text)
