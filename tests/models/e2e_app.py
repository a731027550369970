"""The app the durable end-to-end tests (and `bench/adapters.py`) run on real workers.

Its agents use the real adapters, configured the way a deployment configures them: a
model string, and the provider settings from the worker's environment, which the
tests point at the fake provider:

    AGENT_JOBS_APP=e2e_app:app   (with tests/models on PYTHONPATH)
    AGENT_JOBS_OPENAI_BASE_URL=http://127.0.0.1:<port>/v1   AGENT_JOBS_OPENAI_API_KEY=…
    AGENT_JOBS_ANTHROPIC_BASE_URL=http://127.0.0.1:<port>   AGENT_JOBS_ANTHROPIC_API_KEY=…

`app` is built on first access, so importing this module needs no environment; a
test process builds its own copy with `build_app(settings)`.
"""

from __future__ import annotations

import time
from typing import Any

from agent_jobs import AgentApp
from agent_jobs.models.base import Model
from agent_jobs.models.registry import ProviderSettings, resolve_model
from agent_jobs.tools import ToolContext

OPENAI_MODEL = "openai:gpt-4.1-mini"
# Not claude-sonnet-4-5: the SDK flags it deprecated (end of life 2026-11-30) with a
# DeprecationWarning on every call, which the tests' `filterwarnings = error` turns into
# a failure when a model runs in the test process (the inline tests).
ANTHROPIC_MODEL = "anthropic:claude-haiku-4-5"
MODELS = {"openai": OPENAI_MODEL, "anthropic": ANTHROPIC_MODEL}

# The first read is the slow one: the second finishes first, yet the results must go
# back to the model (and into the thread) in call order.
SLOW_ORDER = "42"
SLOW_SECONDS = 0.4


def build_app(settings: ProviderSettings | None = None) -> AgentApp:
    """The app; its models come from `settings`, or from the environment when None."""
    app = AgentApp(roles={"user-7": ["support"], "alice": ["lead"]}, name="e2e")

    @app.tool(kind="read")
    def lookup_order(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Look up an order."""
        if order_id == SLOW_ORDER:
            time.sleep(SLOW_SECONDS)
        status = "lost" if order_id == SLOW_ORDER else "delivered"
        return {"order_id": order_id, "status": status}

    @app.tool(kind="action", roles=["support"], approvers=["lead"])
    def refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order."""
        return {"order_id": order_id, "refunded": amount, "key": ctx.idempotency_key}

    def model(spec: str) -> Model | str:
        # With no settings given, the model string itself goes to `app.agent`, which
        # resolves it from the environment: the path a deployment takes.
        return spec if settings is None else resolve_model(spec, settings=settings)

    for provider, spec in MODELS.items():
        # With tools: a read fan-out, then an action that waits for an approver.
        app.agent(
            provider,
            model=model(spec),
            system="You are a support agent.",
            tools=["lookup_order", "refund"],
        )
        # Text only: the crash test and the benchmark.
        app.agent(f"{provider}-chat", model=model(spec), system="Answer briefly.")
    return app


_app: AgentApp | None = None


def __getattr__(name: str) -> AgentApp:
    """`app`, built from the environment on first access (the workers' `AGENT_JOBS_APP`)."""
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = build_app()
    return _app
