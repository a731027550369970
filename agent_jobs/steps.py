"""Steps are data: each side effect of the loop is a named, serialisable intent.

An intent says *what* to do; `executor.py` knows *how*. The inline runner executes
an intent at once; the durable runner journals it and lets a Celery task execute it.
Every intent names the type of its result, so both runners hand the loop the same
parsed value (the inline runner round-trips results through JSON as well).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, TypeAdapter

from .messages import Message, ModelRequest, ModelResponse, ModelSettings, ToolCall, Usage


class Intent(BaseModel):
    """Base of every intent. `remote` steps run in their own Celery task."""

    remote: ClassVar[bool] = False
    result_type: ClassVar[type[BaseModel]]


# --- results -------------------------------------------------------------------------


class Done(BaseModel):
    """A step with nothing to report."""


class Persisted(BaseModel):
    message_id: int


class QuotaVerdict(BaseModel):
    used: int
    limit: int | None = None  # None: no budget for this actor

    @property
    def exceeded(self) -> bool:
        return self.limit is not None and self.used >= self.limit


class ThreadSnapshot(BaseModel):
    """What a turn reads of its thread: recent messages, title, whether ever answered."""

    messages: list[Message]
    title: str | None = None
    answered: bool = False


class CallVerdict(BaseModel):
    """Decided inside `persist:toolcall:<id>`: a replay reads it, never the registry."""

    kind: Literal["read", "action", "agent"]
    status: Literal["auto_executed", "pending_approval", "failed"]
    error: str | None = None


class Prepared(BaseModel):
    """What a step carries in, decided once at its boundary (a replay reads it back)."""

    claimed: list[str] = Field(default_factory=list)  # steering taken from the inbox
    messages: list[str] = Field(default_factory=list)  # carried in by pre-step listeners
    new_series: bool = False
    rejected: str | None = None
    settings: ModelSettings = Field(default_factory=ModelSettings)


class ToolOutcome(BaseModel):
    ok: bool
    result: Any = None
    error: str | None = None
    questions: list[dict[str, Any]] | None = None  # the tool asked; the run waits for answers


# --- intents -------------------------------------------------------------------------


class QuotaCheck(Intent):
    type: Literal["quota_check"] = "quota_check"
    result_type = QuotaVerdict
    actor: str
    day: str
    limit: int | None


class PersistUserMessage(Intent):
    type: Literal["persist_user"] = "persist_user"
    result_type = Persisted
    run_id: str
    thread_id: str
    content: str


class LoadThread(Intent):
    type: Literal["load_thread"] = "load_thread"
    result_type = ThreadSnapshot
    run_id: str
    thread_id: str
    message_limit: int | None = None


class PrepareStep(Intent):
    """The step boundary: claim steering, capture the model selection, ask listeners."""

    type: Literal["prepare_step"] = "prepare_step"
    result_type = Prepared
    run_id: str
    thread_id: str
    agent: str
    actor: str
    step: int
    defaults: ModelSettings


class Summarize(Intent):
    """`history:summarize`: fold what the window left out into a summary (a model call)."""

    type: Literal["summarize"] = "summarize"
    result_type = ModelResponse
    remote = True
    run_id: str
    agent: str
    messages: list[Message]


class ModelTurn(Intent):
    type: Literal["model_turn"] = "model_turn"
    result_type = ModelResponse
    remote = True
    request: ModelRequest


class RecordUsage(Intent):
    type: Literal["record_usage"] = "record_usage"
    result_type = Done
    run_id: str
    thread_id: str
    actor: str
    day: str
    step: str
    kind: Literal["model", "summary"] = "model"
    model: str | None = None
    usage: Usage


class PersistAssistant(Intent):
    type: Literal["persist_assistant"] = "persist_assistant"
    result_type = Persisted
    run_id: str
    thread_id: str
    text: str
    tool_calls: list[ToolCall] = Field(default_factory=list)


class PersistToolCall(Intent):
    type: Literal["persist_toolcall"] = "persist_toolcall"
    result_type = CallVerdict
    run_id: str
    thread_id: str
    agent: str
    actor: str
    persona: str | None = None
    call: ToolCall
    offered: list[str]
    depth: int = 0  # the turn's depth at runtime; the larger of it and the stored one counts


class InvokeTool(Intent):
    type: Literal["invoke_tool"] = "invoke_tool"
    result_type = ToolOutcome
    remote = True
    run_id: str
    agent: str
    actor: str
    call: ToolCall
    offered: list[str]
    answers: dict[str, Any] | None = None


class PersistToolExec(Intent):
    type: Literal["persist_toolexec"] = "persist_toolexec"
    result_type = Persisted
    run_id: str
    thread_id: str
    call: ToolCall
    status: Literal["executed", "failed", "rejected"]
    result: Any = None
    error: str | None = None
    content: str


class SetTitle(Intent):
    type: Literal["set_title"] = "set_title"
    result_type = Done
    thread_id: str
    title: str


AnyIntent = Annotated[
    QuotaCheck
    | PersistUserMessage
    | LoadThread
    | PrepareStep
    | Summarize
    | ModelTurn
    | RecordUsage
    | PersistAssistant
    | PersistToolCall
    | InvokeTool
    | PersistToolExec
    | SetTitle,
    Field(discriminator="type"),
]
_INTENT: TypeAdapter[Any] = TypeAdapter(AnyIntent)


def parse_intent(data: Any) -> Intent:
    """An intent from its journaled JSON."""
    intent: Intent = _INTENT.validate_python(data)
    return intent


def dump(value: BaseModel) -> dict[str, Any]:
    """JSON-ready form of an intent or result, as the journal stores it."""
    return value.model_dump(mode="json")
