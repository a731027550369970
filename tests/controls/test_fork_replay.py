"""A fork reads its source's steps back checked by name and position, on both runners: a
fork driven by code that takes another path through the recorded steps fails with
`NonDeterminismError`, having run nothing on the wrong data. In this process (the inline
runner and `durable-local`), where the test can change the code that drives the fork."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs import loop
from agent_jobs.messages import Message, ToolCall
from tests.support.apps import counted
from tests.support.harness import Harness

# Where the fork starts: after the source's reads (the first turn) and its refund.
AT = "model:3"
PATCH_ROW = f"patch:{loop.PARALLEL_TOOLS}"


def one_by_one(tools: Any, calls: list[ToolCall]) -> list[Message]:
    """A turn's calls as code that predates the concurrent shape ran them: each to its
    outcome in turn, no patch question asked (`loop._Tools.run` before the patch)."""
    return [tools.finish(call, tools.record(call)) for call in calls]


@pytest.mark.parametrize("harness", ["inline", "durable-local"], indirect=True)
def test_a_fork_whose_code_took_another_shape_fails_with_non_determinism(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = harness.run_approving("support", "refund order 42")
    assert source.status == "completed"

    monkeypatch.setattr(loop._Tools, "run", one_by_one)
    forked = harness.fork(source.run_id, AT, actor="user-7")
    run = harness.wait(forked.run_id)

    assert (run.status, run.error_type) == ("failed", "NonDeterminismError")
    assert run.error is not None
    # The source's two reads ran together: it took the concurrent shape, and says so.
    recorded = {row["step"]: row["seq"] for row in harness.store.journal(source.run_id)}
    assert recorded[PATCH_ROW] < recorded["persist:toolcall:call_1"]
    assert (
        f"the loop asked for step 'persist:toolcall:call_1' at position {recorded[PATCH_ROW]}, "
        f"where the journal recorded {PATCH_ROW!r}"
    ) in run.error
    # Caught at the first step out of place: nothing ran again, nothing was journaled.
    assert [counted(forked.run_id, what) for what in ("model", "lookup", "refund")] == [0, 0, 0]
    copied = [step for step, seq in recorded.items() if seq < recorded[AT]]
    assert [row["step"] for row in harness.store.journal(forked.run_id)] == copied
