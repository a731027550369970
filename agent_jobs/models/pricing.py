"""Model prices: what a call cost when the provider does not say.

Prices are USD per million tokens, input and output. The built-in table is a
snapshot of list prices and goes stale; override or extend it with a TOML or
JSON file (setting `AGENT_JOBS_PRICE_TABLE`) or a dict::

    # prices.toml
    ["gpt-4.1-mini"]
    input = 0.40
    output = 1.60

    # prices.json
    {"gpt-4.1-mini": {"input": 0.40, "output": 1.60}}

Input tokens written to a provider's prompt cache and read from it are billed at other
prices: by default 1.25 times the input price for a write (Anthropic's 5-minute cache)
and 0.1 times for a read; an entry may give its own (`cache_write`, `cache_read`, USD
per million tokens).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigurationError
from ..messages import Usage

# What a prompt-cache write and read cost, as a multiple of the input price, where an
# entry gives no price of its own: Anthropic's 5-minute cache bills a write at 1.25x and
# a read at 0.1x.
CACHE_WRITE_FACTOR = 1.25
CACHE_READ_FACTOR = 0.1


class ModelPrice(BaseModel):
    """USD per million input and output tokens, and per million input tokens written to
    and read from the prompt cache (by default 1.25x and 0.1x the input price)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float
    output: float
    cache_write: float | None = None
    cache_read: float | None = None

    @property
    def cache_write_price(self) -> float:
        return self.cache_write if self.cache_write is not None else self.input * CACHE_WRITE_FACTOR

    @property
    def cache_read_price(self) -> float:
        return self.cache_read if self.cache_read is not None else self.input * CACHE_READ_FACTOR


BUILTIN_PRICES: Mapping[str, ModelPrice] = {
    model: ModelPrice(input=price_in, output=price_out, cache_read=cached)
    for model, (price_in, price_out, cached) in {
        # OpenAI: a cached input token at its own price; writing the cache costs nothing.
        "gpt-4.1": (2.00, 8.00, 0.50),
        "gpt-4.1-mini": (0.40, 1.60, 0.10),
        "gpt-4.1-nano": (0.10, 0.40, 0.025),
        "gpt-4o": (2.50, 10.00, 1.25),
        "gpt-4o-mini": (0.15, 0.60, 0.075),
        "o3": (2.00, 8.00, 0.50),
        "o4-mini": (1.10, 4.40, 0.275),
        # Anthropic: the cache's default factors of the input price (ModelPrice).
        "claude-opus-4-1": (15.00, 75.00, None),
        "claude-opus-4": (15.00, 75.00, None),
        "claude-sonnet-4-5": (3.00, 15.00, None),
        "claude-sonnet-4": (3.00, 15.00, None),
        "claude-haiku-4-5": (1.00, 5.00, None),
        "claude-3-5-haiku": (0.80, 4.00, None),
    }.items()
}

# Dated snapshots ("gpt-4.1-mini-2025-04-14", "claude-sonnet-4-5-20250929") cost what
# their alias costs.
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")

PriceSource = str | Path | Mapping[str, Any] | None


class PriceTable:
    """Looks a model's price up and turns token counts into USD."""

    def __init__(self, prices: Mapping[str, ModelPrice] | None = None) -> None:
        self._prices = dict(BUILTIN_PRICES if prices is None else prices)

    def __repr__(self) -> str:
        return f"PriceTable({len(self._prices)} models)"

    def price_for(self, model: str) -> ModelPrice | None:
        """The price of `model`, trying it bare of a `vendor/` prefix and a date suffix."""
        candidates = [model]
        if "/" in model:  # OpenRouter and LiteLLM ids: "openai/gpt-4.1-mini"
            candidates.append(model.rsplit("/", 1)[1])
        candidates += [_DATE_SUFFIX.sub("", name) for name in candidates]
        for name in candidates:
            price = self._prices.get(name)
            if price is not None:
                return price
        return None

    def cost(
        self,
        model: str,
        input_tokens: int,
        output_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> float | None:
        """USD for the tokens, or None when the model is not in the table. `input_tokens`
        counts every input token; of them, `cache_read_tokens` and `cache_write_tokens`
        are billed at the cache's prices, the rest at the input price."""
        price = self.price_for(model)
        if price is None:
            return None
        uncached = max(0, input_tokens - cache_read_tokens - cache_write_tokens)
        total = (
            uncached * price.input
            + cache_write_tokens * price.cache_write_price
            + cache_read_tokens * price.cache_read_price
            + output_tokens * price.output
        ) / 1_000_000
        return round(total, 10)

    def merged(self, overrides: Mapping[str, ModelPrice]) -> PriceTable:
        """A copy of this table with `overrides` replacing or adding entries."""
        return PriceTable({**self._prices, **overrides})


def load_price_table(source: PriceSource = None) -> PriceTable:
    """The built-in table, with the entries of a TOML/JSON file or a dict on top."""
    if source is None or source == "":
        return PriceTable()
    raw = source if isinstance(source, Mapping) else _read_file(Path(source))
    try:
        overrides = {str(model): ModelPrice.model_validate(entry) for model, entry in raw.items()}
    except ValidationError as exc:
        raise ConfigurationError(
            f"price table: each model needs `input` and `output` in USD per million tokens: {exc}"
        ) from exc
    return PriceTable().merged(overrides)


def _read_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"price table {str(path)!r} cannot be read: {exc}") from exc
    try:
        data: Any = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"price table {str(path)!r} is not valid: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"price table {str(path)!r} must map model ids to prices")
    return data


def priced_usage(
    input_tokens: int,
    output_tokens: int,
    *,
    model: str,
    provider_cost: float | None,
    prices: PriceTable | None,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> Usage:
    """Usage with its cost: the provider's when reported, else the price table's, else
    None. `input_tokens` counts every input token, the cache's included."""
    counts = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
    )
    if provider_cost is not None:
        return counts.model_copy(update={"cost": provider_cost, "cost_source": "provider"})
    cost = (
        prices.cost(
            model,
            input_tokens,
            output_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
        )
        if prices is not None
        else None
    )
    source = "price_table" if cost is not None else None
    return counts.model_copy(update={"cost": cost, "cost_source": source})
