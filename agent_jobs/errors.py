"""Typed errors: one root, a sub-base per area, control-flow signals kept apart."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy.exc import DontWrapMixin


class AgentJobsError(Exception):
    """Root of every error this library raises on purpose."""


# --- configuration and definitions -------------------------------------------------


class ConfigurationError(AgentJobsError):
    """The app, the settings or a definition is wrong; fix the configuration."""


class AppLoadError(ConfigurationError):
    """`AGENT_JOBS_APP` does not name an importable `AgentApp`."""


class UnknownAgentError(AgentJobsError):
    """A run asked for an agent the app does not define."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"unknown agent {name!r}; this app defines: {listed}")


class ScheduleError(ConfigurationError):
    """A schedule's definition is wrong (its name, cron expression, time zone or
    catch-up); nothing was defined."""


class UnknownScheduleError(AgentJobsError):
    """No schedule of the app has this name."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"unknown schedule {name!r}; this app defines: {listed} (`agent-jobs schedules list`)"
        )


# --- runs and the store --------------------------------------------------------------


class StoreError(AgentJobsError):
    """Something about stored state prevents the operation."""


class UnknownRunError(StoreError):
    """No run has this id."""

    def __init__(self, run_id: str, message: str | None = None) -> None:
        self.run_id = run_id
        super().__init__(
            message or f"no run with id {run_id!r}; `agent-jobs runs` lists the known ones"
        )


class UnknownThreadError(StoreError):
    """No thread with this id that the caller may continue."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"no thread with id {thread_id!r} that this actor may continue")


class UnknownCallError(StoreError):
    """The run has no tool call with this id."""

    def __init__(self, run_id: str, call_id: str) -> None:
        self.run_id = run_id
        self.call_id = call_id
        super().__init__(f"run {run_id!r} has no tool call {call_id!r}")


class SchemaNotReadyError(StoreError):
    """The database has not been migrated to the version this code needs."""


class ThreadBusyError(StoreError):
    """A run that may not wait (`if_busy="reject"`) was asked for on a thread whose turn
    has not ended; nothing was recorded."""

    def __init__(self, thread_id: str, busy_run_id: str) -> None:
        self.thread_id = thread_id
        self.busy_run_id = busy_run_id
        super().__init__(
            f"thread {thread_id!r} is busy: run {busy_run_id!r} has not ended; send if_busy "
            "'enqueue' to run after it, or 'interrupt' to cancel it and run this one next"
        )


class RunAbandonedError(StoreError):
    """An inline run's process exited before the run ended (a run's `error_type`): the
    next process that met it in its way ended it (agent_jobs/runners/inline/abandoned.py)."""

    def __init__(self, run_id: str, driver: str) -> None:
        self.run_id = run_id
        self.driver = driver
        super().__init__(
            f"abandoned: the process that drove run {run_id!r} ({driver}) exited before "
            "the run ended"
        )


class EncryptionError(StoreError, DontWrapMixin):
    """A payload could not be sealed or opened (docs/security.md, "Encryption at rest")."""


class PayloadKeyError(EncryptionError):
    """A stored payload cannot be read: the key it was sealed under is missing, wrong or
    forgotten, or its bytes were changed. Nothing is shown in its place."""

    def __init__(self, message: str, key_id: str = "") -> None:
        self.key_id = key_id  # the data key's id ("" when unknown)
        super().__init__(message)


class PayloadForgottenError(PayloadKeyError):
    """A stored payload belongs to an actor who was forgotten (`agent-jobs forget`): the
    data key that sealed it is destroyed. The runs list shows such a run with its id and
    status, its payloads as FORGOTTEN; every other read fails with this error."""


class PayloadOwnerError(EncryptionError):
    """A payload was to be written with encryption on, and no actor owns it (the store
    did not say whose run it belongs to): nothing is written in the clear instead."""


