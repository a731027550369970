"""Large payloads: a tool that returns as many characters as asked, and a model that asks
for them turn after turn and records what it read back (its length and digest)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from agent_jobs.messages import ModelRequest, ModelResponse, ToolCall
from agent_jobs.models.base import DeltaSink
from agent_jobs.tools import ToolContext
from tests.support.apps.base import app, record

STATUS = Path("/proc/self/status")


def memory(field: str, status: Path = STATUS) -> int:
    """A process's `VmRSS` or `VmHWM` (its peak), in bytes."""
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def filled(n: int, seed: str) -> str:
    """The tool's result: `seed` repeated to `n` characters (down to a multiple of its
    length): made in one allocation, so a result of `n` bytes costs `n` bytes."""
    return seed * (n // len(seed))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def noise(n: int, seed: str) -> str:
    """`n` hex digits that hardly compress, the same for the same `seed`."""
    return random.Random(seed).randbytes(n // 2).hex()


@app.tool(kind="read")
def sized(n: int, seed: str, ctx: ToolContext, noisy: bool = False) -> str:
    """Return `n` characters (`noisy`: hex digits of the seed and the call's id). Before
    it makes them, it resets its process's peak memory and records its process and memory
    now: a test reads the peak once the run ended."""
    if noisy:
        return noise(n, f"{seed}:{ctx.call_id}")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
    record(ctx.run_id, "memory", f"{os.getpid()}:{memory('VmRSS')}")
    return filled(n, seed)


class SizingModel:
    """Calls `sized` as often as the run's input says (a JSON object: `size`, `turns`,
    `seed`, `noisy`), recording after each call the length, digest and error flag of
    what it read."""

    name = "sizing"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        asked: dict[str, Any] = json.loads(request.messages[0].content)
        results = [m for m in request.messages if m.role == "tool"]
        if results:
            last = results[-1]
            seen = last.content[:150] if last.is_error else digest(last.content)[:16]
            record(request.run_id, "seen", f"{len(last.content)}:{last.is_error}:{seen}")
        if len(results) < asked["turns"]:
            call = ToolCall(
                id=f"call_{len(results) + 1}",
                name="sized",
                args={"n": asked["size"], "seed": asked["seed"], "noisy": asked["noisy"]},
            )
            return ModelResponse(tool_calls=[call])
        return ModelResponse(text=f"read {len(results)} results")


app.agent("sizing", model=SizingModel(), tools=["sized"], max_steps=200)


class WordyModel:
    """Answers with as many characters as the run's input says."""

    name = "wordy"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        return ModelResponse(text="w" * int(request.messages[0].content))


app.agent("wordy", model=WordyModel())
