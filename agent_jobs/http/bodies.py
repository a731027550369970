"""The bodies the HTTP API takes and gives (besides a run request: `agent_jobs.runs`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..approvals.record import MAX_ANSWER, MAX_QUESTION_ID

MAX_REASON = 2000
MAX_MESSAGE = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecisionBody(_Strict):
    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=MAX_REASON)
    # Binds the decision to the arguments the approver saw (as listed, or as the
    # `approval_request` frame carried them): other arguments are refused (409).
    args_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class AnswersBody(_Strict):
    # Question id to answer: every question of the request, and only those.
    answers: dict[
        Annotated[str, Field(max_length=MAX_QUESTION_ID)],
        Annotated[str, Field(max_length=MAX_ANSWER)],
    ] = Field(min_length=1)


class MessageBody(_Strict):
    text: str = Field(min_length=1, max_length=MAX_MESSAGE)
    when: Literal["next-step", "next-turn"] = "next-step"


class ModelBody(_Strict):
    """The thread's model from its next step that assembles a prompt: `provider` (for
    example `anthropic`), `model` (the provider's model id) or both; `reasoning_effort`,
    when left out, clears the one the thread had."""

    provider: str | None = Field(default=None, min_length=1, max_length=200)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    reasoning_effort: str | None = Field(default=None, min_length=1, max_length=200)


class CancelBody(_Strict):
    keep_inbox: bool = False


class Started(BaseModel):
    run_id: str
    status: str


class Recorded(BaseModel):
    recorded: bool


class Queued(BaseModel):
    thread_id: str


class Cancelling(BaseModel):
    cancelling: list[str]  # the run and its children asked to stop; empty if it had ended


class Me(BaseModel):
    actor: str
    roles: list[str]


class Health(BaseModel):
    ok: bool