class PayloadTooLargeError(StoreError, DontWrapMixin):
    """A payload is larger than `AGENT_JOBS_PAYLOAD_MAX`: it fails its step (a tool's
    result: a failed tool call, whose error the model reads) and is never stored.
    `size` is its size in bytes, or a lower bound of it when that was enough to refuse.
    Raised as it is from a statement binding the payload (SQLAlchemy's `DontWrapMixin`)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} is {size:,} bytes or more, over the largest payload kept "
            f"(AGENT_JOBS_PAYLOAD_MAX, {limit:,} bytes): return less (a page, a summary, "
            "or where the data can be fetched)"
        )


class PayloadBlobError(StoreError, DontWrapMixin):
    """A payload kept apart (agent_jobs/store/blobs.py) is missing or does not match its
    SHA-256: it is not read, and nothing is made of it."""

    def __init__(self, digest: str, problem: str) -> None:
        self.digest = digest
        self.problem = problem
        super().__init__(
            f"the stored payload sha256:{digest} {problem}: the table payload_blobs was "
            "altered or pruned by hand; restore it from a backup"
        )


class InvalidRequestError(AgentJobsError):
    """A request from outside (a run request, a message, a decision) is malformed."""


# --- refusals: why a well-formed request does not apply; nothing was written -----------
# Each door maps these to its answer in one place (the HTTP API: agent_jobs/http/errors.py;
# the command line: agent_jobs/cli/common.py), so no door checks before the domain does.


class Forbidden:
    """Refused because of who asks: the actor may not do this (HTTP 403; it wins over
    anything else a refusal is)."""


class Conflict:
    """Refused because of what is recorded: the run, call or question is not in a state
    where this applies (HTTP 409)."""


class TooManyRunsError(AgentJobsError):
    """The actor has as many runs going as this process lets one actor have (`serve`
    without a broker, where each run holds a thread); nothing was written."""


class ControlRefusedError(StoreError, Conflict):
    """An operator control (pause, resume, retry, fork) does not apply to the run as it
    stands (it has ended, is not paused, did not fail on a step, …); nothing changed."""


class NotYoursError(AgentJobsError, Forbidden):
    """Only the run's own actor (or a `service` actor acting for it) may do this: steer
    it, cancel it, answer its questions, use its controls."""


# --- the turn ------------------------------------------------------------------------


class TurnError(AgentJobsError):
    """The agent turn could not go on."""


class QuotaExceededError(TurnError):
    """The actor spent its daily token budget; no model call was made."""

    def __init__(self, actor: str, day: str, used: int, limit: int) -> None:
        self.actor = actor
        self.day = day
        self.used = used
        self.limit = limit
        super().__init__(
            f"actor {actor!r} has used {used} of {limit} tokens on {day}; "
            "the budget resets tomorrow or can be raised in the app's quota"
        )


class MaxStepsExceededError(TurnError):
    """The model kept asking for tools past the agent's `max_steps`."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        super().__init__(
            f"the model asked for tools on each of {max_steps} passes without answering; "
            "raise max_steps on the agent or check the tools' results"
        )


ModelErrorKind = Literal[
    "rate_limit",  # 429: retryable, honour retry_after
    "overload",  # 503 / 529: retryable
    "timeout",  # the request timed out: retryable
    "connection",  # the connection failed or dropped mid-stream: retryable
    "auth",  # 401 / 403: not retryable
    "invalid_request",  # 400 and friends: not retryable
    "context_length",  # the prompt is too long for the model: not retryable
    "invalid_response",  # the provider answered with something unusable: not retryable
]
RETRYABLE_MODEL_ERRORS: frozenset[str] = frozenset(
    {"rate_limit", "overload", "timeout", "connection"}
)


