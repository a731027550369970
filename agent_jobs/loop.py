"""`run_agent_loop`: one agent turn, written once, driven by either runner.

model → tools → approval → model …, capped at the agent's `max_steps`. The body is
deterministic: no clock, randomness, ids or I/O (ruff's banned-api rule keeps it so).
Every side effect is a named intent handed to `hooks.step`, and everything the loop
decides on comes from a step's result, so a durable runner can replay the body
against its journal and reach the same place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel

from . import checkpoints as names
from .app import AgentApp, AgentSpec, Persona
from .checkpoints import (
    CallVerdict,
    Done,
    McpToolInfo,
    McpToolList,
    Persisted,
    Prepared,
    QuotaVerdict,
    ThreadSnapshot,
    ToolOutcome,
    Woke,
)
from .errors import (
    MaxStepsExceededError,
    QuotaExceededError,
    StepFailedError,
    StepRejectedError,
)
from .history import SlidingWindowHistory, summary_message
from .hooks import (
    AnswersWait,
    ApprovalRequests,
    ApprovalWait,
    Delegation,
    LoopHooks,
    ParallelBlock,
    Patch,
    StepCall,
    TimerWait,
)
from .messages import Message, ModelRequest, ModelResponse, ToolCall, args_sha256
from .steps import (
    Intent,
    InvokeTool,
    ListMcpTools,
    LoadThread,
    ModelTurn,
    PersistAssistant,
    PersistToolCall,
    PersistToolExec,
    PersistUserMessage,
    PrepareStep,
    QuotaCheck,
    RecordUsage,
    SetTitle,
    Summarize,
)

R = TypeVar("R", bound=BaseModel)

PARALLEL_TOOLS = "agent:parallel-tools"
HISTORY_SELECT = "agent:history-select"
APPROVALS_AT_ONCE = "agent:approvals-at-once"
MCP_TOOLS = "agent:mcp-tools"
MAX_QUESTION_ROUNDS = 5
TITLE_LENGTH = 60


@dataclass(frozen=True)
class TurnInput:
    """What the runner knows about the turn before it starts."""

    run_id: str
    thread_id: str
    actor: str
    text: str
    persona: str | None = None
    depth: int = 0


@dataclass(frozen=True)
class LoopDeps:
    """Injected dependencies. The model and the store are reached through steps only."""

    app: AgentApp  # the tool registry, the roles policy and the other agents
    agent: AgentSpec
    persona: Persona | None
    system_prompt: str  # resolved by the runner: the persona wraps the agent's prompt
    day: str  # YYYY-MM-DD, stamped once by the runner so quota-by-day survives a replay
    quota_limit: int | None


@dataclass(frozen=True)
class TurnResult:
    output: str
    model_calls: int


def _step(hooks: LoopHooks, name: str, intent: Intent | Callable[[], Intent], result: type[R]) -> R:
    return result.model_validate(hooks.step(StepCall(name, intent)))


def run_agent_loop(turn: TurnInput, deps: LoopDeps, hooks: LoopHooks) -> TurnResult:
    """Drive one turn to its final answer (or raise a typed `TurnError`)."""
    # Checked even without a budget, so that configuring one later does not change the
    # shape of runs already in flight.
    check = QuotaCheck(actor=turn.actor, day=deps.day, limit=deps.quota_limit)
    verdict = _step(hooks, names.QUOTA_CHECK, check, QuotaVerdict)
    if verdict.exceeded and verdict.limit is not None:
        raise QuotaExceededError(turn.actor, deps.day, verdict.used, verdict.limit)

    persist = PersistUserMessage(run_id=turn.run_id, thread_id=turn.thread_id, content=turn.text)
    _step(hooks, names.PERSIST_USER, persist, Persisted)
    window = deps.agent.history
    limit = window.message_limit if window is not None else None
    load = LoadThread(run_id=turn.run_id, thread_id=turn.thread_id, message_limit=limit)
    snapshot = _step(hooks, names.LOAD_THREAD, load, ThreadSnapshot)
    history = list(snapshot.messages)
    # The window changed which checkpoints a turn writes: gated, so a run that began
    # before it existed finishes on the old shape. With no window, never reached.
    if window is not None and hooks.patched(Patch(HISTORY_SELECT)):
        history = _bounded(window, history, turn, deps, hooks)

    offered = deps.app.offered_tools(deps.agent, turn.actor, deps.persona)
    specs = deps.app.tool_specs(offered)
    mcp = _mcp_tools(turn, deps, hooks)
    offered = [*offered, *mcp]
    specs = [*specs, *(tool.spec() for tool in mcp.values())]
    tools = _Tools(turn, deps, hooks, offered, mcp)
    seen: set[str] = set()

    defaults = deps.agent.model_settings()
    for n in range(1, deps.agent.max_steps + 1):
        # The step boundary: steering from the inbox, the model selection, the gates.
        boundary = partial(
            PrepareStep,
            run_id=turn.run_id,
            thread_id=turn.thread_id,
            agent=deps.agent.name,
            actor=turn.actor,
            step=n,
            defaults=defaults,
        )
        prepared = _step(hooks, names.prepare(n), boundary, Prepared)
        if prepared.rejected is not None:
            raise StepRejectedError(n, prepared.rejected)
        carried = [
            Message(role="user", content=text) for text in [*prepared.claimed, *prepared.messages]
        ]
        history = carried if prepared.new_series else [*history, *carried]
        # Built only if the step is new (a replay that finds it recorded does not pay for
        # the whole history again), from the history as it is now.
        request = partial(
            ModelRequest,
            run_id=turn.run_id,
            agent=deps.agent.name,
            step=n - 1,
            system=deps.system_prompt,
            messages=list(history),
            tools=specs,
            settings=prepared.settings,
        )
        reply = _step(hooks, names.model(n), partial(_model_turn, request), ModelResponse)
        usage = partial(
            RecordUsage,
            run_id=turn.run_id,
            thread_id=turn.thread_id,
            actor=turn.actor,
            day=deps.day,
            step=names.model(n),
            model=reply.model,
            usage=reply.usage,
        )
        _step(hooks, names.usage(n), usage, Done)
        calls = _unique_calls(reply.tool_calls, seen, n)
        assistant = partial(
            PersistAssistant,
            run_id=turn.run_id,
            thread_id=turn.thread_id,
            text=reply.text,
            tool_calls=calls,
        )
        _step(hooks, names.assistant(n), assistant, Persisted)
        history.append(Message(role="assistant", content=reply.text, tool_calls=calls))

        if not calls:
            if not snapshot.answered and snapshot.title is None:
                title = SetTitle(thread_id=turn.thread_id, title=derive_title(turn.text))
                _step(hooks, names.PERSIST_TITLE, title, Done)
            return TurnResult(output=reply.text, model_calls=n)

        history.extend(tools.run(calls))

    raise MaxStepsExceededError(deps.agent.max_steps)


def _mcp_tools(turn: TurnInput, deps: LoopDeps, hooks: LoopHooks) -> dict[str, McpToolInfo]:
    """`mcp:tools`: the MCP tools this run offers, listed once before its first model step
    and journaled, so that a replay offers the very same tools (a new run, a new list).
    Gated: a run that began before its agent took MCP tools finishes without them."""
    wanted = deps.app.offered_mcp(deps.agent, turn.actor, deps.persona)
    if not wanted or not hooks.patched(Patch(MCP_TOOLS)):
        return {}
    listing = ListMcpTools(run_id=turn.run_id, agent=deps.agent.name, wanted=wanted)
    listed = _step(hooks, names.MCP_TOOLS, listing, McpToolList)
    return {tool.name: tool for tool in listed.tools}


def _model_turn(request: Callable[[], ModelRequest]) -> ModelTurn:
    return ModelTurn(request=request())


def _bounded(
    window: SlidingWindowHistory,
    history: list[Message],
    turn: TurnInput,
    deps: LoopDeps,
    hooks: LoopHooks,
) -> list[Message]:
    """What of the history rides the request: the window, and a summary of the rest."""
    split = window.select(history)  # pure: its input already is a checkpoint's result
    if not split.dropped or window.summarizer is None:
        return split.kept
    ask = Summarize(run_id=turn.run_id, agent=deps.agent.name, messages=split.dropped)
    summary = _step(hooks, names.SUMMARIZE, ask, ModelResponse)
    usage = partial(
        RecordUsage,
        run_id=turn.run_id,
        thread_id=turn.thread_id,
        actor=turn.actor,
        day=deps.day,
        step=names.SUMMARIZE,
        kind="summary",
        model=summary.model,
        usage=summary.usage,
    )
    _step(hooks, names.SUMMARY_USAGE, usage, Done)
    return [summary_message(summary.text), *split.kept]


class _Tools:
    """Runs one model turn's tool calls by kind, in the order the model gave them."""

    def __init__(
        self,
        turn: TurnInput,
        deps: LoopDeps,
        hooks: LoopHooks,
        offered: list[str],
        mcp: dict[str, McpToolInfo],
    ) -> None:
        self.turn = turn
        self.deps = deps
        self.hooks = hooks
        self.offered = offered
        self.mcp = mcp  # the run's MCP tools by name, as its list gave them

    def run(self, calls: list[ToolCall]) -> list[Message]:
        # The concurrent shape changed which checkpoints a turn writes, so it is gated:
        # a run that suspended under the sequential shape finishes on it.
        if len(calls) >= 2 and self.hooks.patched(Patch(PARALLEL_TOOLS)):
            verdicts = [self.record(call) for call in calls]
            # Eligible only when the *journaled* kind of every call is read.
            if all(v.kind == "read" for v in verdicts):
                return self.run_reads(calls, verdicts)
            requested = self.request_approvals(calls, verdicts)
            return [
                self.finish(call, verdict, requested)
                for call, verdict in zip(calls, verdicts, strict=True)
            ]
        return [self.finish(call, self.record(call)) for call in calls]

    def request_approvals(self, calls: list[ToolCall], verdicts: list[CallVerdict]) -> bool:
        """Ask a person for every decision the turn's calls need, at once; they still run
        one by one in call order. A new shape of the journal (the requests come before the
        first call runs), so gated: a run that waited under the old shape keeps it."""
        actions = [
            call
            for call, verdict in zip(calls, verdicts, strict=True)
            if verdict.kind == "action" and verdict.status != "failed"
        ]
        if not actions or not self.hooks.patched(Patch(APPROVALS_AT_ONCE)):
            return False
        waits = [_approval_wait(self.turn.run_id, call, requested=True) for call in actions]
        self.hooks.request_approvals(ApprovalRequests(waits))
        return True

    def record(self, call: ToolCall) -> CallVerdict:
        """`persist:toolcall:<id>`: kind, authorization and validation, decided once."""
        intent = partial(
            PersistToolCall,
            run_id=self.turn.run_id,
            thread_id=self.turn.thread_id,
            agent=self.deps.agent.name,
            actor=self.turn.actor,
            persona=self.turn.persona,
            call=call,
            offered=self.offered,
            depth=self.turn.depth,
            mcp=self.mcp.get(call.name),
        )
        return _step(self.hooks, names.toolcall(call.id), intent, CallVerdict)

    def invoke(self, call: ToolCall) -> ToolOutcome:
        """`tool:<id>`; a tool that asks questions waits for answers, then runs again."""
        outcome = self._invoke(call, names.tool(call.id), None)
        answers: dict[str, Any] | None = None
        for round in range(1, MAX_QUESTION_ROUNDS + 1):
            if outcome.questions is None:
                return outcome
            wait = AnswersWait(
                self.turn.run_id, names.answers_request(call.id, round), outcome.questions, call
            )
            given = answers
            answers = self.hooks.await_answers(wait)
            if call.name in self.mcp and given is not None:
                # An MCP call is made again from the start: every answer so far goes with it.
                answers = {**given, **answers}
            outcome = self._invoke(call, names.tool(call.id, round + 1), answers)
        if outcome.questions is not None:
            return ToolOutcome(ok=False, error="the tool kept asking questions; giving up")
        return outcome

    def _invoke(self, call: ToolCall, name: str, answers: dict[str, Any] | None) -> ToolOutcome:
        intent = partial(
            InvokeTool,
            run_id=self.turn.run_id,
            agent=self.deps.agent.name,
            actor=self.turn.actor,
            call=call,
            offered=self.offered,
            answers=answers,
            kind=listed.kind if (listed := self.mcp.get(call.name)) is not None else None,
        )
        return _step(self.hooks, name, intent, ToolOutcome)

    def run_reads(self, calls: list[ToolCall], verdicts: list[CallVerdict]) -> list[Message]:
        runnable = [c for c, v in zip(calls, verdicts, strict=True) if v.status == "auto_executed"]
        tasks: list[Callable[[], ToolOutcome]] = [partial(self.invoke, call) for call in runnable]
        settled = self.hooks.parallel(ParallelBlock(tasks))
        # Every task settles first; only then does a failure (or a suspend) unwind the
        # turn, and in that case nothing is persisted for the siblings that finished.
        for outcome in settled:
            if outcome.error is not None:
                raise outcome.error
        results = {call.id: outcome.value for call, outcome in zip(runnable, settled, strict=True)}
        return [
            self.persist_outcome(call, results[call.id])
            if call.id in results
            else self.finish(call, verdict)
            for call, verdict in zip(calls, verdicts, strict=True)
        ]

    def finish(self, call: ToolCall, verdict: CallVerdict, requested: bool = False) -> Message:
        """Take one recorded call to its result message (`requested`: its approval was
        asked for with the turn's other calls)."""
        if verdict.status == "failed":
            return self.persist_failure(call, verdict.error or "the call was refused")
        if verdict.kind == "agent":
            return self.delegate(call)
        if verdict.kind == "timer":  # the run sleeps; the result says how it woke
            woke = Woke.model_validate(self.hooks.await_timer(TimerWait(self.turn.run_id, call)))
            result = woke.model_dump()
            return self.persist(call, "executed", content=_json(result), result=result)
        if verdict.kind == "action":
            wait = _approval_wait(self.turn.run_id, call, requested=requested)
            decision = self.hooks.await_approval(wait)
            if not decision.approved:
                body = {"rejected": True, "by": decision.actor, "reason": decision.reason}
                return self.persist(call, "rejected", content=_json(body), error=decision.reason)
        return self.persist_outcome(call, self.invoke(call))

    def delegate(self, call: ToolCall) -> Message:
        task = call.args.get("task")
        delegation = Delegation(
            run_id=self.turn.run_id,
            call=call,
            agent=call.name,
            task=task if isinstance(task, str) else _json(call.args),
            depth=self.turn.depth + 1,
        )
        outcome = self.hooks.run_agent(delegation)
        if outcome.ok:
            return self.persist(
                call, "executed", content=outcome.output or "", result=outcome.output
            )
        return self.persist_failure(call, outcome.error or "the delegated agent failed")

    def persist_outcome(self, call: ToolCall, outcome: ToolOutcome | None) -> Message:
        if outcome is None:  # pragma: no cover - settle() always fills value or error
            raise StepFailedError(names.tool(call.id), "the tool produced no outcome")
        if outcome.ok:
            return self.persist(
                call, "executed", content=_content(outcome.result), result=outcome.result
            )
        return self.persist_failure(call, outcome.error or "the tool failed")

    def persist_failure(self, call: ToolCall, error: str) -> Message:
        return self.persist(call, "failed", content=_json({"error": error}), error=error)

    def persist(
        self,
        call: ToolCall,
        status: Any,
        *,
        content: str,
        result: Any = None,
        error: str | None = None,
    ) -> Message:
        """`persist:toolexec:<id>`: the outcome on the record and as a tool message."""
        intent = partial(
            PersistToolExec,
            run_id=self.turn.run_id,
            thread_id=self.turn.thread_id,
            call=call,
            status=status,
            result=result,
            error=error,
            content=content,
        )
        _step(self.hooks, names.toolexec(call.id), intent, Persisted)
        return Message(
            role="tool",
            content=content,
            tool_call_id=call.id,
            name=call.name,
            is_error=status != "executed",
        )


