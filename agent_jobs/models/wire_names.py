"""Tool names as a provider's API accepts them, and back.

OpenAI's and Anthropic's APIs take a tool name of letters, digits, `_` and `-` (at most 64):
an MCP tool's `<server>.<tool>` is not one. A request's names that do not fit are sent as
names that do (`files.read_file` → `files_read_file`, with a suffix should that be taken),
and the reply's calls are named back. The mapping is a function of the request's names
alone, so every model step of a run (whose tools do not change) sends the same ones.
"""

from __future__ import annotations

import re

from ..messages import Message, ModelRequest, ModelResponse

_FITS = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_UNFIT = re.compile(r"[^A-Za-z0-9_-]")


class WireNames:
    """One request's names: ours to the provider's, and back."""

    def __init__(self, to_wire: dict[str, str]) -> None:
        self.to_wire = to_wire
        self.from_wire = {wire: name for name, wire in to_wire.items()}

    @classmethod
    def of(cls, request: ModelRequest) -> WireNames:
        names = {spec.name for spec in request.tools}
        names.update(call.name for message in request.messages for call in message.tool_calls)
        taken = {name for name in names if _FITS.match(name)}
        to_wire: dict[str, str] = {}
        for name in sorted(names - taken):
            base = _UNFIT.sub("_", name)[:56] or "tool"
            wire, n = base, 1
            while wire in taken:
                n += 1
                wire = f"{base}_{n}"
            to_wire[name] = wire
            taken.add(wire)
        return cls(to_wire)

    def outgoing(self, request: ModelRequest) -> ModelRequest:
        """The request with the provider's names."""
        if not self.to_wire:
            return request
        tools = [
            spec.model_copy(update={"name": self.to_wire.get(spec.name, spec.name)})
            for spec in request.tools
        ]
        messages = [self._message(message) for message in request.messages]
        return request.model_copy(update={"tools": tools, "messages": messages})

    def _message(self, message: Message) -> Message:
        calls = [
            call.model_copy(update={"name": self.to_wire.get(call.name, call.name)})
            for call in message.tool_calls
        ]
        name = self.to_wire.get(message.name, message.name) if message.name else message.name
        return message.model_copy(update={"tool_calls": calls, "name": name})

    def incoming(self, response: ModelResponse) -> ModelResponse:
        """The reply with our names."""
        if not self.from_wire:
            return response
        calls = [
            call.model_copy(update={"name": self.from_wire.get(call.name, call.name)})
            for call in response.tool_calls
        ]
        return response.model_copy(update={"tool_calls": calls})
