"""The loop shapes of the runs in flight (`agent-jobs runs --unfinished --by-shape`).

A change to a turn's shape is gated by a patch (`hooks.patched`): a run that recorded
history under the old shape replays it on the old branch, a run that reaches the
question later takes the new one. The old branch can be deleted once no unfinished run
needs it. A run's journal holds a `patch:<id>` row where it took a patch, and nothing
where it refused one: a run that refused a patch and one that has not come to it yet
look alike. So each unfinished durable run is replayed here, offline, against its
journal, with a connection that stops the replay where the journal ends: every patch
question met before that point was answered by recorded history, taken or refused;
one met at the journal's end (or never met) is not reached yet, and the run will take
the patch when it gets there (unless this deployment disables it).

The replay is `DurableHooks`, as a worker's pass runs it: a recorded step never touches
the connection (`tests/unit/test_replay.py` holds it to that), so whatever reaches the
connection is past the journal's end. Nothing is written: this is read-only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection

from ..app import AgentApp
from ..errors import AgentJobsError, NonDeterminismError, Suspend
from ..executor import StepEnv
from ..hooks import Patch
from ..loop import APPROVALS_AT_ONCE, HISTORY_SELECT, PARALLEL_TOOLS, run_agent_loop
from ..runners import DurableHooks
from ..runners.turn import turn_for
from ..settings import Settings
from ..store import RunView
from ..streams.base import MemoryStreams, RunStream

# The patches this code asks about, in the order a turn meets them.
KNOWN_PATCHES: tuple[str, ...] = (HISTORY_SELECT, PARALLEL_TOOLS, APPROVALS_AT_ONCE)
PATCH_STEP = "patch:"


class _JournalEnds(BaseException):
    """The replay needs what the journal does not hold yet. A BaseException: nothing in
    the loop settles or reports it."""


class _PastTheJournal:
    """Stands in for a pass's connection: only a step past the journal's end uses one."""

    def __getattr__(self, name: str) -> Any:
        raise _JournalEnds


class _Asking(DurableHooks):
    """`DurableHooks` that note how recorded history answers each patch question."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.took: set[str] = set()
        self.refused: set[str] = set()

    def patched(self, patch: Patch) -> bool:
        before = len(self.new_rows)
        taken = super().patched(patch)
        if len(self.new_rows) > before:  # asked where nothing is recorded yet
            raise _JournalEnds
        (self.took if taken else self.refused).add(patch.id)
        return taken


@dataclass(frozen=True)
class Shape:
    """The patches a run took, and those whose old branch its history holds."""

    took: frozenset[str]
    refused: frozenset[str] = frozenset()


@dataclass
class Shapes:
    """Unfinished runs counted by shape, and what each patch's old branch still serves."""

    counts: Counter[Shape] = field(default_factory=Counter)
    # Runs the replay could not follow (the run id, why): a journal this code cannot
    # replay at all, an agent the app no longer defines.
    unreplayable: list[tuple[str, str]] = field(default_factory=list)
    inline: int = 0  # inline runs: they end with their process and are never replayed
    disabled: frozenset[str] = frozenset()

    @property
    def patches(self) -> list[str]:
        """The known patches, then any other a run took or refused."""
        seen = {p for shape in self.counts for p in shape.took | shape.refused}
        return [*KNOWN_PATCHES, *sorted(seen - set(KNOWN_PATCHES))]

    def took(self, patch: str) -> int:
        return sum(n for shape, n in self.counts.items() if patch in shape.took)

    def refused(self, patch: str) -> int:
        return sum(n for shape, n in self.counts.items() if patch in shape.refused)

    def as_dict(self) -> dict[str, Any]:
        ordered = sorted(self.counts.items(), key=lambda item: (-item[1], _label(item[0])))
        return {
            "unfinished": sum(self.counts.values()) + len(self.unreplayable) + self.inline,
            "shapes": [
                {"took": _ordered(s.took), "refused": _ordered(s.refused), "runs": n}
                for s, n in ordered
            ],
            "patches": {
                p: {
                    "took": self.took(p),
                    "refused": self.refused(p),
                    "old_branch_needed": self.refused(p) > 0 or p in self.disabled,
                    "disabled": p in self.disabled,
                }
                for p in self.patches
            },
            "unreplayable": [{"run_id": r, "error": e} for r, e in self.unreplayable],
            "inline": self.inline,
        }


