"""What an approval's card says its deadline does (agent_jobs/http/inbox.py): the page
said "(then the tool's on_timeout applies)" even where a second timeout rejects."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agent_jobs import AgentApp
from agent_jobs.http.inbox import _at_deadline

app = AgentApp(roles={"alice": ["lead"], "mia": ["manager"]})


@app.tool(kind="action", approvers=["lead"], approval_timeout=5)
def lapse(x: int) -> int:
    return x


@app.tool(kind="action", approvers=["lead"], approval_timeout=5, on_timeout="approve")
def lenient(x: int) -> int:
    return x


@app.tool(
    kind="action",
    approvers=["lead"],
    approval_timeout=5,
    on_timeout="escalate",
    escalate_to=["manager"],
)
def escalating(x: int) -> int:
    return x


@app.tool(kind="action", approvers=["lead"])
def whenever(x: int) -> int:
    return x


def call(name: str, *, escalated: bool = False, deadline: bool = True) -> dict[str, Any]:
    due = datetime.now(UTC) if deadline else None
    return {"name": name, "escalated": escalated, "approval_deadline": due}


def test_the_card_says_what_becomes_of_a_call_nobody_decides() -> None:
    assert _at_deadline(app, call("lapse")) == "rejected"
    assert _at_deadline(app, call("lenient")) == "approved"
    assert _at_deadline(app, call("escalating")) == "escalated to manager"
    # Once escalated, its second deadline rejects, whatever the tool's on_timeout says.
    assert _at_deadline(app, call("escalating", escalated=True)) == "rejected"
    assert _at_deadline(app, call("whenever", deadline=False)) is None
    assert _at_deadline(app, call("gone-from-the-app")) == "rejected"
