"""Tools from MCP servers (`app.mcp(...)`): see docs/mcp.md."""

from __future__ import annotations

from ..checkpoints import McpToolInfo, McpToolList
from .servers import McpServer, McpTool

__all__ = ["McpServer", "McpTool", "McpToolInfo", "McpToolList"]
