"""The MCP tests' servers: the stdio servers' log, and the HTTP server of the test
process. Both are named in this process's environment before the MCP app is imported:
the app reads `$TEST_MCP_URL` when it is defined, and each stdio server the pool starts
inherits `$TEST_MCP_LOG`."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_server import HttpServer, free_port

_DIR = Path(tempfile.mkdtemp(prefix="agent-jobs-mcp-"))
_PORT = free_port()
os.environ["TEST_MCP_LOG"] = str(_DIR / "calls.log")
os.environ["TEST_MCP_URL"] = f"http://127.0.0.1:{_PORT}/mcp"
os.environ.setdefault("TEST_GATE_DIR", str(_DIR / "gates"))
(_DIR / "gates").mkdir(exist_ok=True)


class ServerLog:
    """What the test servers record of each call: `<tool> <pid> <args>` lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def calls(self, tool: str | None = None) -> list[tuple[str, int, dict[str, Any]]]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            name, pid, args = line.split(" ", 2)
            if tool is None or name == tool:
                found.append((name, int(pid), json.loads(args)))
        return found

    def pids(self, tool: str | None = None) -> set[int]:
        return {pid for _, pid, _ in self.calls(tool)}


@pytest.fixture
def server_log() -> ServerLog:
    return ServerLog(Path(os.environ["TEST_MCP_LOG"]))


@pytest.fixture
def gates() -> Path:
    return Path(os.environ["TEST_GATE_DIR"])


@pytest.fixture(scope="module")
def web() -> Iterator[HttpServer]:
    """The streamable HTTP server, in this process, at `$TEST_MCP_URL` (a test changes
    its tools)."""
    server = HttpServer(_PORT).start()
    yield server
    server.stop()
