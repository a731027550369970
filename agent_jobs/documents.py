"""What the doors show of a run: the `status --json` object, also `GET /v1/runs/{run_id}`;
its journal as people read it, also `GET /v1/runs/{run_id}/steps`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from . import checkpoints as names
from . import controls
from .messages import args_sha256
from .store import RunView, Store, journal, outcomes, questions, runs, toolcalls
from .store.journal import JournalRow
from .store.model_requests import is_model_turn


def run_document(db: Store, run: RunView) -> dict[str, Any]:
    """The `status --json` object: the run, its usage totals, its pending calls (with the
    digest of their arguments a decision is bound to), its calls whose outcome is unknown,
    who decided which call (when, why), the operator's controls of it (who paused,
    resumed, retried or forked it, and when).

    Read on one connection (one transaction): the HTTP API answers this often.
    """
    doc = run.model_dump(mode="json")
    with db.connect() as conn:
        doc["usage"] = runs.run_totals(conn, run.run_id)
        calls = toolcalls.pending_calls(conn, run_id=run.run_id)
        asked = questions.open_questions(conn, run_id=run.run_id)
        doc["controls"] = controls.history(conn, run.run_id, run.thread_id)
        unknown = outcomes.unknown(conn, run.run_id)
        decided = toolcalls.decided_calls(conn, run.run_id)
    doc["pending_calls"] = [
        {"call_id": c.call_id, "tool": c.name, "args": c.args, "args_sha256": args_sha256(c.args)}
        for c in calls
    ]
    doc["pending_questions"] = [
        {"request_id": q.request_id, "tool": q.tool, "questions": q.questions} for q in asked
    ]
    doc["unknown_calls"] = [unknown_call(run.run_id, row) for row in unknown]
    doc["decisions"] = [
        {
            "call_id": c.call_id,
            "tool": c.name,
            "decision": c.decision,
            "decided_by": c.decided_by,
            "decided_at": iso(c.decided_at),
            "reason": c.decision_reason,
        }
        for c in decided
    ]
    return doc


def unknown_call(run_id: str, row: Any) -> dict[str, Any]:
    """A call whose outcome is unknown, as `agent-jobs reconcile` needs it."""
    intent = row.intent if isinstance(row.intent, Mapping) else {}
    found = intent.get("call")
    call: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    return {
        "call_id": call.get("id"),
        "step": row.step,
        "tool": call.get("name"),
        "args": call.get("args"),
        "idempotency_key": f"{run_id}:{row.step}",
    }


# --- the journal as people read it (`GET /v1/runs/{run_id}/steps`, `agent-jobs journal`) --

StepKind = Literal["local", "model", "tool", "approval", "answers", "child", "timer"]
_KINDS: dict[str, StepKind] = {
    "model": "model",
    "summarize": "model",
    "tool": "tool",
    "approval": "approval",
    "answers": "answers",
    "delegation": "child",
    "timer": "timer",
    "mcp_tools": "tool",
}
_PEOPLE = ("approval", "answers")
# What an intent carries for the runner, not for a person reading it.
_PLUMBING = ("type", "run_id", "thread_id")


def step_kind(step: str) -> StepKind:
    """The kind a person reads a step as: a retry row is the kind of the step it runs
    again; whatever runs in the pass itself (a write, a check) is `local`."""
    parsed = names.parse(names.attempted(step))
    return _KINDS.get(parsed.kind, "local") if parsed is not None else "local"


def steps_document(db: Store, run_id: str) -> dict[str, Any]:
    """`{"steps": [...]}`: each journal row in order, with its timings, who decided it
    (an approval, an answer), the worker that ran it, and its intent and result as a
    person reads them (a model step's request shows the messages it added)."""
    with db.connect() as conn:
        rows = journal.load(conn, run_id)
        calls = {c.call_id: c for c in toolcalls.run_calls(conn, run_id)}
        children = runs.delegated_by_call(conn, run_id)
    return {"steps": [_step(row, calls, children) for row in rows]}


def _step(row: JournalRow, calls: Mapping[str, Any], children: Mapping[str, str]) -> dict[str, Any]:
    kind = step_kind(row.step)
    call_id = _call_of(row, kind)
    call = calls.get(call_id) if call_id is not None else None
    started = row.started_at or row.created_at
    finished = row.finished_at
    doc: dict[str, Any] = {
        "step": row.step,
        "seq": row.seq,
        "kind": kind,
        "state": row.state,
        "attempts": row.attempts,
        "started_at": iso(started),
        "finished_at": iso(finished),
        "duration_ms": _ms(started, finished),
        "intent": shown_intent(row.intent),
        "result": row.result,
        "error": row.error,
        "decided_by": _decider(row, kind),
        # A person completes a wait: the process that wrote their decision ran nothing.
        "worker": None if kind in _PEOPLE else row.worker,
        "call_id": call_id,
        "tool": call.name if call is not None else _tool_of(row),
        "effect": call.kind if call is not None and kind == "tool" else None,
        "child_run_id": _child(row, children, call_id) if kind == "child" else None,
    }
    if kind == "approval" and call is not None and call.decision is not None:
        doc["decision"] = call.decision
        doc["reason"] = call.decision_reason
    return doc


def iso(moment: Any) -> str | None:
    """A stored time as ISO 8601 with its offset (None for no time)."""
    if not isinstance(moment, datetime):
        return None
    return _aware(moment).isoformat()


def _ms(started: datetime | None, finished: datetime | None) -> float | None:
    if started is None or finished is None:
        return None
    return round((_aware(finished) - _aware(started)).total_seconds() * 1000, 1)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _call_of(row: JournalRow, kind: StepKind) -> str | None:
    """The tool call a step belongs to, for the kinds that have one (a timer's is the
    `wait` call it sleeps on: the `call_id` of its `timer` frame)."""
    parsed = names.parse(names.attempted(row.step))
    if parsed is None or kind not in ("tool", "approval", "answers", "child", "timer"):
        return None
    intent = row.intent if isinstance(row.intent, Mapping) else {}
    call = intent.get("call")
    if isinstance(call, Mapping) and isinstance(call.get("id"), str):
        return str(call["id"])
    if kind == "answers":  # `<call id>:<round>`
        return parsed.key.rpartition(":")[0] or parsed.key
    if kind == "tool":  # `<call id>` or `<call id>:<round>`
        return parsed.key
    return parsed.key


def _tool_of(row: JournalRow) -> str | None:
    intent = row.intent if isinstance(row.intent, Mapping) else {}
    call = intent.get("call")
    return str(call["name"]) if isinstance(call, Mapping) and "name" in call else None


def _decider(row: JournalRow, kind: StepKind) -> str | None:
    """Who completed a step a person completes: the decision's or the answers' actor."""
    if kind in ("approval", "answers") and isinstance(row.result, Mapping):
        actor = row.result.get("actor")
        return str(actor) if actor is not None else None
    return None


def _child(row: JournalRow, children: Mapping[str, str], call_id: str | None) -> str | None:
    if isinstance(row.result, Mapping) and row.result.get("child_run_id"):
        return str(row.result["child_run_id"])
    return children.get(call_id) if call_id is not None else None


def shown_intent(intent: Any) -> Any:
    """An intent as a person reads it: a tool step's call (tool, arguments), a model
    step's request as the messages it added to the one before (journaled so), the rest
    without the runner's plumbing."""
    if not isinstance(intent, Mapping):
        return intent
    if is_model_turn(intent):
        return _shown_request(intent)
    call = intent.get("call")
    if intent.get("type") == "invoke_tool" and isinstance(call, Mapping):
        shown = {"call_id": call.get("id"), "tool": call.get("name"), "args": call.get("args")}
        if intent.get("answers"):
            shown["answers"] = intent["answers"]
        return shown
    return {k: v for k, v in intent.items() if k not in _PLUMBING}


def _shown_request(intent: Mapping[str, Any]) -> dict[str, Any]:
    request = intent.get("request")
    request = request if isinstance(request, Mapping) else {}
    shown: dict[str, Any] = {"messages": request.get("messages", [])}
    since = intent.get("since")
    if isinstance(since, Mapping):  # the messages before these: that step's request's
        shown["after"] = {"step": since.get("step"), "messages": since.get("messages")}
    if "system" in request:
        shown["system"] = request["system"]
    tools = request.get("tools")
    if isinstance(tools, list):
        shown["tools"] = [t.get("name") for t in tools if isinstance(t, Mapping)]
    settings = request.get("settings")
    if isinstance(settings, Mapping):
        shown["settings"] = {k: v for k, v in settings.items() if v is not None}
    return shown
