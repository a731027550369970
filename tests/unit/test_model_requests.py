"""A model step's request journaled against the one before: what `slim` drops, `expand`
gives back, and a request that does not extend the one before stays whole."""

from __future__ import annotations

import json
from typing import Any

from agent_jobs.store.model_requests import expand, slim


def _intent(step: int, messages: list[str], *, system: str = "be brief") -> dict[str, Any]:
    tools = [{"name": "lookup", "description": "", "input_schema": {"type": "object"}}]
    return {
        "type": "model_turn",
        "request": {
            "run_id": "r",
            "agent": "a",
            "step": step,
            "system": system,
            "messages": [{"role": "user", "content": m} for m in messages],
            "tools": tools,
            "settings": {},
        },
    }


def _journal(intents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each intent journaled against the one before it, by step name."""
    journaled: dict[str, dict[str, Any]] = {}
    before = None
    for n, whole in enumerate(intents, 1):
        journaled[f"model:{n}"] = slim(whole, before)
        before = (f"model:{n}", whole)
    return journaled


def test_a_request_that_extends_the_last_journals_only_what_is_new() -> None:
    intents = [_intent(n, [f"m{i}" for i in range(2 * n + 1)]) for n in range(50)]
    journaled = _journal(intents)
    last = journaled["model:50"]
    assert [m["content"] for m in last["request"]["messages"]] == ["m97", "m98"]
    assert "tools" not in last["request"] and "system" not in last["request"]
    assert last["since"] == {"step": "model:49", "messages": 97, "system": True, "tools": True}
    for n, whole in enumerate(intents, 1):
        assert expand(journaled[f"model:{n}"], journaled.get) == whole
    # Linear, not quadratic, in the run's length: the 50th is no bigger than the 2nd.
    sizes = [len(json.dumps(journaled[f"model:{n}"])) for n in range(1, 51)]
    assert sizes[49] <= sizes[1] + 10  # a few more digits in the numbers
    assert sum(sizes) < sum(len(json.dumps(i)) for i in intents) / 5


def test_a_request_that_does_not_extend_the_last_is_journaled_whole() -> None:
    first = _intent(0, ["a", "b", "c"])
    windowed = _intent(1, ["c", "d"])  # a sliding window dropped the oldest
    assert slim(windowed, ("model:1", first)) == windowed


def test_a_changed_system_prompt_or_tool_set_is_journaled_again() -> None:
    first = _intent(0, ["a"])
    second = _intent(1, ["a", "b"], system="be thorough")
    journaled = slim(second, ("model:1", first))
    assert journaled["request"]["system"] == "be thorough"
    assert "system" not in journaled["since"] and journaled["since"]["tools"] is True
    assert expand(journaled, {"model:1": first}.get) == second


def test_a_missing_earlier_intent_is_an_error_not_a_wrong_request() -> None:
    journaled = slim(_intent(1, ["a", "b"]), ("model:1", _intent(0, ["a"])))
    try:
        expand(journaled, {}.get)
    except ValueError as exc:
        assert "model:1" in str(exc)
    else:
        raise AssertionError("expanded without its base")
