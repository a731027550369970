"""What `AGENT_JOBS_RATE_LIMITS` says: per model key, requests and tokens per minute.

The setting is a JSON object (or a TOML table) of model keys to limits:
`{"openai:*": {"requests_per_minute": 500, "tokens_per_minute": 90000}}`. A key is
matched against the `provider:model` a request goes to; `*` stands for any run of
characters (`:` and `/` included), everything else is literal, and the first key that
matches wins, in the order written. Every model a key matches shares that key's limits
and its pause.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

EXAMPLE = '{"openai:*": {"requests_per_minute": 500, "tokens_per_minute": 90000}}'


class RateLimit(BaseModel):
    """A key's limits; either may be left out (not limited), both too (the key is only
    paused by a 429)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


def parse(value: object) -> object:
    """The setting as pydantic validates it: JSON text becomes a mapping (an empty text
    is no limits); a mapping (from the TOML file) is taken as it is. A key must be a
    non-empty glob."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"AGENT_JOBS_RATE_LIMITS is not JSON ({exc}); write an object of model keys "
                f"to limits, e.g. {EXAMPLE}"
            ) from None
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"AGENT_JOBS_RATE_LIMITS must be an object of model keys to limits, e.g. {EXAMPLE}"
        )
    for key in value:
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"AGENT_JOBS_RATE_LIMITS: a model key must be a glob, not {key!r}")
    return value


def pattern(key: str) -> re.Pattern[str]:
    """A key as a regular expression: `*` is any run of characters, the rest literal."""
    return re.compile(".*".join(re.escape(part) for part in key.split("*")), re.DOTALL)


@dataclass(frozen=True)
class Rule:
    """A key of the setting and its limits: one bucket and one pause for every model it
    matches."""

    key: str
    limit: RateLimit

    @property
    def requests_per_minute(self) -> float | None:
        return self.limit.requests_per_minute

    @property
    def tokens_per_minute(self) -> float | None:
        return self.limit.tokens_per_minute


class Rules:
    """The keys in the order written; `match` gives the first that matches a model."""

    def __init__(self, limits: Mapping[str, RateLimit]) -> None:
        self._rules = [(pattern(key), Rule(key, limit)) for key, limit in limits.items()]
        self._matched: dict[str, Rule | None] = {}

    def __bool__(self) -> bool:
        return bool(self._rules)

    def match(self, model: str) -> Rule | None:
        """The rule of the first key matching `model` (`provider:model`), or None."""
        if model not in self._matched:
            found = next((rule for glob, rule in self._rules if glob.fullmatch(model)), None)
            if len(self._matched) > 1024:  # model names come from a handful of agents
                self._matched.clear()
            self._matched[model] = found
        return self._matched[model]
