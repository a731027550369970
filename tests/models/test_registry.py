"""`resolve_model`, `ProviderSettings` and `default_model_from_settings`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeprovider import API_KEY, FakeProvider, RecordingSink, Reply, make_request, openai_stream

from agent_jobs.errors import ConfigurationError
from agent_jobs.models.anthropic import AnthropicModel
from agent_jobs.models.openai_compat import OpenAICompatModel
from agent_jobs.models.registry import (
    OPENROUTER_BASE_URL,
    ProviderSettings,
    default_model_from_settings,
    resolve_model,
)

_VARIABLES = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENROUTER_API_KEY",
    "LITELLM_API_KEY",
    "VLLM_API_KEY",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No provider variable from the machine, and no `.env` file, leaks into a test."""
    import os

    for name in list(os.environ):
        if name.startswith("AGENT_JOBS_") or name in _VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield


def test_openai_takes_its_key_from_the_usual_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-usual-0000")
    model = resolve_model("openai:gpt-4.1-mini")
    assert isinstance(model, OpenAICompatModel)
    assert model.name == "openai:gpt-4.1-mini"
    assert model.client().api_key == "sk-usual-0000"
    # OpenAI's reasoning models accept only `max_completion_tokens`.
    assert model.max_tokens_param == "max_completion_tokens"
    model.close()


def test_the_prefixed_key_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-usual-0000")
    monkeypatch.setenv("AGENT_JOBS_OPENAI_API_KEY", "sk-ours-1111")
    monkeypatch.setenv("AGENT_JOBS_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = resolve_model("openai:gpt-4.1-mini")
    assert isinstance(model, OpenAICompatModel)
    assert model.client().api_key == "sk-ours-1111"
    assert model.base_url == "http://127.0.0.1:9/v1"
    model.close()


def test_anthropic_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    monkeypatch.setenv("AGENT_JOBS_ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AGENT_JOBS_MODEL_TIMEOUT", "12.5")
    monkeypatch.setenv("AGENT_JOBS_MODEL_MAX_TOKENS", "1000")
    monkeypatch.setenv("AGENT_JOBS_REASONING_EFFORT", "low")
    model = resolve_model("anthropic:claude-sonnet-4-5")
    assert isinstance(model, AnthropicModel)
    assert (model.name, model.base_url) == ("anthropic:claude-sonnet-4-5", "http://127.0.0.1:9")
    assert (model.timeout, model.max_tokens, model.reasoning_effort) == (12.5, 1000, "low")
    assert API_KEY not in repr(model)


def test_overrides_beat_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_JOBS_MODEL_TIMEOUT", "12.5")
    model = resolve_model(
        "anthropic:claude-haiku-4-5",
        api_key="sk-override-2222",
        base_url="http://127.0.0.1:8",
        timeout=3,
        max_tokens=64,
        reasoning_effort="high",
    )
    assert isinstance(model, AnthropicModel)
    assert (model.base_url, model.timeout, model.max_tokens) == ("http://127.0.0.1:8", 3, 64)
    assert model.reasoning_effort == "high"


@pytest.mark.parametrize(
    ("spec", "provider", "model_id", "base_url"),
    [
        ("ollama:llama3.1:8b", "ollama", "llama3.1:8b", "http://localhost:11434/v1"),
        ("vllm:Qwen/Qwen2.5-7B", "vllm", "Qwen/Qwen2.5-7B", "http://localhost:8000/v1"),
        ("litellm:claude-haiku", "litellm", "claude-haiku", "http://localhost:4000"),
    ],
)
def test_local_servers_need_no_key(spec: str, provider: str, model_id: str, base_url: str) -> None:
    model = resolve_model(spec)
    assert isinstance(model, OpenAICompatModel)
    assert (model.provider, model.model, model.base_url) == (provider, model_id, base_url)
    assert model.max_tokens_param == "max_tokens"


def test_openrouter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", API_KEY)
    model = resolve_model("openrouter:anthropic/claude-sonnet-4.5")
    assert isinstance(model, OpenAICompatModel)
    assert model.base_url == OPENROUTER_BASE_URL
    assert model.extra_body == {"usage": {"include": True}}


@pytest.mark.parametrize("spec", ["mistral:large", "gpt-4.1-mini", "openai:", ""])
def test_bad_specs_are_configuration_errors(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="openai, openrouter"):
        resolve_model(spec, api_key="sk-x-0000")


@pytest.mark.parametrize("provider", ["openai", "anthropic", "openrouter"])
def test_a_missing_key_says_where_to_put_it(provider: str) -> None:
    upper = provider.upper()
    with pytest.raises(ConfigurationError, match=f"AGENT_JOBS_{upper}_API_KEY or {upper}_API_KEY"):
        resolve_model(f"{provider}:some-model")


def test_default_model_is_none_without_a_setting() -> None:
    assert default_model_from_settings() is None


def test_default_model_from_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_JOBS_MODEL", "anthropic:claude-haiku-4-5")
    monkeypatch.setenv("AGENT_JOBS_ANTHROPIC_API_KEY", API_KEY)
    model = default_model_from_settings()
    assert isinstance(model, AnthropicModel)
    assert model.name == "anthropic:claude-haiku-4-5"


def test_settings_from_a_dotenv_file(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(f"AGENT_JOBS_MODEL=openai:gpt-4.1\nOPENAI_API_KEY={API_KEY}\n")
    settings = ProviderSettings()
    assert settings.model == "openai:gpt-4.1"
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == API_KEY
    assert API_KEY not in repr(settings)


def test_the_price_table_setting_prices_calls(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = tmp_path / "prices.toml"
    table.write_text('["house-model"]\ninput = 1.0\noutput = 2.0\n')
    monkeypatch.setenv("AGENT_JOBS_PRICE_TABLE", str(table))
    model = resolve_model("vllm:house-model", base_url=f"{fake.url}/v1")
    assert isinstance(model, OpenAICompatModel)
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "house-model"}
    done = {**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}
    usage = {**chunk, "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}
    fake.add(Reply(chunks=openai_stream([done, usage])))
    try:
        response = model.run_turn(make_request(), RecordingSink())
    finally:
        model.close()
    # 1000 * $1/M + 500 * $2/M
    assert response.usage.cost == pytest.approx(0.002)
    assert response.usage.cost_source == "price_table"


def test_settings_from_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "agent_jobs.toml").write_text(
        'model = "ollama:llama3.1"\nmodel_timeout = 7\nollama_base_url = "http://127.0.0.1:9/v1"\n'
    )
    monkeypatch.setenv("AGENT_JOBS_MODEL_TIMEOUT", "8")  # the environment wins
    model = default_model_from_settings()
    assert isinstance(model, OpenAICompatModel)
    assert (model.name, model.base_url, model.timeout) == (
        "ollama:llama3.1",
        "http://127.0.0.1:9/v1",
        8,
    )


@pytest.mark.parametrize(
    ("spec", "sdk"),
    [("openai:gpt-4.1-mini", "openai"), ("ollama:llama3", "openai"), ("anthropic:x", "anthropic")],
)
def test_a_model_whose_sdk_is_missing_names_the_extra_to_install(
    spec: str, sdk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDKs are extras: a plain install has neither (a third of its size once)."""
    import sys

    monkeypatch.setitem(sys.modules, sdk, None)  # as good as not installed
    with pytest.raises(ConfigurationError) as refused:
        resolve_model(spec, api_key="k")
    assert str(refused.value) == (
        f"model {spec!r} needs the {sdk} SDK: pip install 'agent-jobs[{sdk}]'"
    )
