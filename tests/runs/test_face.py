"""The package's face: what `agent_jobs` exports, and how the app is loaded."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent_jobs
from agent_jobs.demo import SupportDemoModel
from agent_jobs.errors import ConfigurationError
from agent_jobs.loading import load_app
from agent_jobs.models.openai_compat import OpenAICompatModel

ROOT = Path(__file__).resolve().parents[2]


def close(model: object) -> None:
    closer = getattr(model, "close", None)
    if callable(closer):
        closer()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No AGENT_JOBS_ setting or provider key from the machine, and no `.env` file."""
    for name in list(os.environ):
        if name.startswith("AGENT_JOBS_") or name.endswith("_API_KEY"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield


def test_every_exported_name_is_importable() -> None:
    assert len(agent_jobs.__all__) == len(set(agent_jobs.__all__))
    for name in agent_jobs.__all__:
        assert getattr(agent_jobs, name) is not None, name
    namespace: dict[str, object] = {}
    exec(f"from agent_jobs import {', '.join(agent_jobs.__all__)}", namespace)
    assert set(agent_jobs.__all__) <= set(namespace)


def test_step_rejected_error_is_exported() -> None:
    # A run can end with it: a pre-step listener refused the next step.
    assert "StepRejectedError" in agent_jobs.__all__
    from agent_jobs import StepRejectedError, TurnError

    assert issubclass(StepRejectedError, TurnError)


def test_load_app_is_public() -> None:
    assert "load_app" in agent_jobs.__all__
    assert agent_jobs.load_app is load_app


def _imported_after(statement: str) -> set[str]:
    """The `agent_jobs` modules a fresh interpreter holds after running `statement`."""
    listing = "print(' '.join(m for m in sys.modules if m.startswith('agent_jobs')))"
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\n{statement}\n{listing}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("statement", ["import agent_jobs.app", "import agent_jobs.loading"])
def test_the_app_module_does_not_import_the_demo(statement: str) -> None:
    modules = _imported_after(statement)
    assert "agent_jobs.app" in modules
    assert "agent_jobs.demo" not in modules


def test_only_loading_the_demo_imports_it() -> None:
    modules = _imported_after(
        "import os\n"
        "for k in [k for k in os.environ if k.startswith('AGENT_JOBS_')]: del os.environ[k]\n"
        "from agent_jobs import load_app\n"
        "load_app(None)"
    )
    assert "agent_jobs.demo" in modules


@pytest.mark.usefixtures("clean_env")
def test_the_demo_is_built_on_each_load_and_never_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = load_app(None)
    first = scripted.get_agent("support").model
    assert isinstance(first, SupportDemoModel)

    monkeypatch.setenv("AGENT_JOBS_MODEL", "ollama:llama3.1")
    monkeypatch.setenv("AGENT_JOBS_OLLAMA_BASE_URL", "http://127.0.0.1:9/v1")
    real = load_app(None)
    second = real.get_agent("support").model
    try:
        assert isinstance(second, OpenAICompatModel)
        assert second.name == "ollama:llama3.1"
        assert real is not scripted
        assert real.get_agent("support") is not scripted.get_agent("support")
        # Loading the demo on another model left the first app as it was.
        assert scripted.get_agent("support").model is first
        assert sorted(real.registry.names()) == sorted(scripted.registry.names())

        monkeypatch.setenv("AGENT_JOBS_MODEL", "ollama:qwen3")
        other = load_app(None)
        third = other.get_agent("support").model
        try:
            assert third.name == "ollama:qwen3"
            assert real.get_agent("support").model is second
        finally:
            close(third)
    finally:
        close(second)


@pytest.mark.usefixtures("clean_env")
def test_an_unusable_model_keeps_the_demo_scripted_unless_strict(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AGENT_JOBS_MODEL", "openai:gpt-4.1-mini")  # no key anywhere
    with caplog.at_level(logging.WARNING, logger="agent_jobs"):
        app = load_app(None)
    assert isinstance(app.get_agent("support").model, SupportDemoModel)
    assert "the demo stays scripted" in caplog.text
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        load_app(None, strict_model=True)


def test_the_demo_module_has_no_shared_app() -> None:
    demo = importlib.import_module("agent_jobs.demo")
    assert not hasattr(demo, "app")