class ModelError(TurnError):
    """The model provider failed or answered with something unusable.

    `kind` classifies the failure for the request-error waterfall; `retry_after` is the
    provider's Retry-After in seconds when it sent one; `status` the HTTP status.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: ModelErrorKind = "invalid_response",
        retry_after: float | None = None,
        status: int | None = None,
        provider: str | None = None,
    ) -> None:
        self.kind: ModelErrorKind = kind
        self.retry_after = retry_after
        self.status = status
        self.provider = provider
        super().__init__(message)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_MODEL_ERRORS


class StepRejectedError(TurnError):
    """A pre-step listener refused to let the turn take its next step."""

    def __init__(self, step: int, reason: str) -> None:
        self.step = step
        self.reason = reason
        super().__init__(f"step {step} was rejected by a pre-step listener: {reason}")


class StepFailedError(TurnError):
    """A checkpointed step failed for good (for example after its retries ran out)."""

    def __init__(self, step: str, error: str) -> None:
        self.step = step
        self.error = error
        super().__init__(f"step {step!r} failed: {error}")


class NonDeterminismError(TurnError):
    """A replay asked for a different step than the journal recorded at that position."""

    def __init__(self, seq: int, expected: str | None, got: str) -> None:
        self.seq = seq
        self.expected = expected
        self.got = got
        if expected is None:
            where = f"step {got!r} at position {seq}, but the journal has it elsewhere"
        else:
            where = f"step {got!r} at position {seq}, where the journal recorded {expected!r}"
        super().__init__(
            f"non-deterministic replay: the loop asked for {where}. The code that resumed "
            "this run takes a different path than the code that started it; gate the change "
            "with hooks.patched(...)"
        )


# --- tools ---------------------------------------------------------------------------


class ToolError(AgentJobsError):
    """A tool call could not be run; fed back to the model, never a crash."""


class UnknownToolError(ToolError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no tool named {name!r} is offered to this agent")


class ToolNotPermittedError(ToolError):
    def __init__(self, name: str, actor: str) -> None:
        self.name = name
        self.actor = actor
        super().__init__(f"actor {actor!r} lacks a role that may run tool {name!r}")


class ToolInputError(ToolError):
    def __init__(self, name: str, detail: str) -> None:
        self.name = name
        self.detail = detail
        super().__init__(f"arguments for tool {name!r} do not match its schema: {detail}")


# --- approvals -----------------------------------------------------------------------


class ApprovalError(AgentJobsError):
    """A decision was refused; nothing was recorded."""


class DecisionRefusedError(ApprovalError):
    """A decision or answers were refused; the subclass says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class NotAnApproverError(DecisionRefusedError, Forbidden):
    """The actor holds none of the roles that may decide the call (an escalated call's:
    the roles it went to), or keep a decision on it in a fork."""


class RunEndedError(DecisionRefusedError, Conflict):
    """The run has ended: what it waited for can no longer be given."""


class NotWaitingError(DecisionRefusedError, Conflict):
    """The call is not waiting for this decision (it never asked, or it moved on)."""


class ArgumentsChangedError(DecisionRefusedError, Conflict):
    """`args_sha256` names other arguments than the call's: the decision was made on
    something else."""


class UnknownQuestionError(DecisionRefusedError):
    """The run asked no question with this id (HTTP 404)."""


class ReconcileRefusedError(DecisionRefusedError):
    """A person's word on a call whose outcome is unknown was refused (the call is not
    waiting for one, the actor may not give it); nothing was recorded."""


class NotAReconcilerError(ReconcileRefusedError, Forbidden):
    """The actor may not say how the call ended: none of the tool's approver roles, nor
    `service`."""


# --- control flow (not failures) -----------------------------------------------------


class ControlFlowSignal(BaseException):
    """Unwinds the loop on purpose; never shown to a user as a failure.

    Derives from BaseException so that `except Exception` in user code cannot
    swallow a suspend by accident.
    """


class Cancelled(ControlFlowSignal):
    """The run was cancelled; it stops at the boundary where this is raised."""

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(cause)


class Sleeping(ControlFlowSignal):
    """The inline runner's turn sleeps on a `wait` call: its thread ends, and the runner's
    one waiter for all its sleepers drives the run again when it wakes."""

    def __init__(self, run_id: str, wake_at: datetime) -> None:
        self.run_id = run_id
        self.wake_at = wake_at
        super().__init__(f"run {run_id} sleeps until {wake_at.isoformat()}")


class RetryLater(ControlFlowSignal):
    """A remote step asks to be delivered again after `delay` seconds (no worker sleeps)."""

    def __init__(
        self, delay: float, event: tuple[str, str | None, str, dict[str, Any]] | None
    ) -> None:
        self.delay = delay
        self.event = event  # the session event saying why, written with the hold
        super().__init__(f"retry in {delay:.2f}s")


class Deferred(RetryLater):
    """A model step found no capacity under its provider's rate limit (or the limit's key
    paused by a 429): it goes back to the broker for `delay` seconds. It made no attempt
    and is no retry: the step's attempts and the waterfall's count stay as they were."""

    def __init__(self, delay: float, key: str, *, paused: bool) -> None:
        super().__init__(delay, None)
        self.key = key
        self.paused = paused
        why = "paused by the provider" if paused else "at its rate limit"
        self.args = (f"waiting {delay:.2f}s: {key} is {why}",)


class Suspend(ControlFlowSignal):
    """The durable runner parks the turn until a step result or a decision arrives."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
