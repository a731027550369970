"""Fixtures of the model adapter tests: the fake provider and a port nobody listens on."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fakeprovider import FakeProvider


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


@pytest.fixture
def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
