"""The SQLAlchemy store: public methods own their transactions; queries live in modules."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pydantic import SecretStr
from sqlalchemy import Connection, Engine

from .. import encryption
from ..encryption.keyring import forgotten_shown, reading
from ..errors import UnknownRunError
from ..messages import Message
from . import journal, questions, runs, threads, toolcalls, usage
from .db import READ_ONLY, ensure_schema, is_sqlite, make_engine, upgrade
from .listing import Reader, RunFilter, RunPage, Trees, list_runs, trees
from .view import RunView


class Store:
    """The journal and the conversation store on one database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        encryption.ensure_configured()  # the payload codec, with the settings' keys
        encryption.keyring().remember(engine)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        auto_upgrade: bool | None = None,
        pool_size: int = 5,
        password: SecretStr | str | None = None,
    ) -> Store:
        """Open the database at `url`. The embedded SQLite default migrates itself.
        `password`: the server's, apart from the URL (by default
        `AGENT_JOBS_DATABASE_PASSWORD`; see `make_engine`)."""
        engine = make_engine(url, pool_size=pool_size, password=password)
        try:
            ensure_schema(
                engine, auto_upgrade=is_sqlite(engine) if auto_upgrade is None else auto_upgrade
            )
        except BaseException:
            engine.dispose()  # a refused store keeps no connection open
            raise
        return cls(engine)

    def upgrade(self) -> None:
        upgrade(self.engine)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        with self.engine.begin() as conn, reading(self.engine):
            yield conn

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reads (what it writes is rolled back when it closes)."""
        with (
            self.engine.connect().execution_options(**{READ_ONLY: True}) as conn,
            reading(self.engine),
        ):
            yield conn

    # --- reads -------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunView:
        with self.connect() as conn:
            row = runs.get_run(conn, run_id)
        if row is None:
            raise UnknownRunError(run_id)
        return RunView.from_row(row)

    def find_run(self, run_id: str) -> RunView | None:
        with self.connect() as conn:
            row = runs.get_run(conn, run_id)
        return RunView.from_row(row) if row is not None else None

    def list_runs(
        self, *, limit: int = 50, status: str | None = None, thread_id: str | None = None
    ) -> list[RunView]:
        with self.connect() as conn, forgotten_shown():
            rows = runs.list_runs(conn, limit=limit, status=status, thread_id=thread_id)
        return [RunView.from_row(row) for row in rows]

    def runs_page(
        self,
        where: RunFilter,
        *,
        reader: Reader | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """A page of the runs list, newest first (store/listing.py)."""
        with self.connect() as conn, forgotten_shown():
            return list_runs(conn, where, reader=reader, limit=limit, cursor=cursor)

    def trees(self, root_run_ids: Collection[str]) -> Trees:
        """Who started each of these run trees and the action calls in it, in two
        queries: who may read a page of the list (store/listing.py)."""
        with self.connect() as conn:
            return trees(conn, root_run_ids)

    def thread_messages(self, thread_id: str) -> list[Message]:
        with self.connect() as conn:
            return threads.thread_messages(conn, thread_id)

    def has_other_actor(self, thread_id: str, actor: str) -> bool:
        """Whether a run of another actor than `actor` is on the thread."""
        with self.connect() as conn:
            return threads.has_other_actor(conn, thread_id, actor)

    def thread_title(self, thread_id: str) -> str | None:
        with self.connect() as conn:
            return threads.thread_title(conn, thread_id)

    def tool_calls(self, run_id: str) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return [dict(row._mapping) for row in toolcalls.run_calls(conn, run_id)]

    def run_tree(self, run_id: str) -> list[str]:
        """The run and the runs it delegated to, at any depth."""
        with self.connect() as conn:
            return runs.run_tree_ids(conn, run_id)

    def stale_run_ids(self, *, cutoff: datetime, now: datetime | None = None) -> list[str]:
        """The runs the sweep re-drives (`runs.stale_run_ids` says why each is picked)."""
        with self.connect() as conn:
            return runs.stale_run_ids(conn, cutoff=cutoff, now=now)

    def tool_call(self, run_id: str, call_id: str) -> dict[str, Any] | None:
        with self.connect() as conn:
            row = toolcalls.get_call(conn, run_id, call_id)
        return dict(row._mapping) if row is not None else None

    def question(self, run_id: str, request_id: str) -> dict[str, Any] | None:
        with self.connect() as conn:
            row = questions.get(conn, run_id, request_id)
        return dict(row._mapping) if row is not None else None

    def said_with(self, calls: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """What the model wrote in the reply that made each (run id, call id)."""
        with self.connect() as conn:
            return toolcalls.said_with(conn, calls)

    def pending_calls(self, run_id: str | None = None) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return [dict(row._mapping) for row in toolcalls.pending_calls(conn, run_id=run_id)]

    def open_questions(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Questions tools asked that no one has answered yet, oldest first."""
        with self.connect() as conn:
            return [dict(r._mapping) for r in questions.open_questions(conn, run_id=run_id)]

    def journal(self, run_id: str) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return [row.as_dict() for row in journal.load(conn, run_id)]

    def usage(self, run_id: str) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return usage.run_usage_rows(conn, run_id)

    def totals(self, run_id: str) -> dict[str, Any]:
        with self.connect() as conn:
            return runs.run_totals(conn, run_id)

    def tokens_used(self, actor: str, day: str) -> int:
        with self.connect() as conn:
            return usage.tokens_used(conn, actor=actor, day=day)


__all__ = ["RunView", "Store"]
