"""The approvals stream as a work queue: a Redis Stream read through a consumer group.

Plumbing only: what a decision means is the listener's business. An entry is a message
in its `message` field; an acknowledged entry is deleted, so the stream holds only what
is still to be settled; an entry delivered too often goes to `<stream>:dead`.

Entries are fetched by Lua scripts that measure each one in Redis first: an entry over
`max_bytes` (all its fields, names included) is moved to `<stream>:dead` there and then,
and only its size comes back. Anyone who can XADD could otherwise make the listener
download and hold tens of MB per entry, a batch of entries at a time. A script cannot
block, so the listener polls `read` instead of waiting in XREADGROUP BLOCK.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

DEAD_LETTER_MAXLEN = 10_000
Fields = dict[bytes, bytes]

# KEYS: the stream, its dead letter. ARGV: group, consumer, max bytes, dead-letter maxlen,
# then the caller's own. Each entry comes back as {id, deliveries, size, moved, fields}.
_CHECKED = """
local function checked(id, fields, deliveries)
  local size = 0
  for i = 1, #fields do
    size = size + #fields[i]
  end
  if size <= tonumber(ARGV[3]) then
    return {id, deliveries, size, 0, fields}
  end
  local message = ''
  for i = 1, #fields, 2 do
    if fields[i] == 'message' then
      message = fields[i + 1]
    end
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'message', message,
    'entry_id', id, 'deliveries', deliveries, 'reason', 'too_large', 'size', size)
  redis.call('XACK', KEYS[1], ARGV[1], id)
  redis.call('XDEL', KEYS[1], id)
  return {id, deliveries, size, 1, {}}
end
"""

# ARGV[5]: how many. One entry per XREADGROUP: a call hands the script its whole reply at
# once, so a batch of huge entries would all be copied into Redis's Lua memory together.
# It stops after an oversized entry, since copying one into the script holds all of
# Redis up (about a quarter of a second for 50 MB): the next call goes on.
_READ = (
    _CHECKED
    + """
local out = {}
for _ = 1, tonumber(ARGV[5]) do
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1,
    'STREAMS', KEYS[1], '>')
  if not reply then
    break
  end
  local entry = reply[1][2][1]
  local item = checked(entry[1], entry[2], 1)
  out[#out + 1] = item
  if item[4] == 1 then
    break
  end
end
return out
"""
)

# ARGV[5]: how many, ARGV[6]: min idle ms, ARGV[7]: cursor. Returns {cursor, entries}.
# One id per XAUTOCLAIM, each claimed just before it is fetched, so that stopping after
# an oversized entry (as `_READ` does) leaves the rest idle for the next call. JUSTID
# fetches nothing, but neither does it count a delivery: the XCLAIM that then fetches
# the entry (inside Redis) counts it, which the poison check needs.
_RECLAIM = (
    _CHECKED
    + """
local cursor = ARGV[7]
local out = {}
for _ = 1, tonumber(ARGV[5]) do
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[6], cursor,
    'COUNT', 1, 'JUSTID')
  cursor = claimed[1]
  local id = claimed[2][1]
  if id then
    local entry = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)[1]
    if entry and entry[2] then
      local info = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)[1]
      local item = checked(id, entry[2], info and info[4] or 1)
      out[#out + 1] = item
      if item[4] == 1 then
        break
      end
    else
      -- Deleted while pending (Redis 7 leaves these out; older ones may not).
      redis.call('XACK', KEYS[1], ARGV[1], id)
    end
  end
  if cursor == '0-0' then
    break
  end
end
return {cursor, out}
"""
)


@dataclass(frozen=True)
class Entry:
    """One stream entry. `oversized`: Redis already moved it to the dead letter for
    being over the limit, and `fields` is empty; `size` is its bytes either way."""

    id: str
    fields: Fields
    deliveries: int = 1
    size: int = 0
    oversized: bool = False

    @property
    def message(self) -> bytes | None:
        return self.fields.get(b"message")


class ApprovalsStream:
    """One consumer of the group `group` on the stream `name`."""

    def __init__(
        self, client: redis.Redis, name: str, *, group: str, consumer: str, max_bytes: int
    ) -> None:
        self.client = client
        self.name = name
        self.group = group
        self.consumer = consumer
        self.max_bytes = max_bytes
        self.dead_letter = f"{name}:dead"
        self._read = client.register_script(_READ)
        self._reclaim = client.register_script(_RECLAIM)

    def ensure_group(self) -> None:
        # From the start of the stream: entries added before the first listener ever
        # ran are still decisions someone is waiting on.
        try:
            self.client.xgroup_create(self.name, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _args(self, *more: int | str) -> list[int | str]:
        return [self.group, self.consumer, self.max_bytes, DEAD_LETTER_MAXLEN, *more]

    def read(self, count: int = 16) -> list[Entry]:
        """Up to `count` new entries for this consumer, at once (an empty list if none)."""
        reply: Any = self._read(keys=[self.name, self.dead_letter], args=self._args(count))
        return [_entry(item) for item in reply]

    def reclaim(self, idle_seconds: float, count: int = 50) -> Iterator[Entry]:
        """Take over entries left unsettled in any consumer's pending list for
        `idle_seconds` (a dead listener's, or ones that failed here), with how many
        times each has now been delivered; a page at a time, as they are consumed."""
        idle_ms = int(idle_seconds * 1000)
        cursor = "0-0"
        keys = [self.name, self.dead_letter]
        while True:
            reply: Any = self._reclaim(keys=keys, args=self._args(count, idle_ms, cursor))
            cursor = _text(reply[0])
            yield from (_entry(item) for item in reply[1])
            if cursor == "0-0":
                return

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


def _entry(item: Any) -> Entry:
    entry_id, deliveries, size, moved, flat = item
    fields: Fields = dict(zip(flat[::2], flat[1::2], strict=True))
    return Entry(_text(entry_id), fields, int(deliveries), int(size), bool(moved))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
