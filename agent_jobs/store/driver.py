"""The durable runner's hot statements, on the driver itself, and writes sent ahead.

A coordinator pass runs a few dozen short statements. Through SQLAlchemy each costs
about twice the driver's own CPU (an execution context, a result object, type handling
per row): measured on the run-lock statement, ~190 µs against ~90 µs on psycopg. On
Postgres the statements here are compiled by SQLAlchemy once (the SQL and its bind
processors, kept per statement object) and then executed on the psycopg connection
under the SQLAlchemy connection, in the same transaction.

A write whose result the pass does not read (`later`) is not sent at once: it waits on
the connection and goes with the next statement in one psycopg pipeline (one round
trip for both), or with the COMMIT (the pass's last writes and its commit in one round
trip). Anything else that uses the connection meanwhile sends the waiting writes
first, so every statement sees them; a rollback discards them. A waiting write that
fails raises at the statement it went with, and the transaction fails as a whole; so a
write sent ahead must fail in the database itself when it is wrong (a constraint), not
by a count the caller checks.

The transaction's BEGIN waits the same way. psycopg sends its own BEGIN as a round trip
of its own (in a pipeline too: it syncs after it), so the engine's psycopg connections
are in autocommit mode and the BEGIN is queued when SQLAlchemy begins a transaction
(as the SQLite engine issues its own BEGIN): it goes with the transaction's first
statement. A transaction that ran nothing sends nothing. COMMIT and ROLLBACK are
psycopg's, which send them whenever the server is in a transaction. A connection for
reads (`READ_ONLY`, `Store.connect`) gets a read-only transaction: statements here run
in one of their own, `BEGIN READ ONLY` … `COMMIT` in the same round trip (so its close
costs none); SQLAlchemy's own statements open one that the close rolls back.

A pipeline's statements go out in one write. psycopg flushes the socket after each
statement executed in a pipeline (a `send` and a wait for the socket a statement: 101
sends for a W1 run's 22 round trips); here each is only put in libpq's buffer, and the
pipeline's sync sends them all and reads every result (45 sends). libpq, in the
non-blocking mode psycopg runs it in, reads what the server sends whenever its buffer
cannot be written, and the sync waits for the socket both ways, so a large batch does not
deadlock against large results. This leans on psycopg's pipeline internals
(`_communicate_gen`, `command_queue`): it is taken only where they are as in the versions
tested (`_ONE_WRITE`), and psycopg's own path runs otherwise.

Errors are SQLAlchemy's (`DBAPIError` wrapping psycopg's), so callers tell transient
failures apart as they do for every other statement; a connection lost on the way is
invalidated. Other dialects (SQLite) run the same statements through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from sqlalchemy import ColumnElement, Connection, Engine, event, literal_column
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable
from sqlalchemy.types import TypeDecorator

_IDLE = psycopg.pq.TransactionStatus.IDLE  # the server is in no transaction
# Where a connection keeps its waiting statements (SQLAlchemy's per-connection `info`).
_WAITING = "agent_jobs.waiting_writes"
_BEGIN: tuple[str, None] = ("BEGIN", None)
_BEGIN_READ_ONLY: tuple[str, None] = ("BEGIN READ ONLY", None)
_COMMIT: tuple[str, None] = ("COMMIT", None)
READ_ONLY = "agent_jobs_read_only"  # an execution option: the connection only reads
# The connection whose statement's payloads are being bound or read, for a codec that
# reads or writes beside them in the same transaction (agent_jobs/store/blobs.py): set by
# the statements here, and by an engine listener for SQLAlchemy's own (`blobs.watch`).
CONNECTION: ContextVar[Connection | None] = ContextVar("agent_jobs_connection", default=None)


class Row:
    """A result row: columns as attributes, `_mapping` and `_asdict()` as SQLAlchemy's."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, index: int) -> Any:
        return list(self._mapping.values())[index]

    def _asdict(self) -> dict[str, Any]:
        return dict(self._mapping)

    def __repr__(self) -> str:
        return f"Row({self._mapping!r})"


@dataclass
class _Compiled:
    statement: Executable  # held, so its id is never reused while cached
    sql: str
    compiled: Any
    processors: dict[str, Callable[[Any], Any]]
    names: list[str] | None = None  # the result's column names, read at its first run
    # The result's processors by position, where a column's type has one (a payload's
    # codecs, agent_jobs/store/payloads.py); psycopg's own types need none.
    results: tuple[tuple[int, Callable[[Any], Any]], ...] = ()

    def rows(self, cursor: Any) -> Callable[[Sequence[Any]], Row]:
        """The row factory: the statement's column names are the same at every run, so
        they are read from the cursor's description once."""
        names = self.names
        if names is None:
            names = self.names = [column.name for column in cursor.description or ()]
        results = self.results
        if not results:
            return lambda values: Row(dict(zip(names, values, strict=True)))

        def row(values: Sequence[Any]) -> Row:
            processed = list(values)
            for index, process in results:
                processed[index] = process(processed[index])
            return Row(dict(zip(names, processed, strict=True)))

        return row

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = self.compiled.construct_params(values)
        for name, process in self.processors.items():
            if name in params:
                params[name] = process(params[name])
        return params


