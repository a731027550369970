"""The journal's vocabulary: every checkpoint's name, built and parsed here, and the
results checkpoints record.

A turn's checkpoints, in the order a turn meets them:

    quota:check · persist:user · load:thread · [history:summarize · usage:summary]
    [mcp:tools] (the run's list of MCP tools, taken once, before its first model step)
    prepare:<n> · model:<n> · usage:<n> · persist:assistant:<n>
    persist:toolcall:<id> · [approval:<id>] · tool:<id> · [answers:<id>:<k> · tool:<id>:<k+1>]
    · [agent:<id>] · [timer:<id>] · persist:toolexec:<id> · … · persist:title
    patch:<patch id> wherever a run took a gated shape
    retry:<k>:<step> after the journal's last row, the k-th run of a failed step a person
    asked for (`agent-jobs retry`): the failed row stays as it was

A name is the journal's key: a run that changed how a name is spelled could not be
replayed, so the spelling lives here alone. Names are parsed back only by their
prefix (a call id may itself contain a colon).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from .messages import Message, ModelSettings, ToolSpec

# --- names -------------------------------------------------------------------------------

QUOTA_CHECK = "quota:check"
PERSIST_USER = "persist:user"
LOAD_THREAD = "load:thread"
SUMMARIZE = "history:summarize"
SUMMARY_USAGE = "usage:summary"
PERSIST_TITLE = "persist:title"
MCP_TOOLS = "mcp:tools"

APPROVAL = "approval:"
ANSWERS = "answers:"
TIMER = "timer:"
HUMAN_WAITS = (APPROVAL, ANSWERS)  # the checkpoints a person completes


def prepare(n: int) -> str:
    """The step boundary before model pass `n`: steering, model selection, gates."""
    return f"prepare:{n}"


def model(n: int) -> str:
    return f"model:{n}"


def model_prefix() -> str:
    """What every model step's name starts with."""
    return "model:"


def usage(n: int) -> str:
    """The ledger row of model pass `n`."""
    return f"usage:{n}"


def assistant(n: int) -> str:
    return f"persist:assistant:{n}"


def toolcall(call_id: str) -> str:
    """Where a call's kind, authorization and input validation are decided, once."""
    return f"persist:toolcall:{call_id}"


def tool(call_id: str, round: int = 1) -> str:
    """The tool's run; round k > 1 runs it again with the answers of round k - 1."""
    return f"tool:{call_id}" if round == 1 else f"tool:{call_id}:{round}"


def toolexec(call_id: str) -> str:
    """The call's outcome, as the model will read it."""
    return f"persist:toolexec:{call_id}"


def approval(call_id: str) -> str:
    """The row a turn waits on for a decision about `call_id`."""
    return f"{APPROVAL}{call_id}"


def answers_request(call_id: str, round: int) -> str:
    """The id of the `round`-th set of questions call `call_id` asked."""
    return f"{call_id}:{round}"


def answers(request_id: str) -> str:
    """The row a turn waits on for the answers to request `request_id`."""
    return f"{ANSWERS}{request_id}"


def timer(call_id: str) -> str:
    """The row a sleeping run waits on: the `wait` call `call_id` (agent_jobs/timers.py)."""
    return f"{TIMER}{call_id}"


def delegation(call_id: str) -> str:
    """The parent's row that waits for a delegated run's answer."""
    return f"agent:{call_id}"


def patch(patch_id: str) -> str:
    """Marks the position where a run took the shape introduced under `patch_id`."""
    return f"patch:{patch_id}"


RETRY = "retry:"


def retry(step: str, k: int) -> str:
    """The `k`-th run of `step` again, asked for by a person after it failed: a row of its
    own (a journal row that is done or failed never changes), which a replay reads in
    the failed row's place."""
    return f"{RETRY}{k}:{step}"


def retried(step: str) -> tuple[str, int] | None:
    """(the step a retry row runs again, its k) for a retry row; None for any other."""
    if not step.startswith(RETRY):
        return None
    k, _, original = step[len(RETRY) :].partition(":")
    return (original, int(k)) if k.isdigit() and original else None


