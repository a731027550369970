"""Live streams as Redis Streams: `agent_jobs:stream:<run_id>`, one `frame` field each."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import redis

from .base import END_TYPES, Frame, frame_json, stream_key

log = logging.getLogger(__name__)


class RedisStreams:
    """Bounded (MAXLEN ~) streams that expire a while after the run ends.

    Writing is best effort: the journal in Postgres is the truth, and a run must not
    fail because its live view could not be written. After a failed write, frames are
    dropped for `pause` seconds instead of each waiting on a Redis that is down.
    """

    def __init__(
        self, client: redis.Redis, *, maxlen: int = 10_000, ttl: int = 3600, pause: float = 1.0
    ) -> None:
        self.client = client
        self.maxlen = maxlen
        self.ttl = ttl
        self.pause = pause
        self._down_until = 0.0

    def _writable(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, what: str, stream_id: str, exc: Exception) -> None:
        log.warning("could not write %s of run %s: %s", what, stream_id, exc)
        self._down_until = time.monotonic() + self.pause

    @classmethod
    def from_url(cls, url: str, *, maxlen: int = 10_000, ttl: int = 3600) -> RedisStreams:
        return cls(redis.Redis.from_url(url), maxlen=maxlen, ttl=ttl)

    def append(self, stream_id: str, frame: Frame) -> str:
        if not self._writable():
            return ""
        try:
            entry = self.client.xadd(
                stream_key(stream_id),
                {"frame": frame_json(frame)},
                maxlen=self.maxlen,
                approximate=True,
            )
        except redis.RedisError as exc:
            self._failed(f"a {frame.get('type')} frame", stream_id, exc)
            return ""
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    def ping(self) -> None:
        self.client.ping()

    def append_many(self, stream_id: str, frames: list[Frame]) -> None:
        if not self._writable():
            return
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
            self._failed(f"{len(frames)} frames", stream_id, exc)

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
