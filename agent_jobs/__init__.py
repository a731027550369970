"""agent-jobs: durable agent-loop jobs on Celery, Postgres and Redis."""

from .app import AgentApp, AgentOptions, AgentSpec, Persona, load_app
from .errors import (
    AgentJobsError,
    ApprovalError,
    ConfigurationError,
    DecisionRefusedError,
    InvalidRequestError,
    MaxStepsExceededError,
    ModelError,
    NonDeterminismError,
    QuotaExceededError,
    StepFailedError,
    ToolError,
    ToolInputError,
    ToolNotPermittedError,
    TurnError,
    UnknownAgentError,
    UnknownCallError,
    UnknownRunError,
    UnknownToolError,
)
from .history import SlidingWindowHistory, summarize_with_model
from .hooks import Decision, LoopHooks
from .loop import LoopDeps, TurnInput, TurnResult, run_agent_loop
from .messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from .models import DeltaSink, Model, ScriptedModel
from .runners.inline import InlineRunner
from .settings import Settings, get_settings
from .store import RunView, Store
from .tools import ToolContext

__all__ = [
    "AgentApp",
    "AgentJobsError",
    "AgentOptions",
    "AgentSpec",
    "ApprovalError",
    "ConfigurationError",
    "Decision",
    "DecisionRefusedError",
    "DeltaSink",
    "InlineRunner",
    "InvalidRequestError",
    "LoopDeps",
    "LoopHooks",
    "MaxStepsExceededError",
    "Message",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "NonDeterminismError",
    "Persona",
    "QuotaExceededError",
    "RunView",
    "ScriptedModel",
    "Settings",
    "SlidingWindowHistory",
    "StepFailedError",
    "Store",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolInputError",
    "ToolNotPermittedError",
    "ToolSpec",
    "TurnError",
    "TurnInput",
    "TurnResult",
    "UnknownAgentError",
    "UnknownCallError",
    "UnknownRunError",
    "UnknownToolError",
    "Usage",
    "get_settings",
    "load_app",
    "run_agent_loop",
    "summarize_with_model",
]