def attempted(step: str) -> str:
    """The step a row carries out: the one a retry row runs again, else the row's own."""
    again = retried(step)
    return again[0] if again is not None else step


Kind = Literal[
    "quota",
    "user",
    "thread",
    "summarize",
    "summary_usage",
    "title",
    "prepare",
    "model",
    "usage",
    "assistant",
    "toolcall",
    "toolexec",
    "tool",
    "approval",
    "answers",
    "delegation",
    "timer",
    "patch",
    "retry",
    "mcp_tools",
]

_EXACT: dict[str, Kind] = {
    QUOTA_CHECK: "quota",
    PERSIST_USER: "user",
    LOAD_THREAD: "thread",
    SUMMARIZE: "summarize",
    SUMMARY_USAGE: "summary_usage",
    PERSIST_TITLE: "title",
    MCP_TOOLS: "mcp_tools",
}
# Longest first: `persist:toolcall:` before any shorter prefix it starts with.
_PREFIXES: tuple[tuple[str, Kind], ...] = (
    ("persist:assistant:", "assistant"),
    ("persist:toolcall:", "toolcall"),
    ("persist:toolexec:", "toolexec"),
    ("prepare:", "prepare"),
    ("model:", "model"),
    ("usage:", "usage"),
    ("tool:", "tool"),
    (APPROVAL, "approval"),
    (ANSWERS, "answers"),
    ("agent:", "delegation"),
    (TIMER, "timer"),
    ("patch:", "patch"),
    (RETRY, "retry"),
)


@dataclass(frozen=True)
class Name:
    """A parsed checkpoint name: its kind and what follows the kind's prefix."""

    kind: Kind
    key: str = ""


def parse(name: str) -> Name | None:
    """The kind of checkpoint `name` is, or None for a name this vocabulary lacks."""
    exact = _EXACT.get(name)
    if exact is not None:
        return Name(exact)
    for prefix, kind in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return Name(kind, name[len(prefix) :])
    return None


def usage_of(step: str) -> tuple[str, Literal["model", "summary"]] | None:
    """For a step that calls a model (or runs one again): the step that records its
    tokens, and its kind."""
    parsed = parse(attempted(step))
    if parsed is None:
        return None
    if parsed.kind == "model" and parsed.key.isdigit():
        return usage(int(parsed.key)), "model"
    if parsed.kind == "summarize":
        return SUMMARY_USAGE, "summary"
    return None


# --- results -----------------------------------------------------------------------------
# A model step's result is a `ModelResponse` (agent_jobs.messages); the rest are here.


class Done(BaseModel):
    """A step with nothing to report."""


class Persisted(BaseModel):
    """A message written to the thread. Its id is not journaled any more (nothing read
    it, and a write whose result nobody reads goes with the pass's next statement or its
    commit); older journals have it."""

    message_id: int | None = None


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

    kind: Literal["read", "action", "agent", "timer"]
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


class McpToolInfo(BaseModel):
    """One tool of an MCP server as a run's list holds it (`mcp:tools`)."""

    name: str  # "<server>.<tool>"
    server: str
    tool: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["read", "action"] = "action"

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name, description=self.description, input_schema=self.input_schema
        )


class McpToolList(BaseModel):
    """`mcp:tools`: the MCP tools a run offers, and the servers that could not be listed
    (their tools are not offered; a call of one is a tool error the model sees)."""

    tools: list[McpToolInfo] = Field(default_factory=list)
    unavailable: dict[str, str] = Field(default_factory=dict)


class Decision(BaseModel):
    """A human's decision on an `action` call."""

    decision: Literal["approve", "reject"]
    actor: str
    reason: str | None = None

    @property
    def approved(self) -> bool:
        return self.decision == "approve"


class DelegationOutcome(BaseModel):
    ok: bool
    output: str | None = None
    error: str | None = None
    child_run_id: str | None = None


class Answers(BaseModel):
    """A person's answers to a tool's questions, and who gave them."""

    answers: dict[str, Any]
    actor: str | None = None


class Woke(BaseModel):
    """How a sleeping run woke (the `wait` tool's result): at its time, or early on a
    message, and when."""

    woke: Literal["time", "message"]
    at: str  # ISO 8601, UTC
