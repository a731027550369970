"""A run's live frames: the stream interface, its two backends, and reading text off it.

- `base`: `Frame`, `RunStream` (what a run writes), `StreamBackend`, `MemoryStreams`.
- `redis_streams`: `RedisStreams`, one Redis Stream per top-level run.
- `text`: `TextAssembler` and `assemble_text`, the text without void attempts.
"""

from .base import END_TYPES, Frame, MemoryStreams, RunStream, StreamBackend, stream_key
from .redis_streams import RedisStreams
from .text import TextAssembler, assemble_text, is_attempt_marker

__all__ = [
    "END_TYPES",
    "Frame",
    "MemoryStreams",
    "RedisStreams",
    "RunStream",
    "StreamBackend",
    "TextAssembler",
    "assemble_text",
    "is_attempt_marker",
    "stream_key",
]
