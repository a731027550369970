"""What the doors show of a run: the `status --json` object, also `GET /v1/runs/{run_id}`."""

from __future__ import annotations

from typing import Any

from . import controls
from .store import RunView, Store, questions, runs, toolcalls


def run_document(db: Store, run: RunView) -> dict[str, Any]:
    """The `status --json` object: the run, its usage totals, its pending calls, the
    operator's controls of it (who paused, resumed, retried or forked it, and when).

    Read on one connection (one transaction): the HTTP API answers this often.
    """
    doc = run.model_dump(mode="json")
    with db.connect() as conn:
        doc["usage"] = runs.run_totals(conn, run.run_id)
        calls = toolcalls.pending_calls(conn, run_id=run.run_id)
        asked = questions.open_questions(conn, run_id=run.run_id)
        doc["controls"] = controls.history(conn, run.run_id, run.thread_id)
    doc["pending_calls"] = [{"call_id": c.call_id, "tool": c.name, "args": c.args} for c in calls]
    doc["pending_questions"] = [
        {"request_id": q.request_id, "tool": q.tool, "questions": q.questions} for q in asked
    ]
    return doc
