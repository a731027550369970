"""Forking a run (docs/operating.md, "Operator controls"): a new run on a new thread whose
journal is the source's rows before a step, which then goes on from there.

The rows are copied as they are, their intents made the fork's (its run and thread ids).
What else a replay of them needs, and what the fork's thread must hold:

- the thread's messages: the history the source's thread had before the source run, then
  the messages the copied steps wrote (the request, steering, the model's replies, tool
  results), rebuilt from those steps' intents and results; the title, when the source's
  thread had it before the source run (else the fork gives its thread one at its end);
- the tool calls the copied steps recorded, as they stood at the fork point: a call whose
  outcome comes after it is pending again (its verdict), with no handler marked as begun;
- never a decision: a decision is about one call of one run. An `action` call whose
  outcome comes after the fork point is asked again in the fork (its decision's row is
  not copied, so the fork's turn asks as a new run's does: its pending entry, frames and
  deadline), unless the one who forks may decide it and asks to keep it
  (`keep_decisions`): then the row is copied as their decision, recorded as theirs;
- not the usage ledger: the fork paid for none of the model calls it reuses, and its
  totals count only its own. A fork at a `usage:` step would charge a reused call again.

A fork at a model step calls the model again; at a tool step, runs the tool again: the
answer lists the steps with side effects that will run again (the source's `action`
calls after the fork point, which ran there), the calls asked again and the decisions
kept. Refused (`InvalidRequestError`): a step not
in the journal, a step inside a fan-out (the order of a fan-out's rows says how far each
member got, not the fan-out's shape), a retry row, a `usage:` step; (`ControlRefusedError`)
a step before the fork point that has not finished, a journal that was pruned;
(`NotAnApproverError`) decisions to keep that the one who forks may not make.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import Connection

from .. import checkpoints as names
from .. import session
from ..app import AgentApp
from ..approvals.record import decider_roles, escalated_to, may_decide
from ..checkpoints import CallVerdict, Decision, Prepared
from ..errors import (
    ControlRefusedError,
    InvalidRequestError,
    NotAnApproverError,
    UnknownRunError,
)
from ..messages import Message
from ..runs import RunRequest, check_request, create_run, new_id
from ..steps import PersistAssistant, PersistToolExec, PersistUserMessage, parse_intent
from ..store import RunView, forks, threads, toolcalls
from ..store import events as event_rows
from ..store import journal as journal_rows
from ..store import runs as run_rows
from ..store.db import utcnow
from ..store.journal import JournalRow
from ..store.retention import PRUNED
from .pause import checked_actor
from .retry import last_runs

# Steps that run once more in a fork, run by a fan-out's members (see `_in_fanout`).
_MEMBER_KINDS = ("tool", "answers")


@dataclass(frozen=True)
class Again:
    """A step with side effects that ran in the source and will run again in the fork."""

    step: str
    tool: str
    call_id: str


@dataclass(frozen=True)
class Forked:
    """A fork made: the new run and thread, where it came from, what will run again."""

    run_id: str
    thread_id: str
    source: str
    at: str
    runs_again: list[Again] = field(default_factory=list)
    # `action` calls the fork asks a person about again (the step: the decision's row)
    asked_again: list[Again] = field(default_factory=list)
    # decisions copied as the forker's own (`keep_decisions`)
    kept_decisions: list[Again] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        def listed(found: list[Again]) -> list[dict[str, str]]:
            return [{"step": a.step, "tool": a.tool, "call_id": a.call_id} for a in found]

        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "forked_from": self.source,
            "at": self.at,
            "runs_again": listed(self.runs_again),
            "asked_again": listed(self.asked_again),
            "kept_decisions": listed(self.kept_decisions),
        }


def fork(
    conn: Connection,
    app: AgentApp,
    source_id: str,
    at: str,
    actor: str,
    *,
    runner: str,
    status: run_rows.RunStatus,
    keep_decisions: bool = False,
) -> Forked:
    """Write the fork of run `source_id` at step `at`, asked for by `actor`: a new run of
    `runner`, written `status` (the caller then drives it). The decisions before the fork
    point on calls that run again are asked again, or, with `keep_decisions`, kept as
    `actor`'s own if `actor` may make every one of them. Nothing is written when it is
    refused."""
    actor = checked_actor(actor)
    source, prefix, calls, again, open_calls = _plan(conn, source_id, at)
    if runner == "durable" and source.runner != "durable":
        raise ControlRefusedError(
            f"run {source_id} ran on the inline runner, whose journal the durable runner "
            "cannot replay (it records no loop shapes): fork it without a broker"
        )
    kept = kept_decisions(app, source_id, actor, open_calls) if keep_decisions else {}

    run_id, thread_id = new_id(), new_id()
    request = RunRequest(
        agent=source.agent,
        input=source.input,
        actor=source.actor,
        thread_id=thread_id,
        persona=source.persona,
        metadata={
            **{k: v for k, v in source.metadata.items() if k != "parent_call_id"},
            "forked_from": {"run_id": source_id, "step": at, "by": actor},
        },
    )
    check_request(app, request)
    create_run(
        conn, request, run_id=run_id, runner=runner, status=status, app=app, depth=source.depth
    )
    ids = {"run_id": {source_id: run_id}, "thread_id": {source.thread_id: thread_id}}
    journal = [_copied(row, run_id, ids, kept) for row in prefix if _copies(row, open_calls, kept)]
    forks.copy_journal(conn, journal)
    _copy_thread(conn, source, thread_id, run_id, prefix)
    forks.copy_calls(conn, _calls(calls, run_id, thread_id, prefix, kept))
    answer = Forked(
        run_id,
        thread_id,
        source_id,
        at,
        again,
        asked_again=_asked_again(again, open_calls, kept),
        kept_decisions=[_again(call) for call_id, call in open_calls.items() if call_id in kept],
    )
    data = answer.as_json()
    event_rows.append(
        conn,
        [
            (thread_id, run_id, session.FORK, {"by": actor, **data}),
            (
                source.thread_id,
                source_id,
                session.FORKED,
                {"by": actor, "fork": run_id, "at": at},
            ),
        ],
    )
    return answer


@dataclass(frozen=True)
class Preview:
    """What a fork at `at` would run again, before anyone makes it (nothing is written)."""

    at: str
    runs_again: list[Again]
    asked_again: list[Again]

    def as_json(self) -> dict[str, Any]:
        def listed(found: list[Again]) -> list[dict[str, str]]:
            return [{"step": a.step, "tool": a.tool, "call_id": a.call_id} for a in found]

        return {
            "at": self.at,
            "runs_again": listed(self.runs_again),
            "asked_again": listed(self.asked_again),
        }


def preview(conn: Connection, source_id: str, at: str) -> Preview:
    """A fork of `source_id` at `at` as `fork` would make it, with no decision kept:
    refused as it would be; nothing is written."""
    plan = _plan(conn, source_id, at)
    return Preview(at, plan.again, _asked_again(plan.again, plan.open_calls, {}))


class _Plan(NamedTuple):
    source: RunView
    prefix: list[JournalRow]
    calls: Sequence[Any]
    again: list[Again]
    open_calls: dict[str, Any]


def _plan(conn: Connection, source_id: str, at: str) -> _Plan:
    """The source, the journal a fork at `at` copies, and what it runs again; refused
    (`InvalidRequestError`, `UnknownRunError`, `ControlRefusedError`) where a fork is."""
    if not isinstance(at, str) or not at.strip():
        raise InvalidRequestError("a fork needs the step to fork at (--at STEP)")
    found = run_rows.get_run(conn, source_id)
    if found is None:
        raise UnknownRunError(source_id)
    rows = list(journal_rows.load(conn, source_id))
    if any(row.state == PRUNED for row in rows):
        raise ControlRefusedError(f"run {source_id}'s journal was pruned: it cannot be forked")
    point = fork_point(source_id, rows, at)
    prefix = [row for row in rows if row.seq < point.seq]
    _check_prefix(source_id, prefix)
    calls = toolcalls.run_calls(conn, source_id)
    again = runs_again(calls, [row for row in rows if row.seq >= point.seq])
    return _Plan(RunView.from_row(found), prefix, calls, again, undecided_at(calls, prefix))


# --- the fork point --------------------------------------------------------------------


def fork_point(source_id: str, rows: Sequence[JournalRow], at: str) -> JournalRow:
    """The row of `rows` (the source's journal) a fork may start at, named `at`; else
    `InvalidRequestError`, saying where it may."""
    by_name = {row.step: row for row in rows}
    point = by_name.get(at)
    if point is None:
        raise InvalidRequestError(
            f"run {source_id} has no step {at!r} in its journal: `agent-jobs journal "
            f"{source_id}` lists its steps"
        )
    again = names.retried(at)
    if again is not None:
        raise InvalidRequestError(
            f"{at} runs {again[0]} again: fork at {again[0]} to run it again in the fork"
        )
    parsed = names.parse(at)
    if parsed is not None and parsed.kind in ("usage", "summary_usage"):
        raise InvalidRequestError(
            f"{at} records the tokens of a model call the fork would reuse (charging it "
            "twice): fork at the model step before it to call the model again, or at the "
            "step after it"
        )
    if _in_fanout(rows, point):
        raise InvalidRequestError(
            f"{at} is inside a fan-out (reads of one model turn that run together): fork "
            "at the fan-out's first step, or after it"
        )
    return point


def _in_fanout(rows: Sequence[JournalRow], point: JournalRow) -> bool:
    """Whether `point` is a fan-out member's step after the fan-out's first row: a row of a
    tool call (its run, its questions' answers) right after another call's, with nothing
    of the turn's between (a sequential call's rows are followed by its outcome first)."""
    if _member_call(point) is None:
        return False
    by_seq = {row.seq: row for row in rows}
    seq = point.seq - 1
    while (row := by_seq.get(seq)) is not None and (call := _member_call(row)) is not None:
        if call != _member_call(point):
            return True
        seq -= 1
    return False


def _member_call(row: JournalRow) -> str | None:
    """The call id of a tool step's or an answers step's row (its intent names it)."""
    parsed = names.parse(names.attempted(row.step))
    if parsed is None or parsed.kind not in _MEMBER_KINDS or not isinstance(row.intent, Mapping):
        return None
    call = row.intent.get("call")
    call_id = call.get("id") if isinstance(call, Mapping) else row.intent.get("call_id")
    return call_id if isinstance(call_id, str) else None


def _check_prefix(source_id: str, prefix: Sequence[JournalRow]) -> None:
    """Every copied step finished: done, or failed and run again to done within the
    prefix."""
    last = last_runs(prefix)
    for step, (_, row) in sorted(last.items(), key=lambda item: item[1][1].seq):
        if row.state != "done":
            raise ControlRefusedError(
                f"step {step} of run {source_id}, before the fork point, has not finished "
                f"({row.state}): fork at {step} or before it"
            )


def runs_again(calls: Sequence[Any], after: Sequence[JournalRow]) -> list[Again]:
    """The source's `action` tool steps from the fork point on (`calls`: the source's
    tool-call records): they ran (or began) there and will run again in the fork (a new
    run: another idempotency key)."""
    kinds = {row.call_id: row.kind for row in calls}
    found: dict[str, Again] = {}
    for row in sorted(after, key=lambda r: r.seq):
        step = names.attempted(row.step)
        parsed = names.parse(step)
        intent = row.intent if isinstance(row.intent, Mapping) else {}
        call = intent.get("call") if intent.get("type") == "invoke_tool" else None
        if parsed is None or parsed.kind != "tool" or not isinstance(call, Mapping):
            continue
        call_id, tool = str(call.get("id")), str(call.get("name"))
        if kinds.get(call_id) == "action" and step not in found:
            found[step] = Again(step, tool, call_id)
    return list(found.values())


# --- decisions ---------------------------------------------------------------------------


def undecided_at(calls: Sequence[Any], prefix: Sequence[JournalRow]) -> dict[str, Any]:
    """Of the source's tool-call records, the `action` calls decided before the fork point
    whose outcome comes after it (their handler runs in the fork), by call id: the
    decisions a fork does not inherit."""
    copied = {row.step for row in prefix}
    return {
        call.call_id: call
        for call in calls
        if call.kind == "action"
        and names.approval(call.call_id) in copied
        and names.toolexec(call.call_id) not in copied
    }


def kept_decisions(
    app: AgentApp, source_id: str, actor: str, calls: Mapping[str, Any]
) -> dict[str, Decision]:
    """The decisions `actor` keeps, as their own, by call id: each one they may make, as
    a decision on the call is judged (`approvals/record.py`); else `NotAnApproverError`
    naming the first they may not."""
    kept: dict[str, Decision] = {}
    for call_id, call in calls.items():
        if call.decision is None:  # decided by no one (a deadline's verdict has its own)
            continue
        escalated = escalated_to(call)
        if not may_decide(app, actor, call.name, escalated):
            roles = ", ".join(decider_roles(app, call.name, escalated) or ())
            raise NotAnApproverError(
                f"actor {actor!r} may not decide call {call_id} ({call.name}) of run "
                f"{source_id}, so cannot keep its decision: it needs one of the roles "
                f"{roles}. Fork without keeping decisions and it is asked again"
            )
        reason = f"kept when forking run {source_id} (decided there by {call.decided_by})"
        kept[call_id] = Decision(decision=call.decision, actor=actor, reason=reason)
    return kept


def _copies(row: JournalRow, open_calls: Mapping[str, Any], kept: Mapping[str, Decision]) -> bool:
    """Whether a row of the prefix is copied: all but the decisions the fork asks again."""
    for call_id in open_calls:
        if row.step == names.approval(call_id):
            return call_id in kept
    return True


def _again(call: Any) -> Again:
    return Again(names.approval(call.call_id), call.name, call.call_id)


def _asked_again(
    again: Sequence[Again], open_calls: Mapping[str, Any], kept: Mapping[str, Decision]
) -> list[Again]:
    """The calls a person is asked about again: each decided before the fork point and not
    kept, then each `action` call after it that will run again (its turn asks anew)."""
    asked = {call_id: _again(call) for call_id, call in open_calls.items() if call_id not in kept}
    for a in again:
        if a.call_id not in asked and a.call_id not in kept:
            asked[a.call_id] = Again(names.approval(a.call_id), a.tool, a.call_id)
    return list(asked.values())


# --- what is copied ----------------------------------------------------------------------


def _copied(
    row: JournalRow, run_id: str, ids: dict[str, dict[str, str]], kept: Mapping[str, Decision]
) -> dict[str, Any]:
    """A row of the source's journal as the fork's: its ids made the fork's, and a kept
    decision made the forker's."""
    values = row.as_dict()
    for call_id, decision in kept.items():
        if row.step == names.approval(call_id):
            values["result"] = decision.model_dump(mode="json")
    values.update(
        run_id=run_id,
        intent=_rehomed(values["intent"], ids),
        lease_until=None,
        holder=None,
        not_before=None,
    )
    return values


