"""Live streams as Redis Streams: `agent_jobs:stream:<run_id>`, one `frame` field each."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import redis

from .stream import END_TYPES, Frame, frame_json, stream_key

log = logging.getLogger(__name__)


class RedisStreams:
    """Bounded (MAXLEN ~) streams that expire a while after the run ends.

    Writing is best effort: the journal in Postgres is the truth, and a run must not
    fail because its live view could not be written.
    """

    def __init__(self, client: redis.Redis, *, maxlen: int = 10_000, ttl: int = 3600) -> None:
        self.client = client
        self.maxlen = maxlen
        self.ttl = ttl

    @classmethod
    def from_url(cls, url: str, *, maxlen: int = 10_000, ttl: int = 3600) -> RedisStreams:
        return cls(redis.Redis.from_url(url), maxlen=maxlen, ttl=ttl)

    def append(self, stream_id: str, frame: Frame) -> str:
        try:
            entry = self.client.xadd(
                stream_key(stream_id),
                {"frame": frame_json(frame)},
                maxlen=self.maxlen,
                approximate=True,
            )
        except redis.RedisError as exc:
            log.warning(
                "could not write a %s frame of run %s: %s", frame.get("type"), stream_id, exc
            )
            return ""
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    def append_many(self, stream_id: str, frames: list[Frame]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for frame in frames:
            pipe.xadd(
                stream_key(stream_id),
                {"frame": frame_json(frame)},
                maxlen=self.maxlen,
                approximate=True,
            )
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not write %d frames of run %s: %s", len(frames), stream_id, exc)

    def end(self, stream_id: str) -> None:
        try:
            self.client.expire(stream_key(stream_id), self.ttl)
        except redis.RedisError as exc:
            log.warning("could not set the expiry of run %s's stream: %s", stream_id, exc)

    def read(
        self, stream_id: str, after: str | None = None, *, block: float | None = None
    ) -> Iterator[tuple[str, Frame]]:
        """Follow the stream from after entry `after` (the start by default) to its end.

        Ends after a `done` or `error` frame of the run itself, or when `block` seconds
        pass with nothing new (None waits for ever).
        """
        key = stream_key(stream_id)
        last = after or "0-0"
        wait_ms = 0 if block is None else max(1, int(block * 1000))
        while True:
            batch: Any = self.client.xread({key: last}, count=500, block=wait_ms or 5000)
            if not batch:
                if block is not None:
                    return
                continue
            for entry_id, fields in batch[0][1]:
                last = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                raw = fields.get(b"frame") or fields.get("frame")
                try:
                    frame: Frame = json.loads(raw)
                except (TypeError, ValueError):
                    log.warning("skipping a malformed entry %s in %s", last, key)
                    continue
                yield last, frame
                if frame.get("type") in END_TYPES and frame.get("run_id") == stream_id:
                    return