_COMPILED: dict[tuple[int, frozenset[str]], _Compiled] = {}


def _compile(conn: Connection, statement: Executable, keys: frozenset[str]) -> _Compiled:
    key = (id(statement), keys)
    cached = _COMPILED.get(key)
    if cached is not None and cached.statement is statement:
        return cached
    dialect = conn.dialect
    compiled = cast(Any, statement).compile(dialect=dialect, column_keys=sorted(keys))
    sql = compiled.string
    if "POSTCOMPILE" in sql or getattr(compiled, "escaped_bind_names", None):
        raise TypeError("a statement for the driver takes no expanding or escaped parameters")
    processors: dict[str, Callable[[Any], Any]] = {}
    for name, bind in compiled.binds.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors[name] = process
    results: list[tuple[int, Callable[[Any], Any]]] = []
    for index, column in enumerate(getattr(compiled, "_result_columns", None) or ()):
        if isinstance(column.type, TypeDecorator):
            process = column.type.dialect_impl(dialect).result_processor(dialect, None)
            if process is not None:
                results.append((index, process))
    entry = _COMPILED[key] = _Compiled(statement, sql, compiled, processors, None, tuple(results))
    return entry


def among(column: ColumnElement[Any], values: Iterable[str]) -> ColumnElement[bool]:
    """`column IN (...)` of constants, written into the SQL (an `in_` of values binds
    them at each execution, which a statement for the driver does not do)."""
    quoted: list[ColumnElement[Any]] = [
        literal_column("'" + value.replace("'", "''") + "'") for value in sorted(values)
    ]
    return column.in_(quoted)


def _direct(conn: Connection) -> bool:
    return conn.dialect.driver == "psycopg"


def rows(conn: Connection, statement: Executable, values: Mapping[str, Any]) -> list[Any]:
    """The statement's rows (the waiting statements sent with it)."""
    if not _direct(conn):
        return list(conn.execute(statement, dict(values)).all())
    return _run(conn, [(statement, values)])[0][0]


def first(conn: Connection, statement: Executable, values: Mapping[str, Any]) -> Any | None:
    """The statement's first row, or None."""
    found = rows(conn, statement, values)
    return found[0] if found else None


def scalar(conn: Connection, statement: Executable, values: Mapping[str, Any]) -> Any:
    """The first column of the statement's one row."""
    [row] = rows(conn, statement, values)
    return row[0]


def batch(
    conn: Connection, statements: Sequence[tuple[Executable, Mapping[str, Any]]]
) -> list[list[Any]]:
    """The rows of each statement, run in order in one round trip (on Postgres): for
    statements whose parameters do not depend on each other's results."""
    if not _direct(conn):
        return [list(conn.execute(s, dict(v)).all()) for s, v in statements]
    return _run(conn, statements)[0]


def rowcount(conn: Connection, statement: Executable, values: Mapping[str, Any]) -> int:
    """Run a write now; the number of rows it touched."""
    if not _direct(conn):
        return int(conn.execute(statement, dict(values)).rowcount)
    return _run(conn, [(statement, values)])[1]


def later(conn: Connection, statement: Executable, values: Mapping[str, Any]) -> None:
    """Run a write whose result nobody reads, with the connection's next statement or
    its commit."""
    if not _direct(conn):
        conn.execute(statement, dict(values))
        return
    _in_transaction(conn)
    CONNECTION.set(conn)
    compiled = _compile(conn, statement, frozenset(values))
    # The parameters first: a codec may send a statement of its own while it binds them,
    # which sends (and takes away) the waiting ones.
    params = compiled.params(values)
    conn.info.setdefault(_WAITING, []).append((compiled.sql, params))


def _in_transaction(conn: Connection) -> None:
    """Begin SQLAlchemy's transaction, as its own statements would (autobegin): a
    statement here belongs to one, which the caller commits or the close rolls back."""
    if not conn.in_transaction():
        conn.begin()


