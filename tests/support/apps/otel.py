"""The tests' app (tests.apps) in a process that set OpenTelemetry up itself, as an
application may: with `TEST_SPANS_DIR` set, every span the process finishes is written at
once to `$TEST_SPANS_DIR/<pid>.jsonl`, one JSON object a line, for a test to read.

Load it with `AGENT_JOBS_APP=tests.support.apps.otel:app`; agent-jobs then uses this provider as it
is (it sets up its own only where nobody did).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.support.apps import CountingModel, app

__all__ = ["app", "read_spans"]


class FileExporter(SpanExporter):
    """Appends each finished span to this process's file, as it ends."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        path = self.directory / f"{os.getpid()}.jsonl"
        with path.open("a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(_record(span)) + "\n")
        return SpanExportResult.SUCCESS


def _record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "start": span.start_time,
        "end": span.end_time,
        "error": span.status.status_code.name == "ERROR",
        "pid": os.getpid(),
    }


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span the processes wrote to `directory`."""
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line
    ]


if os.environ.get("TEST_SPANS_DIR"):
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["TEST_SPANS_DIR"])))
    trace.set_tracer_provider(_provider)


# Two reads at once, the second slow (time to kill its worker), then an action that waits
# for a person, then the answer.
app.agent(
    "traced",
    model=CountingModel(
        [
            {
                "tool_calls": [
                    {"name": "lookup", "args": {"order_id": "42"}},
                    {"name": "slow", "args": {"n": 1, "seconds": 2.0}},
                ]
            },
            {"tool_calls": [{"name": "refund", "args": {"order_id": "42", "amount": 5}}]},
            {"text": "refunded"},
        ]
    ),
    tools=["lookup", "slow", "refund"],
)