def _rehomed(value: Any, ids: dict[str, dict[str, str]]) -> Any:
    """`value` (an intent's JSON) with the source's run and thread ids made the fork's."""
    if isinstance(value, dict):
        return {
            key: ids[key].get(item, item)
            if key in ids and isinstance(item, str)
            else _rehomed(item, ids)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_rehomed(item, ids) for item in value]
    return value


def _copy_thread(
    conn: Connection, source: RunView, thread_id: str, run_id: str, prefix: Sequence[JournalRow]
) -> None:
    """The fork's thread: the source thread's history before the source run, then what the
    copied steps wrote; its title if the source had it before it began."""
    before = forks.history_before(conn, source.thread_id, source.run_id, source.created_at)
    forks.copy_messages(conn, thread_id, before)
    forks.add_messages(conn, thread_id, run_id, written(prefix))
    title = threads.thread_title(conn, source.thread_id)
    if title is not None and names.PERSIST_TITLE not in {row.step for row in prefix}:
        threads.set_title(conn, thread_id, title)


def written(prefix: Sequence[JournalRow]) -> list[Message]:
    """The messages the steps of `prefix` wrote to their thread, in order, as the executor
    wrote them (agent_jobs/executor.py)."""
    out: list[Message] = []
    for row in sorted(prefix, key=lambda r: r.seq):
        kind = row.intent.get("type") if isinstance(row.intent, Mapping) else None
        if kind == "prepare_step":
            prepared = Prepared.model_validate(row.result)
            if prepared.rejected is None:
                texts = [*prepared.claimed, *prepared.messages]
                out += [Message(role="user", content=text) for text in texts]
        elif kind in ("persist_user", "persist_assistant", "persist_toolexec"):
            intent = parse_intent(row.intent)
            if isinstance(intent, PersistUserMessage):
                out.append(Message(role="user", content=intent.content))
            elif isinstance(intent, PersistAssistant):
                out.append(
                    Message(role="assistant", content=intent.text, tool_calls=intent.tool_calls)
                )
            elif isinstance(intent, PersistToolExec):
                out.append(
                    Message(
                        role="tool",
                        content=intent.content,
                        tool_call_id=intent.call.id,
                        name=intent.call.name,
                        is_error=intent.status != "executed",
                    )
                )
    return out


