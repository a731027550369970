"""`mcp:tools`: a run's list of MCP tools, taken from the servers its agent names."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..checkpoints import McpToolInfo, McpToolList
from ..errors import ConfigurationError, ToolError

if TYPE_CHECKING:
    from ..app import AgentApp

log = logging.getLogger(__name__)


def listed(app: AgentApp, wanted: Iterable[str]) -> McpToolList:
    """The tools `wanted` names (`<server>.<tool>` or `<server>.*`), as their servers list
    them now. A server that cannot be reached offers nothing this run (a call of one of
    its tools is then a tool error the model sees); a name its server does not list is a
    `ConfigurationError` that says what the server offers."""
    by_server: dict[str, list[str]] = {}
    for name in wanted:
        server = app.mcp_server_of(name)
        if server is not None:
            by_server.setdefault(server.name, []).append(name.split(".", 1)[1])
    found = McpToolList()
    for server_name, tools in by_server.items():
        server = app.mcp_servers[server_name]
        try:
            offered = server.listed()
        except ToolError as exc:
            log.warning("MCP server %s could not be listed: %s", server_name, exc)
            found.unavailable[server_name] = str(exc)
            continue
        names = {tool.tool for tool in offered}
        missing = sorted(t for t in tools if t != "*" and t not in names)
        if missing:
            raise ConfigurationError(
                f"MCP server {server_name!r} has no tool named "
                f"{', '.join(repr(t) for t in missing)}; it offers: "
                f"{', '.join(sorted(names)) or 'nothing'}"
            )
        every = "*" in tools
        found.tools.extend(tool for tool in offered if every or tool.tool in tools)
    return found


__all__ = ["McpToolInfo", "McpToolList", "listed"]
