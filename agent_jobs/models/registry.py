"""Models by name: `resolve_model("openai:gpt-4.1-mini")` and the provider settings behind it."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import (
    SettingsConfigDict,
)

from ..errors import ConfigurationError
from ..settings import SettingsBase
from .base import Model
from .pricing import PriceSource, PriceTable, load_price_table

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"


def _key(name: str, fallback: str) -> Any:
    """A secret read from `AGENT_JOBS_<name>`, else from the provider's usual variable."""
    return Field(default=None, validation_alias=AliasChoices(f"AGENT_JOBS_{name}", fallback))


class ProviderSettings(SettingsBase):
    """Where the real models live and how to call them.

    Read like the main settings: the environment (prefix `AGENT_JOBS_`; API keys also
    from the provider's usual variable), then `.env`, then `config/agent_jobs.toml`.
    """

    model_config = SettingsBase.model_config | SettingsConfigDict(populate_by_name=True)

    model: str | None = Field(default=None, description="`provider:model` the CLI runs on")
    openai_api_key: SecretStr | None = _key("OPENAI_API_KEY", "OPENAI_API_KEY")
    openai_base_url: str | None = None
    anthropic_api_key: SecretStr | None = _key("ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY")
    anthropic_base_url: str | None = None
    anthropic_cache: bool = Field(
        default=True, description="Anthropic prompt caching (agent_jobs/models/anthropic.py)"
    )
    openrouter_api_key: SecretStr | None = _key("OPENROUTER_API_KEY", "OPENROUTER_API_KEY")
    openrouter_base_url: str = OPENROUTER_BASE_URL
    litellm_api_key: SecretStr | None = _key("LITELLM_API_KEY", "LITELLM_API_KEY")
    litellm_base_url: str = "http://localhost:4000"
    ollama_base_url: str = "http://localhost:11434/v1"
    vllm_api_key: SecretStr | None = _key("VLLM_API_KEY", "VLLM_API_KEY")
    vllm_base_url: str = "http://localhost:8000/v1"
    model_timeout: float = Field(default=60.0, gt=0)
    model_max_tokens: int | None = Field(default=None, gt=0)
    reasoning_effort: str | None = None
    price_table: str | None = None


# Providers served by the OpenAI-compatible adapter, and whether they need a key.
_OPENAI_COMPATIBLE: dict[str, bool] = {
    "openai": True,
    "openrouter": True,
    "litellm": False,
    "ollama": False,
    "vllm": False,
}
PROVIDERS: tuple[str, ...] = ("anthropic", *_OPENAI_COMPATIBLE)


def _require_sdk(sdk: str, spec: str) -> None:
    """Refuse, in one line naming the extra, a model whose provider's SDK is not installed
    (the SDKs are extras: most deployments need one provider, some none)."""
    try:
        importlib.import_module(sdk)
    except ImportError:
        raise ConfigurationError(
            f"model {spec!r} needs the {sdk} SDK: pip install 'agent-jobs[{sdk}]'"
        ) from None


def resolve_model(
    spec: str,
    *,
    settings: ProviderSettings | None = None,
    base_url: str | None = None,
    api_key: str | SecretStr | None = None,
    timeout: float | None = None,
    max_tokens: int | None = None,
    reasoning_effort: str | None = None,
    temperature: float | None = None,
    prices: PriceSource | PriceTable = None,
) -> Model:
    """A model adapter for `provider:model`, configured from settings and the overrides.

    The model id is everything after the first colon, so `ollama:llama3.1:8b` works.
    `temperature` reaches OpenAI-compatible servers only: the Anthropic API refuses it.
    """
    provider, sep, model = spec.strip().partition(":")
    provider = provider.lower()
    if not sep or not model:
        raise ConfigurationError(
            f"model {spec!r} is not `provider:model` (for example `openai:gpt-4.1-mini`); "
            f"providers: {', '.join(PROVIDERS)}"
        )
    if provider not in PROVIDERS:
        raise ConfigurationError(
            f"unknown model provider {provider!r} in {spec!r}; known: {', '.join(PROVIDERS)}"
        )
    s = settings if settings is not None else ProviderSettings()
    table = prices if isinstance(prices, PriceTable) else load_price_table(prices or s.price_table)
    seconds = timeout if timeout is not None else s.model_timeout
    tokens = max_tokens if max_tokens is not None else s.model_max_tokens
    effort = reasoning_effort if reasoning_effort is not None else s.reasoning_effort
    key = api_key if api_key is not None else getattr(s, f"{provider}_api_key", None)
    # Each adapter is imported when first asked for: the SDKs take a second or two to load,
    # which the CLI should not pay when no real model is configured.
    if provider == "anthropic":
        _require_sdk("anthropic", spec)
        from .anthropic import AnthropicModel

        _require_key(provider, key)
        return AnthropicModel(
            model,
            api_key=key,
            base_url=base_url or s.anthropic_base_url,
            timeout=seconds,
            max_tokens=tokens,
            reasoning_effort=effort,
            prices=table,
            prompt_cache=s.anthropic_cache,
        )
    if _OPENAI_COMPATIBLE[provider]:
        _require_key(provider, key)
    _require_sdk("openai", spec)
    from .openai_compat import OpenAICompatModel

    url = base_url or getattr(s, f"{provider}_base_url")
    return OpenAICompatModel(
        model,
        api_key=key,
        base_url=url,
        provider=provider,
        timeout=seconds,
        max_tokens=tokens,
        reasoning_effort=effort,
        temperature=temperature,
        # OpenAI's reasoning models refuse `max_tokens`; other servers know only it.
        max_tokens_param="max_completion_tokens" if provider == "openai" else "max_tokens",
        # OpenRouter reports the real cost of the call only when asked.
        extra_body={"usage": {"include": True}} if provider == "openrouter" else None,
        prices=table,
    )


def _require_key(provider: str, key: str | SecretStr | None) -> None:
    value = key.get_secret_value() if isinstance(key, SecretStr) else key
    if not value:
        upper = provider.upper()
        raise ConfigurationError(
            f"no API key for {provider}: set AGENT_JOBS_{upper}_API_KEY or {upper}_API_KEY"
        )


def default_model_from_settings(settings: ProviderSettings | None = None) -> Model | None:
    """The model named by `AGENT_JOBS_MODEL`, or None when it is not set."""
    s = settings if settings is not None else ProviderSettings()
    if not s.model:
        return None
    return resolve_model(s.model, settings=s)