def _calls(
    calls: Sequence[Any],
    run_id: str,
    thread_id: str,
    prefix: Sequence[JournalRow],
    kept: Mapping[str, Decision],
) -> list[dict[str, Any]]:
    """The source's tool-call records the copied steps wrote, as they stood at the fork
    point, with no decision but those kept."""
    copied = {row.step: row for row in prefix}
    out: list[dict[str, Any]] = []
    for call in calls:
        recorded = copied.get(names.toolcall(call.call_id))
        if recorded is None:
            continue
        values = dict(call._mapping)
        values.update(run_id=run_id, thread_id=thread_id, handler_started_at=None)
        if names.toolexec(call.call_id) not in copied:  # its outcome comes after the fork
            verdict = CallVerdict.model_validate(recorded.result)
            values.update(status=verdict.status, result=None, error=verdict.error)
            decision = kept.get(call.call_id)
            if decision is not None:  # kept: the forker's own
                values.update(
                    status="approved" if decision.approved else "rejected",
                    decision=decision.decision,
                    decided_by=decision.actor,
                    decision_reason=decision.reason,
                    decided_at=utcnow(),
                )
            else:  # asked again in the fork
                values.update(
                    decision=None,
                    decided_by=None,
                    decision_reason=None,
                    decided_at=None,
                    requested_at=None,
                    approval_deadline=None,
                    escalated=False,
                    approvers=None,
                )
        out.append(values)
    return out