def _ordered(patches: Iterable[str]) -> list[str]:
    known = [p for p in KNOWN_PATCHES if p in patches]
    return [*known, *sorted(set(patches) - set(known))]


def _label(shape: Shape) -> str:
    return ", ".join(_ordered(shape.took)) or "(none)"


def shape_of(app: AgentApp, settings: Settings, run: RunView, rows: Sequence[Any]) -> Shape:
    """Replay `run` against its journal `rows` (as `journal.load_for_replay` reads them)
    up to the journal's end; raises what a worker's replay would raise on it."""
    env = StepEnv(app=app, stream=RunStream(MemoryStreams(), run.root_run_id, run.run_id))
    connection = cast(Connection, _PastTheJournal())
    # No patch disabled: the answers are those of recorded history alone.
    hooks = _Asking(connection, run, list(rows), env, frozenset())
    turn, deps = turn_for(app, run, settings)
    try:
        run_agent_loop(turn, deps, hooks)
    except (_JournalEnds, Suspend):
        pass  # where the run stands: what comes next is not recorded yet
    except NonDeterminismError:
        raise
    except AgentJobsError:
        pass  # an ending the journal holds (a failed model step, max steps): still a shape
    return Shape(frozenset(hooks.took), frozenset(hooks.refused))


def count_shapes(
    app: AgentApp, settings: Settings, runs: Iterable[tuple[RunView, Sequence[Any]]]
) -> Shapes:
    """Count the unfinished runs by shape."""
    shapes = Shapes(disabled=settings.disabled_patch_ids)
    for run, rows in runs:
        if run.runner != "durable":
            shapes.inline += 1
            continue
        try:
            shape = shape_of(app, settings, run, rows)
        except NonDeterminismError as exc:
            shapes.unreplayable.append((run.run_id, f"its journal does not replay: {exc}"))
        except Exception as exc:  # e.g. its agent is not the app's any more
            shapes.unreplayable.append((run.run_id, f"{type(exc).__name__}: {exc}"))
        else:
            shapes.counts[shape] += 1
    return shapes


def describe(shapes: Shapes) -> list[str]:
    """The report's lines, for a terminal."""
    total = sum(shapes.counts.values()) + len(shapes.unreplayable) + shapes.inline
    if not total:
        return ["no unfinished runs"]
    lines = [f"unfinished runs: {total}"]
    for shape, n in sorted(shapes.counts.items(), key=lambda item: (-item[1], _label(item[0]))):
        old = f"  refused: {', '.join(_ordered(shape.refused))}" if shape.refused else ""
        lines.append(f"shape: {_label(shape)}{old}  runs: {n}")
    for run_id, error in shapes.unreplayable:
        lines.append(f"not replayable: {run_id}  {error}")
    if shapes.inline:
        lines.append(f"inline runs (never replayed; they end with their process): {shapes.inline}")
    lines.append("")
    for patch in shapes.patches:
        took, refused = shapes.took(patch), shapes.refused(patch)
        if patch in shapes.disabled:
            verdict = "disabled here (AGENT_JOBS_DISABLED_PATCHES): new runs take its old branch"
        elif refused:
            verdict = f"its old branch is still needed by {refused} run{'s' * (refused != 1)}"
        else:
            verdict = "no unfinished run needs its old branch"
        lines.append(f"{patch}: taken by {took}, refused by {refused}; {verdict}")
    return lines
