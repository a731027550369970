"""The MCP server of the MCP tests, written with the SDK's `MCPServer`: run as a stdio
subprocess (`python -m tests.support.mcp_server`) or served over streamable HTTP in
the test process (`HttpServer`), where a test may change its tools between runs.

Every call appends `<tool> <pid> <args>` to `$TEST_MCP_LOG` (when set), so a test can
count the server processes that served its calls; `write_file` waits for the gate
`$TEST_GATE_DIR/<text>` when the text starts with `gate:`, so a test can kill the worker
in the middle of it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel

READ = ToolAnnotations(readOnlyHint=True)


def _log(tool: str, **args: Any) -> None:
    path = os.environ.get("TEST_MCP_LOG")
    if path:
        with open(path, "a") as out:
            out.write(f"{tool} {os.getpid()} {json.dumps(args, sort_keys=True)}\n")


class Account(BaseModel):
    account: str


def _which_account() -> Elicit[Account]:
    return Elicit("From which account should the refund be paid?", Account)


def build(name: str = "files") -> MCPServer:
    server = MCPServer(name)

    @server.tool(annotations=READ)
    def read_file(path: str) -> str:
        """Read a file of the test's store."""
        _log("read_file", path=path)
        return f"contents of {path}"

    @server.tool(annotations=READ)
    def stat(path: str) -> dict[str, Any]:
        """A file's size."""
        _log("stat", path=path)
        return {"path": path, "size": len(path)}

    @server.tool()
    def write_file(path: str, text: str) -> dict[str, Any]:
        """Write a file: an action (no read-only hint)."""
        _log("write_file:start", path=path, text=text)
        if text.startswith("gate:"):
            gate = Path(os.environ["TEST_GATE_DIR"]) / text.removeprefix("gate:")
            deadline = time.monotonic() + 60
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        _log("write_file", path=path, text=text)
        return {"wrote": path, "bytes": len(text)}

    @server.tool()
    def refund(
        order_id: str, account: Annotated[Account, Resolve(_which_account)]
    ) -> dict[str, Any]:
        """Refund an order, from the account the person names (asked by elicitation)."""
        _log("refund", order_id=order_id, account=account.account)
        return {"refunded": order_id, "from": account.account}

    @server.tool()
    async def confirm(order_id: str, ctx: Context) -> dict[str, Any]:
        """Asks in the middle of the call (a server of an older protocol version)."""
        first = await ctx.elicit(f"Really close {order_id}?", Account)
        second = await ctx.elicit("And the reason?", Account)
        _log("confirm", order_id=order_id, first=first.action, second=second.action)
        said = [getattr(getattr(r, "data", None), "account", None) for r in (first, second)]
        return {"closed": order_id, "actions": [first.action, second.action], "said": said}

    @server.tool(annotations=READ)
    async def hang(seconds: float = 3600) -> str:
        """Never answers (in time)."""
        _log("hang")
        await asyncio.sleep(seconds)
        return "woke"

    return server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class HttpServer:
    """`build()` served over streamable HTTP by uvicorn in a thread of this process."""

    def __init__(self, port: int | None = None) -> None:
        import uvicorn

        self.mcp = build("web")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(
            self.mcp.streamable_http_app(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> HttpServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the MCP HTTP server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


if __name__ == "__main__":
    build().run()
