"""The app of the MCP tests (workers load it with AGENT_JOBS_APP=tests.support.apps.mcp:app):
the stdio server `files` (tests/support/mcp_server.py, started by each process that
calls it) and the streamable HTTP server `web` at `$TEST_MCP_URL`, which the test serves
itself; `$TEST_MCP_DOWN` names a URL where nothing answers (`down`)."""

from __future__ import annotations

import os
import sys
from typing import Any

from agent_jobs import AgentApp, ScriptedModel

app = AgentApp(roles={"user-7": ["support"], "alice": ["lead"], "backend": ["service"]})

_PASSED = ("TEST_MCP_LOG", "TEST_GATE_DIR", "PYTHONPATH")
app.mcp(
    "files",
    command=[sys.executable, "-m", "tests.support.mcp_server"],
    env={name: os.environ[name] for name in _PASSED if name in os.environ},
    approvers=["lead"],
)
# The same server, with a short time limit on a call.
app.mcp(
    "slow",
    command=[sys.executable, "-m", "tests.support.mcp_server"],
    env={name: os.environ[name] for name in _PASSED if name in os.environ},
    timeout=2,
)
# The same server, whose actions are rejected unless approved within a second.
app.mcp(
    "timed",
    command=[sys.executable, "-m", "tests.support.mcp_server"],
    env={name: os.environ[name] for name in _PASSED if name in os.environ},
    approvers=["lead"],
    approval_timeout=1,
)
app.mcp(
    "web",
    url=os.environ.get("TEST_MCP_URL", "http://127.0.0.1:9/mcp"),
    headers={"X-Test": "1"},
    approvers=["lead"],
)
app.mcp("down", url=os.environ.get("TEST_MCP_DOWN", "http://127.0.0.1:9/mcp"), timeout=5)


@app.tool(kind="read")
def lookup(order_id: str) -> dict[str, Any]:
    """A plain tool beside the MCP ones."""
    return {"order_id": order_id, "status": "shipped"}


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args} for name, args in calls]}


DONE = {"text": "done"}

# Reads of a server fanned out with a plain tool, in one model turn.
app.agent(
    "reader",
    model=ScriptedModel(
        [
            _calls(
                ("files.read_file", {"path": "a.txt"}),
                ("files.stat", {"path": "b.txt"}),
                ("lookup", {"order_id": "42"}),
            ),
            DONE,
        ]
    ),
    tools=["files.*", "lookup"],
)
# An action: approved, then run.
app.agent(
    "writer",
    model=ScriptedModel([_calls(("files.write_file", {"path": "w.txt", "text": "hi"})), DONE]),
    tools=["files.read_file", "files.write_file"],
)
# An action that waits for the gate named in its text (the run's own id is unknown to the
# script: the test opens the gate `held`).
app.agent(
    "held_writer",
    model=ScriptedModel(
        [_calls(("files.write_file", {"path": "h.txt", "text": "gate:held"})), DONE]
    ),
    tools=["files.write_file"],
)
# An action nobody approves in time.
app.agent(
    "timed_writer",
    model=ScriptedModel([_calls(("timed.write_file", {"path": "t.txt", "text": "x"})), DONE]),
    tools=["timed.write_file"],
)
# An elicitation: the server asks which account; the person answers.
app.agent(
    "refunder",
    model=ScriptedModel([_calls(("files.refund", {"order_id": "42"})), DONE]),
    tools=["files.refund"],
)
# A server nobody serves: the model sees a tool error.
app.agent(
    "unreachable",
    model=ScriptedModel([_calls(("down.read_file", {"path": "a.txt"})), DONE]),
    tools=["down.*", "lookup"],
)
# A server that hangs: the call's time limit holds (the server's `timeout`; the
# step's time limit, for `hanger_limited` on a worker started with a short one).
app.agent(
    "hanger",
    model=ScriptedModel([_calls(("slow.hang", {})), DONE]),
    tools=["slow.hang"],
)
app.agent(
    "hanger_limited",
    model=ScriptedModel([_calls(("files.hang", {})), DONE]),
    tools=["files.hang"],
)
# The HTTP server's tools: an action (the run waits for its approval, while the test adds
# a tool to the server), then the added tool.
app.agent(
    "web_changing",
    model=ScriptedModel(
        [
            _calls(("web.write_file", {"path": "a", "text": "x"})),
            _calls(("web.added", {"path": "b"})),
            DONE,
        ]
    ),
    tools=["web.*"],
)
app.agent(
    "web_refunder",
    model=ScriptedModel([_calls(("web.refund", {"order_id": "7"})), DONE]),
    tools=["web.refund"],
)
# A plain tool and an MCP read in one run, one after the other: the bench's pair.
app.agent(
    "bench",
    model=ScriptedModel(
        [_calls(("lookup", {"order_id": "1"})), _calls(("files.stat", {"path": "x"})), DONE]
    ),
    tools=["lookup", "files.stat"],
)
