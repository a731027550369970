"""The session runtime: provider errors, steering, deadlines, pre-step listeners."""

from __future__ import annotations

from typing import Any

from agent_jobs import AgentOptions
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.prestep import PreStepContext, PreStepDecision
from tests.support.apps.base import (
    TOOLS,
    CountingModel,
    app,
    executed,
    record,
    wait_for_gate_of,
)


class FlakyModel(CountingModel):
    """Fails a model step's first `fail_times` calls with a classified provider error."""

    def __init__(
        self,
        turns: list[dict[str, Any]],
        *,
        kind: str,
        fail_times: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(turns, name=f"flaky-{kind}")
        self.kind = kind
        self.fail_times = fail_times
        self.retry_after = retry_after

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        from agent_jobs.errors import ModelError

        key = f"model:{request.step + 1}"
        tried = sum(1 for what, k in executed(request.run_id) if what == "flaky" and k == key)
        if tried < self.fail_times:
            record(request.run_id, "flaky", key)
            raise ModelError(
                f"provider says {self.kind}",
                kind=self.kind,  # type: ignore[arg-type]
                retry_after=self.retry_after,
                status=429 if self.kind == "rate_limit" else 401,
            )
        return super().run_turn(request, sink)


app.agent(
    "ratelimited",
    model=FlakyModel(
        [{"text": "after the wait"}], kind="rate_limit", fail_times=1, retry_after=1.0
    ),
    tools=TOOLS,
)
app.agent(
    "unauthorized",
    model=FlakyModel([{"text": "never"}], kind="auth", fail_times=5),
    tools=TOOLS,
)

# A first step whose tool takes a second: time to steer, cancel or switch the model.
app.agent(
    "steer",
    model=CountingModel(
        [
            {
                "text": "Looking. ",
                "tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 1.0}}],
            },
            {"text": "steered answer"},
        ]
    ),
    tools=TOOLS,
    options=AgentOptions(model="m1", reasoning_effort="high"),
)


class HeldModel(CountingModel):
    """A model whose call waits until the test opens the run's gate (`open_gate`), then
    streams its answer: the step is in flight for as long as the test needs."""

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        record(request.run_id, "model", f"model:{request.step + 1}")
        wait_for_gate_of(request.run_id)
        return self.scripted.run_turn(request, sink)


app.agent(
    "heldtalk",
    model=HeldModel([{"text": "a held and thoughtful answer"}]),
    tools=TOOLS,
)

# A model step that takes two seconds to stream.
app.agent(
    "slowtalk",
    model=CountingModel([{"text": "a slow and thoughtful answer", "delay": 2.0}]),
    tools=TOOLS,
)

# A deadline of one second against a tool of three.
app.agent(
    "timeboxed",
    model=CountingModel(
        [{"tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 3.0}}]}, {"text": "late"}]
    ),
    tools=TOOLS,
    options=AgentOptions(default_timeout=1.0),
)

# A deadline of one second against a read that runs until the test opens its gate.
app.agent(
    "timeboxed_gated",
    model=CountingModel([{"tool_calls": [{"name": "until_opened", "args": {}}]}, {"text": "late"}]),
    tools=["until_opened"],
    options=AgentOptions(default_timeout=1.0),
)

# Pre-step listeners act on these agents.
for gated_agent in ("gatekeeper", "carrier", "series"):
    app.agent(
        gated_agent,
        model=CountingModel(
            [{"tool_calls": [{"name": "lookup", "args": {"order_id": "1"}}]}, {"text": "through"}]
        ),
        tools=TOOLS,
    )


@app.before_step
def gate(context: PreStepContext) -> PreStepDecision | None:
    if context.agent == "gatekeeper" and context.step == 2:
        return PreStepDecision(kind="reject", reason="step 2 is closed")
    if context.agent == "carrier" and context.step == 1:
        return PreStepDecision(kind="enter", messages=["(policy: be brief)"])
    if context.agent == "series" and context.step == 2:
        return PreStepDecision(
            kind="enter", messages=["start over from here"], starts_request_series=True
        )
    return None


# Step 2's model call streams for three seconds: a worker can be killed after the claim.
app.agent(
    "claimkill",
    model=CountingModel(
        [
            {"tool_calls": [{"name": "slow", "args": {"n": 1, "seconds": 1.0}}]},
            {"text": "answered after the crash", "delay": 3.0},
        ]
    ),
    tools=TOOLS,
)