def _approval_wait(run_id: str, call: ToolCall, *, requested: bool) -> ApprovalWait:
    return ApprovalWait(run_id, call, args_sha256(call.args), requested=requested)


def _unique_calls(calls: list[ToolCall], seen: set[str], n: int) -> list[ToolCall]:
    """Give every call of the run a distinct, non-empty id (step names are keyed on it)."""
    unique: list[ToolCall] = []
    for i, call in enumerate(calls, start=1):
        call_id = call.id.strip()[:150] or f"call_{n}_{i}"
        if call_id in seen:
            base, again = f"{call_id}~{n}.{i}", 0
            call_id = base
            while call_id in seen:  # the model may have given that id as well
                again += 1
                call_id = f"{base}.{again}"
        seen.add(call_id)
        unique.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return unique


def derive_title(text: str) -> str:
    """A thread's title from its first request: the first line, cut at a word."""
    line = (text.strip().splitlines() or [""])[0].strip()
    if len(line) <= TITLE_LENGTH:
        return line or "Untitled"
    cut = line[:TITLE_LENGTH].rsplit(" ", 1)[0]
    return (cut or line[:TITLE_LENGTH]) + "…"


def _json(value: Any) -> str:
    # Sorted keys: a result read back from Postgres JSONB has lost its key order, and a
    # replay must produce the very same message as the first run did.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _content(result: Any) -> str:
    return result if isinstance(result, str) else _json(result)
