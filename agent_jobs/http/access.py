"""Who may do what with a run, decided against the store (never against a frame).

- A run is read (`GET /v1/runs/{id}`, its steps, its stream, the runs list) by its actor,
  by `service` and `operator` actors, and by actors who may decide one of the action
  calls of its tree (the run that was asked
  for and the runs it delegated to): an approver follows what they decide on. Anyone
  else is told there is no such run (404), as for an id that does not exist, so a token
  cannot probe which runs exist.
- Its calls are decided by the actors the tool's `approvers` name (an escalated call's:
  the roles it went to), checked as the approvals channel checks them
  (`app.roles.may_approve`).
- Its questions are answered, and it is steered, by its actor and by `service` actors;
  it is cancelled, paused, resumed, retried and forked by those and by `operator` actors;
  another actor who may read it is refused (403).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..app import AgentApp
from ..approvals.record import may_decide as decides
from ..errors import NotYoursError, UnknownRunError
from ..store import RunView
from .auth import Caller
from .door import Door


def may_decide(app: AgentApp, caller: Caller, call: Mapping[str, Any]) -> bool:
    """Whether the caller's decision on `call` (its record) counts, as `record_decision`
    judges it (`approvals.record.decider_roles`)."""
    escalated = call["approvers"] if call.get("escalated") else None
    return decides(app, caller.actor, call["name"], escalated)


def owns(caller: Caller, run: RunView) -> bool:
    """The run's own actor, or a service acting for it."""
    return caller.is_service or run.actor == caller.actor


def controls(caller: Caller, run: RunView) -> bool:
    """Who may cancel, pause, resume, retry or fork the run: those who own it, operators."""
    return caller.is_operator or owns(caller, run)


def may_read(door: Door, caller: Caller, run: RunView) -> bool:
    if caller.reads_every_run or owns(caller, run):
        return True
    root = run if run.root_run_id == run.run_id else door.store.find_run(run.root_run_id)
    if root is not None and owns(caller, root):
        return True
    for run_id in door.store.run_tree(run.root_run_id):
        for call in door.store.tool_calls(run_id):
            if call["kind"] == "action" and may_decide(door.app, caller, call):
                return True
    return False


def readable_among(door: Door, caller: Caller, found: Sequence[RunView]) -> list[RunView]:
    """The runs of `found` (a page of the list) the caller may read, judged as `may_read`
    judges one, with two queries for them all (`Store.trees`)."""
    unsure = [run for run in found if not (caller.reads_every_run or owns(caller, run))]
    if not unsure:
        return list(found)
    trees = door.store.trees({run.root_run_id for run in unsure})

    def readable(run: RunView) -> bool:
        if caller.reads_every_run or owns(caller, run):
            return True
        if trees.owners.get(run.root_run_id) == caller.actor:
            return True
        calls = trees.calls.get(run.root_run_id, ())
        return any(may_decide(door.app, caller, call) for call in calls)

    return [run for run in found if readable(run)]


def readable_run(door: Door, caller: Caller, run_id: str) -> RunView:
    """The run, when the caller may read it; `UnknownRunError` (404) otherwise."""
    run = door.store.find_run(run_id)
    if run is None or not may_read(door, caller, run):
        raise UnknownRunError(run_id)
    return run


def owned_run(door: Door, caller: Caller, run_id: str, doing: str) -> RunView:
    """The run, when the caller may act on it as its actor would (steer, cancel, answer)."""
    run = readable_run(door, caller, run_id)
    if not owns(caller, run):
        raise NotYoursError(
            f"only run {run_id}'s actor ({run.actor}) or a 'service' actor may {doing}"
        )
    return run


def controlled_run(door: Door, caller: Caller, run_id: str, doing: str) -> RunView:
    """The run, when the caller may control it (cancel, pause, resume, retry, fork)."""
    run = readable_run(door, caller, run_id)
    if not controls(caller, run):
        raise NotYoursError(
            f"only run {run_id}'s actor ({run.actor}), a 'service' or an 'operator' actor "
            f"may {doing}"
        )
    return run
