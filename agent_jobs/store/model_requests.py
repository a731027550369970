"""A model step's request, journaled as what changed since the run's previous model step.

Each model call's request carries the whole conversation and the tool schemas, so a run
that journaled every request whole would write O(n²) bytes over n model steps. The
durable runner journals a model step's intent against the run's model step before it
(`since`): the messages it adds to that request's, and the system prompt and tools only
if they changed. A request that does not extend the one before (a sliding window dropped
messages, a summary replaced them) is journaled whole. `expand` gives the whole request
back from the run's earlier model intents; the step that calls the model is the only
reader that needs it (a replay returns the recorded result and reads no intent).

    {"type": "model_turn", "request": {..., "messages": [the new ones]},
     "since": {"step": "model:1", "messages": 4, "system": true, "tools": true}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

MODEL_TURN = "model_turn"


def is_model_turn(intent: Any) -> bool:
    return isinstance(intent, Mapping) and intent.get("type") == MODEL_TURN


def slim(intent: dict[str, Any], before: tuple[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """`intent` (whole) as journaled after `before`: (step, whole intent) of the run's
    previous model step, or None."""
    if before is None:
        return intent
    step, previous = before
    request, earlier = intent["request"], previous["request"]
    kept = len(earlier["messages"])
    if request["messages"][:kept] != earlier["messages"]:
        return intent  # not an extension: journaled whole
    slimmed = {k: v for k, v in request.items() if k not in ("system", "tools")}
    slimmed["messages"] = request["messages"][kept:]
    since: dict[str, Any] = {"step": step, "messages": kept}
    for field in ("system", "tools"):
        if request.get(field) == earlier.get(field):
            since[field] = True
        else:
            slimmed[field] = request.get(field)
    return {**intent, "request": slimmed, "since": since}


def expand(
    intent: Mapping[str, Any], earlier: Callable[[str], Mapping[str, Any] | None]
) -> dict[str, Any]:
    """The whole intent of a model step journaled by `slim`; `earlier(step)` gives the
    journaled intent of another model step of the run. Raises `ValueError` if one is
    missing."""
    chain = [intent]  # back to an intent journaled whole
    while (since := chain[-1].get("since")) is not None:
        found = earlier(since["step"])
        if found is None:
            raise ValueError(f"the journal has no intent for {since['step']}")
        chain.append(found)
    whole = dict(chain.pop())
    while chain:
        step = chain.pop()
        since, base = step["since"], whole["request"]
        request = dict(step["request"])
        request["messages"] = base["messages"][: since["messages"]] + list(request["messages"])
        for field in ("system", "tools"):
            if since.get(field):
                request[field] = base[field]
        whole = {k: v for k, v in step.items() if k != "since"}
        whole["request"] = request
    return whole
