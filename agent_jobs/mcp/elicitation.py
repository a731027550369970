"""An MCP server's elicitation as a question to the run's actor, and its answer back.

A server that needs input in the middle of a call answers the call with an
`InputRequiredResult` (the protocol's multi-round-trip requests): what it asks, keyed,
and an opaque state. Nothing waits: the call ends there, and each elicitation becomes a
question (`id` = the request's key) that the run journals and waits on
(`awaiting_answers`), holding no worker. Once the person answers, the call is made
again from the start, on whatever connection the pool lends: each time the server asks
a question that has an answer, it is given at once (with the server's fresh state) in
the same call, so the answers never depend on the state of a server process that may
have gone. A question with no answer yet is asked of the person in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ToolError

SOURCE = "mcp_elicitation"


@dataclass(frozen=True)
class Asked:
    """The call ended on questions nobody has answered yet."""

    questions: list[dict[str, Any]]


class MidCall:
    """One call on a connection whose server elicits in the middle of the call (protocol
    versions before multi-round-trip requests): the n-th elicitation is the question
    `elicitation_<n>`. One with an answer gets it; the first without ends the call (the
    server is told `cancel`, and the connection is not lent again), and is asked."""

    def __init__(self, server: str, tool: str, answers: Mapping[str, Any] | None) -> None:
        self.server = server
        self.tool = tool
        self.answers = answers
        self.count = 0
        self.asked: list[dict[str, Any]] | None = None
        self.cancelled = False
        self.task: asyncio.Task[Any] | None = None

    async def elicited(self, params: Any) -> Any:
        from mcp.types import ElicitResult

        self.count += 1
        key = f"elicitation_{self.count}"
        if self.answers is not None and key in self.answers:
            return answered(params, self.answers[key])
        self.asked = [question(self.server, self.tool, key, params)]
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()
        return ElicitResult(action="cancel")


def respond(
    server: str, tool: str, result: Any, answers: Mapping[str, Any] | None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The responses to a round's input requests that the answers give, and the
    questions still open (each with the request's key as its `id`)."""
    from mcp.types import ElicitRequest, ListRootsRequest, ListRootsResult

    responses: dict[str, Any] = {}
    asked: list[dict[str, Any]] = []
    for key, request in (result.input_requests or {}).items():
        if isinstance(request, ListRootsRequest):
            responses[key] = ListRootsResult(roots=[])
        elif not isinstance(request, ElicitRequest):
            raise ToolError(
                f"{server}.{tool} asked the client to sample a model, which this client "
                "does not offer"
            )
        elif answers is not None and key in answers:
            responses[key] = answered(request.params, answers[key])
        else:
            asked.append(question(server, tool, key, request.params))
    return (responses or None), asked


def question(server: str, tool: str, key: str, params: Any) -> dict[str, Any]:
    """An elicitation as the run's question: what it says, and what the answer holds."""
    asked: dict[str, Any] = {
        "id": key,
        "question": params.message,
        "source": SOURCE,
        "server": server,
        "tool": tool,
    }
    schema = getattr(params, "requested_schema", None)
    if schema is not None:
        asked["schema"] = schema
    url = getattr(params, "url", None)
    if url is not None:
        asked["url"] = url
    return asked


def answered(params: Any, answer: Any) -> Any:
    """A person's answer as the elicitation's result.

    `"decline"` or `"cancel"` say so; an object (or its JSON text, as the HTTP API and
    the CLI carry answers as strings) is the form's content, accepted; so is
    `{"action": "accept" | "decline" | "cancel", "content": {...}}`; a lone value fills
    a form that has one field (a URL elicitation: any value but "decline" accepts).
    """
    from mcp.types import ElicitResult

    if isinstance(answer, str) and answer in ("decline", "cancel"):
        return ElicitResult(action=answer)
    if isinstance(answer, str) and answer.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):  # else not an object after all: a lone value
            answer = json.loads(answer)
    explicit = isinstance(answer, Mapping) and set(answer) <= {"action", "content"}
    if explicit and answer.get("action") in ("accept", "decline", "cancel"):
        content = answer.get("content")
        return ElicitResult(
            action=answer["action"],
            content=dict(content) if isinstance(content, Mapping) else None,
        )
    if isinstance(answer, Mapping):
        return ElicitResult(action="accept", content=dict(answer))
    if getattr(params, "mode", None) == "url":
        return ElicitResult(action="accept")
    fields = list((getattr(params, "requested_schema", None) or {}).get("properties", {}))
    if len(fields) == 1:
        return ElicitResult(action="accept", content={fields[0]: answer})
    raise ToolError(
        "the answer to an MCP form with several fields must be an object of its fields "
        "(or its JSON text), or 'decline' / 'cancel'"
    )
