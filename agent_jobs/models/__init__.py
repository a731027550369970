"""Model adapters behind one interface."""

from .base import DeltaSink, Model, NullDeltaSink
from .scripted import ScriptedModel

__all__ = ["DeltaSink", "Model", "NullDeltaSink", "ScriptedModel"]
