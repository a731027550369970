"""A cron expression in a time zone: its occurrences as UTC instants.

`croniter` walks the expression over wall-clock (naive, local) times; `zoneinfo` turns
each wall time into one instant. The turning is what the daylight-saving changes need:

- a wall time the clocks skip (spring: 02:30 in Europe/Paris on 2026-03-29) is taken at
  the moment the clocks jump (03:00 CEST, 01:00 UTC): the occurrence is late, not lost;
- a wall time the clocks show twice (autumn: 02:30 on 2026-10-25) is taken the first
  time only (02:30 CEST, 00:30 UTC).

So each wall time the expression matches is one instant, and the instants never go
backwards as the wall times go forwards: several wall times of a skipped hour fall on the
same instant, which is one occurrence (one run id). Five fields are croniter's minute,
hour, day, month, weekday; a sixth is the second (`* * * * * */5`: every five seconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ..errors import ScheduleError

SECOND = timedelta(seconds=1)


def parse_zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; `ScheduleError` if there is none by that name."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(
            f"unknown time zone {name!r}: give an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from None


def check_expression(expression: str) -> str:
    """`expression` if croniter reads it as five or six fields (or an `@daily`-style
    nickname); `ScheduleError` otherwise."""
    text = " ".join(expression.split()) if isinstance(expression, str) else ""
    fields = len(text.split(" "))
    nickname = text.startswith("@")
    if not text or not (nickname or fields in (5, 6)) or not croniter.is_valid(text):
        raise ScheduleError(
            f"invalid cron expression {expression!r}: give five fields (minute hour day "
            "month weekday, e.g. '0 9 * * 1-5') or six (the sixth: seconds)"
        )
    return text


@dataclass(frozen=True)
class Cron:
    """A checked cron expression in a time zone."""

    expression: str
    timezone: str
    zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expression", check_expression(self.expression))
        object.__setattr__(self, "zone", parse_zone(self.timezone))

    # --- wall time and instants --------------------------------------------------------

    def wall(self, instant: datetime) -> datetime:
        """The naive local wall time at `instant`."""
        return instant.astimezone(self.zone).replace(tzinfo=None)

    def instant(self, wall: datetime) -> datetime:
        """The UTC instant of a wall time: its first if shown twice, the jump if skipped."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if self.wall(first) == wall:
            return first
        return self._jump(wall)

    def _jump(self, wall: datetime) -> datetime:
        """The instant the clocks jumped over `wall` (a skipped wall time): the first
        second whose wall time is past it."""
        low = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)  # before the jump
        high = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)  # after it
        if low > high:
            low, high = high, low
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) / 2
            middle = middle.replace(microsecond=0)
            if middle <= low:
                break
            if self.wall(middle) > wall:
                high = middle
            else:
                low = middle
        return high

    # --- occurrences ---------------------------------------------------------------------

    def after(self, start: datetime) -> Iterator[datetime]:
        """The occurrences after `start` (UTC), in order, each once, for ever."""
        # No wall time up to `start`'s own names an instant after it (the turning keeps
        # the order), so the walk starts there.
        walls = croniter(self.expression, self.wall(start).replace(microsecond=0))
        last = start
        while True:
            found = self.instant(walls.get_next(datetime))
            if found > last:
                last = found
                yield found

    def between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """At most `limit` occurrences in (`start`, `end`], oldest first."""
        found: list[datetime] = []
        for moment in self.after(start):
            if moment > end or len(found) >= limit:
                break
            found.append(moment)
        return found

    def latest(self, start: datetime, end: datetime) -> datetime | None:
        """The newest occurrence in (`start`, `end`], if any."""
        wall = self.wall(end).replace(microsecond=0)
        # Past `end`'s wall time, only in the second pass of a repeated hour: wall times
        # still to come that name instants of its first pass, all before `end`.
        found: datetime | None = None
        for moment in self.after(self.instant(wall) - SECOND):
            if moment > end:
                break
            found = moment
        if found is None:
            walls = croniter(self.expression, wall + SECOND)
            found = self.instant(walls.get_prev(datetime))
        return found if found > start and found <= end else None

    def next_after(self, start: datetime) -> datetime:
        """The first occurrence after `start`."""
        return next(self.after(start))


def run_time(moment: datetime) -> str:
    """An instant as a run id writes it: UTC, to the second, `YYYY-MM-DDTHH:MM:SSZ`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