def _run(
    conn: Connection, statements: Sequence[tuple[Executable, Mapping[str, Any]]]
) -> tuple[list[list[Any]], int]:
    """The statements' rows, and the last one's row count: one round trip, with the
    waiting statements ahead of them."""
    _in_transaction(conn)
    CONNECTION.set(conn)
    compiled = []
    for statement, values in statements:
        entry = _compile(conn, statement, frozenset(values))
        compiled.append((entry, entry.params(values)))
    raw = _raw(conn)
    waiting = conn.info.pop(_WAITING, None)
    after: list[tuple[str, None]] = []
    if _reads_only(conn) and raw.info.transaction_status == _IDLE:
        waiting, after = [_BEGIN_READ_ONLY, *(waiting or ())], [_COMMIT]  # their own
    cursors = []
    try:
        if waiting or len(compiled) > 1:
            with _pipeline(raw):
                _send(raw, waiting or ())
                for entry, params in compiled:
                    cursors.append(raw.cursor(row_factory=entry.rows))
                    cursors[-1].execute(entry.sql, params)
                _send(raw, after)
        else:
            [(entry, params)] = compiled
            cursors.append(raw.cursor(row_factory=entry.rows))
            cursors[-1].execute(entry.sql, params)
        found = [c.fetchall() if c.description is not None else [] for c in cursors]
        return found, cursors[-1].rowcount
    except psycopg.Error as exc:
        raise _wrapped(conn, exc, compiled[0][0].sql, compiled[0][1]) from exc


def _reads_only(conn: Connection) -> bool:
    return bool(conn.get_execution_options().get(READ_ONLY, False))


def _raw(conn: Connection) -> psycopg.Connection[Any]:
    return cast("psycopg.Connection[Any]", conn.connection.driver_connection)


def _internals_as_tested() -> bool:
    """psycopg's pipeline has the private parts the one write stands in for (3.1-3.3)."""
    return all(
        callable(getattr(psycopg.Pipeline, name, None))
        for name in ("_communicate_gen", "_enqueue_sync", "_fetch_gen")
    )


_ONE_WRITE = _internals_as_tested()


def _queued(pipeline: Any) -> Generator[Any, Any, None]:
    """In place of a pipeline's communication after each statement: the statement goes
    into libpq's buffer, nothing is sent or read yet."""
    queue = pipeline.command_queue
    while queue:
        queue.popleft()()
    return
    yield  # a generator, as the communication it stands in for


@contextmanager
def _pipeline(raw: psycopg.Connection[Any]) -> Iterator[None]:
    """A psycopg pipeline whose statements go out together when it syncs (see above)."""
    with raw.pipeline() as pipeline:
        if not _ONE_WRITE or pipeline.level != 1 or not hasattr(pipeline, "command_queue"):
            yield
            return
        pipeline._communicate_gen = lambda: _queued(pipeline)  # type: ignore[method-assign]
        try:
            yield
        finally:
            del pipeline._communicate_gen  # the sync on the way out sends and reads all


def _send(raw: psycopg.Connection[Any], waiting: Iterable[tuple[str, Any]]) -> None:
    for sql, params in waiting:
        raw.execute(sql, params)


def _wrapped(conn: Connection, exc: psycopg.Error, sql: str, params: Any) -> DBAPIError:
    lost = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)  # type: ignore[arg-type]
    if lost:
        conn.invalidate(exc)
    wrapped = DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=lost)
    return wrapped  # type: ignore[return-value]


def _flush(conn: Connection, waiting: list[tuple[str, Any]], *, commit: bool = False) -> None:
    raw = _raw(conn)
    try:
        with _pipeline(raw):
            # A plain COMMIT: psycopg's own would sync once more.
            _send(raw, [*waiting, _COMMIT] if commit else waiting)
    except psycopg.Error as exc:
        raise _wrapped(conn, exc, waiting[-1][0], waiting[-1][1]) from exc


def install(engine: Engine) -> None:
    """Run an engine's psycopg connections as described above: in autocommit mode, the
    BEGIN and the writes sent ahead waiting on the connection, in order with every
    statement SQLAlchemy runs itself."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.autocommit = True  # the BEGIN is ours (below)

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get("isolation_level") != "AUTOCOMMIT" and not options.get(READ_ONLY):
            conn.info[_WAITING] = [_BEGIN]  # a read-only one begins at each statement

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Connection, *_: Any) -> None:
        waiting = conn.info.pop(_WAITING, None)
        if _reads_only(conn) and _raw(conn).info.transaction_status == _IDLE:
            waiting = [_BEGIN_READ_ONLY, *(waiting or ())]
        if waiting:
            _flush(conn, waiting)

    @event.listens_for(engine, "commit")
    def _commit(conn: Connection) -> None:
        waiting = conn.info.pop(_WAITING, None)
        if waiting and waiting != [_BEGIN]:  # a transaction that ran nothing sends nothing
            _flush(conn, waiting, commit=True)  # SQLAlchemy's commit then finds none open

    @event.listens_for(engine, "rollback")
    def _rollback(conn: Connection) -> None:
        if not conn.invalidated:  # an invalidated one's are gone with its DBAPI connection
            conn.info.pop(_WAITING, None)

    @event.listens_for(engine, "reset")
    def _reset(_dbapi: Any, record: Any, _state: Any) -> None:
        record.info.pop(_WAITING, None)  # a connection back in the pool starts afresh
