"""The approvals stream as a work queue: a Redis Stream read through a consumer group.

Plumbing only: what a decision means is the listener's business. An entry is a message
in its `message` field; an acknowledged entry is deleted, so the stream holds only what
is still to be settled; an entry delivered too often goes to `<stream>:dead`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

DEAD_LETTER_MAXLEN = 10_000
Fields = dict[bytes, bytes]


@dataclass(frozen=True)
class Entry:
    id: str
    fields: Fields
    deliveries: int = 1

    @property
    def message(self) -> bytes | None:
        return self.fields.get(b"message")


class ApprovalsStream:
    """One consumer of the group `group` on the stream `name`."""

    def __init__(self, client: redis.Redis, name: str, *, group: str, consumer: str) -> None:
        self.client = client
        self.name = name
        self.group = group
        self.consumer = consumer
        self.dead_letter = f"{name}:dead"

    def ensure_group(self) -> None:
        # From the start of the stream: entries added before the first listener ever
        # ran are still decisions someone is waiting on.
        try:
            self.client.xgroup_create(self.name, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, block_ms: int, count: int = 16) -> list[Entry]:
        """New entries for this consumer, waiting up to `block_ms` for one."""
        batch: Any = self.client.xreadgroup(
            self.group, self.consumer, {self.name: ">"}, count=count, block=block_ms
        )
        return [Entry(_text(eid), fields) for _, entries in batch or [] for eid, fields in entries]

    def reclaim(self, idle_seconds: float, count: int = 50) -> list[Entry]:
        """Take over entries left unsettled in any consumer's pending list for
        `idle_seconds` (a dead listener's, or ones that failed here), with how many
        times each has now been delivered."""
        idle_ms = int(idle_seconds * 1000)
        cursor: Any = "0-0"
        taken: list[Entry] = []
        while True:
            reply: Any = self.client.xautoclaim(
                self.name, self.group, self.consumer, idle_ms, start_id=cursor, count=count
            )
            cursor = reply[0]
            claimed = [(_text(eid), fields) for eid, fields in reply[1] if fields is not None]
            if claimed:
                pipe = self.client.pipeline(transaction=False)
                for entry_id, _ in claimed:
                    pipe.xpending_range(self.name, self.group, min=entry_id, max=entry_id, count=1)
                for (entry_id, fields), info in zip(claimed, pipe.execute(), strict=True):
                    deliveries = int(info[0]["times_delivered"]) if info else 1
                    taken.append(Entry(entry_id, fields, deliveries))
            if _text(cursor) == "0-0":
                return taken

    def ack(self, entry_id: str) -> None:
        """Settled: acknowledge and delete it."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(self.name, self.group, entry_id)
        pipe.xdel(self.name, entry_id)
        pipe.execute()

    def move_aside(self, entry: Entry, reason: str) -> None:
        """Move a poison entry to the dead-letter stream, with where and why it failed."""
        moved: dict[Any, Any] = {
            b"message": entry.message or b"",
            b"entry_id": entry.id.encode(),
            b"deliveries": str(entry.deliveries).encode(),
            b"reason": reason.encode(),
        }
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(self.dead_letter, moved, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
        pipe.xack(self.name, self.group, entry.id)
        pipe.xdel(self.name, entry.id)
        pipe.execute()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
