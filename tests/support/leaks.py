"""Where a database connection that was never closed was opened.

psycopg warns (a ResourceWarning) when a connection is garbage-collected while still open.
With warnings as errors, pytest reports it as an error of whatever test is running at that
moment, which is seldom the test that left the connection open: a thread that outlived its
test, an engine nobody disposed. In the test processes each connection notes where it was
opened, and one deleted while open prints that place on stderr, which the failing test's
report shows beside the warning.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import psycopg

_origins: dict[int, list[str]] = {}  # id of an open connection: where it was opened
DEPTH = 48  # frames looked at: enough to reach the test or fixture through SQLAlchemy
LIBRARIES = ("/sqlalchemy/", "/psycopg/", "/_pytest/", "/pluggy/", "/xdist/", __file__)


def install() -> None:
    """Note every psycopg connection's origin in this process (once)."""
    cls: Any = psycopg.Connection
    if getattr(cls, "_origins_noted", False):
        return
    connect = cls.__dict__["connect"].__func__
    delete = cls.__del__

    def noting_connect(klass: Any, *args: Any, **kwargs: Any) -> Any:
        conn = connect(klass, *args, **kwargs)
        frames = traceback.format_stack(limit=DEPTH)
        _origins[id(conn)] = [f for f in frames if not any(lib in f for lib in LIBRARIES)]
        return conn

    def noting_delete(self: Any) -> None:
        origin = _origins.pop(id(self), None)
        if origin is not None and hasattr(self, "pgconn") and not self.closed:
            sys.stderr.write(
                f"{object.__repr__(self)} was deleted while still open; it was opened at:\n"
                + "".join(origin)
            )
        delete(self)

    cls.connect = classmethod(noting_connect)
    psycopg.connect = cls.connect  # the module's name for it, which SQLAlchemy calls
    cls.__del__ = noting_delete
    cls._origins_noted = True
