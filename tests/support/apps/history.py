"""A bounded history: a sliding window, with and without a summary."""

from __future__ import annotations

from agent_jobs import SlidingWindowHistory, summarize_with_model
from agent_jobs.messages import ModelRequest, ModelResponse, Usage
from agent_jobs.models.base import DeltaSink
from tests.support.apps.base import CountingModel, app, record


class SummaryModel:
    """Summarises, and counts how often it was asked."""

    name = "summarizer"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        record(request.run_id, "summary", request.messages[0].content[:50])
        return ModelResponse(
            text="they talked about orders",
            usage=Usage(input_tokens=40, output_tokens=5),
            model=self.name,
        )


app.agent(
    "windowed",
    model=CountingModel([{"text": "windowed answer"}]),
    history=SlidingWindowHistory(max_messages=4),
)
app.agent(
    "summarized",
    model=CountingModel([{"text": "summarized answer", "delay": 0.0}]),
    history=SlidingWindowHistory(max_messages=2, summarize=summarize_with_model(SummaryModel())),
)
# The summary is made, then the model streams for three seconds: time to kill a worker.
app.agent(
    "summarykill",
    model=CountingModel([{"text": "after the summary", "delay": 3.0}]),
    history=SlidingWindowHistory(max_messages=2, summarize=summarize_with_model(SummaryModel())),
)
