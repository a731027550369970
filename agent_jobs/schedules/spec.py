"""A schedule's definition (`app.schedule`), checked when it is made."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from croniter import CroniterBadDateError

from ..errors import ScheduleError
from .cron import Cron, run_time

CatchUp = Literal["latest", "all", "none"]
CATCH_UPS: tuple[str, ...] = get_args(CatchUp)

# Letters, digits, `_`, `.`, `-`; no `:` (the run id's separator). 33 characters at most:
# `sched:<name>:now:<time>` then fits the 64 characters of a run id.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,32}$")
PREFIX = "sched"


@dataclass(frozen=True)
class Schedule:
    """Start a run of `agent` with `input` as `actor` at each occurrence of `cron` in
    `timezone`; `catch_up` says which occurrences missed while nothing ran still start."""

    name: str
    agent: str
    cron: Cron
    input: str
    actor: str = "scheduler"
    metadata: dict[str, Any] = field(default_factory=dict)
    catch_up: CatchUp = "latest"

    @classmethod
    def define(
        cls,
        name: str,
        *,
        agent: str,
        cron: str,
        timezone: str,
        input: str,
        actor: str,
        metadata: dict[str, Any] | None,
        catch_up: str,
    ) -> Schedule:
        """A checked schedule; `ScheduleError` naming what is wrong otherwise."""
        if not isinstance(name, str) or not NAME.match(name):
            raise ScheduleError(
                f"invalid schedule name {name!r}: 1 to 33 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        if catch_up not in CATCH_UPS:
            raise ScheduleError(
                f"schedule {name!r}: catch_up must be one of {', '.join(CATCH_UPS)}, "
                f"not {catch_up!r}"
            )
        if not isinstance(input, str) or not input.strip():
            raise ScheduleError(f"schedule {name!r}: input must be a non-empty text")
        if not isinstance(actor, str) or not actor.strip():
            raise ScheduleError(f"schedule {name!r}: actor must be a non-empty text")
        if metadata is not None and not isinstance(metadata, dict):
            raise ScheduleError(f"schedule {name!r}: metadata must be a dict")
        try:
            json.dumps(metadata or {})
        except (TypeError, ValueError):
            raise ScheduleError(f"schedule {name!r}: metadata must be JSON") from None
        when = Cron(cron, timezone)
        try:
            when.next_after(datetime.now(UTC))
        except CroniterBadDateError:
            raise ScheduleError(
                f"schedule {name!r}: the cron expression {cron!r} never matches a date"
            ) from None
        return cls(
            name=name,
            agent=agent,
            cron=when,
            input=input,
            actor=actor,
            metadata=dict(metadata or {}),
            catch_up=catch_up,  # type: ignore[arg-type]  # checked above
        )

    def run_id(self, occurrence: datetime) -> str:
        """The run of one occurrence: `sched:<name>:<UTC time>`."""
        return f"{PREFIX}:{self.name}:{run_time(occurrence)}"

    def run_now_id(self, moment: datetime) -> str:
        """A run asked for by hand: `sched:<name>:now:<UTC time>`."""
        return f"{PREFIX}:{self.name}:now:{run_time(moment)}"

    def run_metadata(self, occurrence: datetime | None) -> dict[str, Any]:
        """The metadata of its runs: the schedule's own, `schedule` and `occurrence`."""
        found = {**self.metadata, "schedule": self.name}
        if occurrence is not None:
            found["occurrence"] = run_time(occurrence)
        return found
