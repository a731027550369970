"""Model adapters behind one interface.

The OpenAI-compatible and Anthropic adapters import their SDKs only when used:
`agent_jobs.models.openai_compat.OpenAICompatModel`,
`agent_jobs.models.anthropic.AnthropicModel`, or `resolve_model("provider:model")`.
"""

from .base import DeltaSink, Model, NullDeltaSink
from .registry import resolve_model
from .scripted import ScriptedModel

__all__ = ["DeltaSink", "Model", "NullDeltaSink", "ScriptedModel", "resolve_model"]
