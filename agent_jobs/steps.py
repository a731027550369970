"""Steps are data: each side effect of the loop is a named, serialisable intent.

An intent says *what* to do; `executor.py` knows *how*. The inline runner executes
an intent at once; the durable runner journals it and lets a Celery task execute it.
What a step returns is one of the results in `checkpoints.py`; both runners hand the
loop its JSON form, which the loop parses (the inline runner round-trips results
through JSON as well, so a replay reads back exactly what a first run saw).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, TypeAdapter

from .checkpoints import McpToolInfo
from .messages import Message, ModelRequest, ModelSettings, ToolCall, Usage


class Intent(BaseModel):
    """Base of every intent. `remote` steps run in their own Celery task."""

    remote: ClassVar[bool] = False


# --- intents -------------------------------------------------------------------------


class QuotaCheck(Intent):
    type: Literal["quota_check"] = "quota_check"
    actor: str
    day: str
    limit: int | None


class PersistUserMessage(Intent):
    type: Literal["persist_user"] = "persist_user"
    run_id: str
    thread_id: str
    content: str


class LoadThread(Intent):
    type: Literal["load_thread"] = "load_thread"
    run_id: str
    thread_id: str
    message_limit: int | None = None


class PrepareStep(Intent):
    """The step boundary: claim steering, capture the model selection, ask listeners."""

    type: Literal["prepare_step"] = "prepare_step"
    run_id: str
    thread_id: str
    agent: str
    actor: str
    step: int
    defaults: ModelSettings


class Summarize(Intent):
    """`history:summarize`: fold what the window left out into a summary (a model call)."""

    type: Literal["summarize"] = "summarize"
    remote = True
    run_id: str
    agent: str
    messages: list[Message]


class ModelTurn(Intent):
    type: Literal["model_turn"] = "model_turn"
    remote = True
    request: ModelRequest


class RecordUsage(Intent):
    type: Literal["record_usage"] = "record_usage"
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
    run_id: str
    thread_id: str
    text: str
    tool_calls: list[ToolCall] = Field(default_factory=list)


class PersistToolCall(Intent):
    type: Literal["persist_toolcall"] = "persist_toolcall"
    run_id: str
    thread_id: str
    agent: str
    actor: str
    persona: str | None = None
    call: ToolCall
    offered: list[str]
    depth: int = 0  # the turn's depth at runtime; the larger of it and the stored one counts
    mcp: McpToolInfo | None = None  # an MCP tool's kind and schema, from the run's list


class InvokeTool(Intent):
    type: Literal["invoke_tool"] = "invoke_tool"
    remote = True
    run_id: str
    agent: str
    actor: str
    call: ToolCall
    offered: list[str]
    answers: dict[str, Any] | None = None
    queue: str | None = None  # the tool's own broker queue, if it has one
    kind: Literal["read", "action"] | None = None  # an MCP tool's, from the run's list


class ListMcpTools(Intent):
    """`mcp:tools`: take the list of the MCP tools a run offers, once (agent_jobs/mcp)."""

    type: Literal["list_mcp_tools"] = "list_mcp_tools"
    remote = True
    run_id: str
    agent: str
    wanted: list[str]  # "<server>.<tool>" or "<server>.*", as the agent names them


class PersistToolExec(Intent):
    type: Literal["persist_toolexec"] = "persist_toolexec"
    run_id: str
    thread_id: str
    call: ToolCall
    status: Literal["executed", "failed", "rejected"]
    result: Any = None
    error: str | None = None
    content: str


class SetTitle(Intent):
    type: Literal["set_title"] = "set_title"
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
    | ListMcpTools
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
