"""agent-jobs: durable agent-loop jobs on Celery, Postgres and Redis.

The public API is what this package re-exports (`__all__`, grouped below by who needs
it), and these modules, which users import directly:

- `agent_jobs.client`: start, read, steer and decide on runs from any process
  (`enqueue_run`, `events`, `status`, `wait`, `post_message`, `cancel`, …);
- `agent_jobs.models.*`: the model adapters (`agent_jobs.models.openai_compat`,
  `agent_jobs.models.anthropic`) and `agent_jobs.models.resolve_model`;
- `agent_jobs.diagnostics`: `subscribe(listener)` to a run's diagnostic events;
- `agent_jobs.streams`: the live stream's frames (`assemble_text`, `TextAssembler`);
- `agent_jobs.session`: folds over a thread's events (`fold_consumed_work`);
- `agent_jobs.startup`: `start(store, settings)`, what a process that drives runs starts
  beside its work (notifications, diagnostics, tracing);
- `agent_jobs.schedules.ticker`: `start_ticker`, a process of yours with an
  `InlineRunner` ticking the app's schedules (docs/schedules.md);
- `agent_jobs.prestep` and `agent_jobs.request_errors`: the types of `@app.before_step`
  listeners (`PreStepDecision`) and `@app.on_request_error` middlewares.

Every other module (the runners' internals, the store, the executor, the CLI, the
loading of the app, the bundled demo, …) is internal and may change without notice.
"""

from .app import AgentApp, AgentOptions, AgentSpec, Persona
from .checkpoints import Decision
from .errors import (
    AgentJobsError,
    AppLoadError,
    ApprovalError,
    ConfigurationError,
    ControlRefusedError,
    DecisionRefusedError,
    InvalidRequestError,
    MaxStepsExceededError,
    ModelError,
    NonDeterminismError,
    QuotaExceededError,
    ReconcileRefusedError,
    RunAbandonedError,
    ScheduleError,
    SchemaNotReadyError,
    StepFailedError,
    StepRejectedError,
    StoreError,
    ThreadBusyError,
    ToolError,
    ToolInputError,
    ToolNotPermittedError,
    TurnError,
    UnknownAgentError,
    UnknownCallError,
    UnknownRunError,
    UnknownScheduleError,
    UnknownToolError,
)
from .history import SlidingWindowHistory, summarize_with_model
from .hooks import LoopHooks
from .loading import load_app
from .loop import LoopDeps, TurnInput, TurnResult, run_agent_loop
from .messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from .models import DeltaSink, Model, ScriptedModel
from .runners import InlineRunner
from .schedules import Schedule
from .settings import Settings, get_settings
from .store import RunView, Store
from .tools import ReconcileContext, ToolContext

__all__ = [  # noqa: RUF022 (grouped by purpose; sorted within each group)
    # Defining agents: the app, its agents, personas and tools, models, messages.
    "AgentApp",
    "AgentOptions",
    "AgentSpec",
    "DeltaSink",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Persona",
    "ReconcileContext",
    "Schedule",
    "ScriptedModel",
    "SlidingWindowHistory",
    "ToolCall",
    "ToolContext",
    "ToolSpec",
    "Usage",
    "summarize_with_model",
    # Running: the inline runner, the store and its views, the settings, the app.
    "InlineRunner",
    "RunView",
    "Settings",
    "Store",
    "get_settings",
    "load_app",
    # Errors: what a call raises, or what a run ends with.
    "AgentJobsError",
    "AppLoadError",
    "ApprovalError",
    "ConfigurationError",
    "ControlRefusedError",
    "DecisionRefusedError",
    "InvalidRequestError",
    "MaxStepsExceededError",
    "ModelError",
    "NonDeterminismError",
    "QuotaExceededError",
    "ReconcileRefusedError",
    "RunAbandonedError",
    "ScheduleError",
    "SchemaNotReadyError",
    "StepFailedError",
    "StepRejectedError",
    "StoreError",
    "ThreadBusyError",
    "ToolError",
    "ToolInputError",
    "ToolNotPermittedError",
    "TurnError",
    "UnknownAgentError",
    "UnknownCallError",
    "UnknownRunError",
    "UnknownScheduleError",
    "UnknownToolError",
    # For runner authors: the pure loop, and the hooks its side effects go through.
    "Decision",
    "LoopDeps",
    "LoopHooks",
    "TurnInput",
    "TurnResult",
    "run_agent_loop",
]
