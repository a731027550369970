"""The OpenTelemetry GenAI semantic conventions on a step's span (tracing.py): what a model
call asked for, which model answered and what it used and cost (`chat`), and which tool a
call ran (`execute_tool`).

They are worked out by the process that carried the step out, from the step's intent and
its result, and travel with the outcome to the pass that commits it, so the span that
carries them is made once, when the step commits, and never on a replay. Nothing is
worked out while tracing is off. The attribute names are the `opentelemetry-semantic-
conventions` package's constants.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..messages import ModelRequest, ModelSettings, ToolCall, Usage
from ..steps import Intent, InvokeTool, ModelTurn, Summarize
from . import tracing

if TYPE_CHECKING:
    from ..app import AgentApp

log = logging.getLogger(__name__)

Attributes = dict[str, str | int | float]
COST = "agent_jobs.cost_usd"


def attributes(app: AgentApp, intent: Intent | Mapping[str, Any] | None, result: Any) -> Attributes:
    """The GenAI attributes of a remote step's span: `intent` the step's (parsed, or as
    journaled), `result` what it returned (None when it failed). Empty while tracing is
    off, and for a step that is neither a model call nor a tool call."""
    if not tracing.enabled() or intent is None:
        return {}
    try:
        return _described(app, intent if isinstance(intent, Intent) else _light(intent), result)
    except Exception:  # a span's details never fail a step
        log.warning("could not describe a step for its span", exc_info=True)
    return {}


def _light(journaled: Mapping[str, Any]) -> Intent | None:
    """The journaled intent, parsed without its history (a model request's messages, the
    longest part of a run's journal, say nothing a span carries)."""
    kind = journaled.get("type")
    if kind == "model_turn":
        request = {**journaled["request"], "messages": [], "tools": []}
        return ModelTurn(request=ModelRequest.model_validate(request))
    if kind == "summarize":
        return Summarize.model_validate({**journaled, "messages": []})
    if kind == "invoke_tool":
        return InvokeTool.model_validate(journaled)
    return None


def _described(app: AgentApp, intent: Intent | None, result: Any) -> Attributes:
    if isinstance(intent, ModelTurn):
        request = intent.request
        return _chat(app, request.agent, request.settings, result)
    if isinstance(intent, Summarize):
        return _chat(app, intent.agent, None, result)
    if isinstance(intent, InvokeTool):
        return _tool(intent.call)
    return {}


def _chat(app: AgentApp, agent: str, settings: ModelSettings | None, result: Any) -> Attributes:
    """A model call's (`settings`: its request's; None for a summary)."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    found: Attributes = {gen_ai.GEN_AI_OPERATION_NAME: "chat"}
    provider, model = _asked(app, agent, settings)
    if provider:
        found[gen_ai.GEN_AI_PROVIDER_NAME] = provider
    if model:
        found[gen_ai.GEN_AI_REQUEST_MODEL] = model
    if not isinstance(result, Mapping):
        return found
    if isinstance(answered := result.get("model"), str) and answered:
        found[gen_ai.GEN_AI_RESPONSE_MODEL] = answered
    try:
        spent = Usage.model_validate(result.get("usage") or {})
    except ValidationError:
        return found
    found[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] = spent.input_tokens
    found[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] = spent.output_tokens
    # Only where the provider reports them: a zero would claim a cache was looked at.
    if spent.cache_read_tokens:
        found[gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = spent.cache_read_tokens
    if spent.cache_write_tokens:
        found[gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] = spent.cache_write_tokens
    if spent.cost is not None:
        found[COST] = spent.cost
    return found


def _asked(app: AgentApp, agent: str, settings: ModelSettings | None) -> tuple[str, str]:
    """The provider and the model a call went to: the adapter's `provider` and `model`
    where it has them, else the two halves of its name (`anthropic:claude-haiku-4-5`)."""
    from ..executor import model_of

    adapter: Any
    if settings is not None:
        request = ModelRequest(run_id="", agent=agent, step=0, system="", messages=[])
        adapter = model_of(app, request.model_copy(update={"settings": settings}))
    else:
        window = app.get_agent(agent).history
        adapter = window.summarizer.model if window and window.summarizer else None
    if adapter is None:
        return "", ""
    name = str(adapter.name)
    prefix, _, rest = name.partition(":")
    provider = getattr(adapter, "provider", None)
    model = (settings.model if settings is not None else None) or getattr(adapter, "model", None)
    return (
        provider if isinstance(provider, str) else prefix,
        model if isinstance(model, str) else (rest or name),
    )


def _tool(call: ToolCall) -> Attributes:
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    return {
        gen_ai.GEN_AI_OPERATION_NAME: "execute_tool",
        gen_ai.GEN_AI_TOOL_NAME: call.name,
        gen_ai.GEN_AI_TOOL_CALL_ID: call.id,
    }
