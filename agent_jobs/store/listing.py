"""The runs list (`GET /v1/runs`, the console, `agent-jobs runs`): runs newest first by
(created_at, id), filtered, a page at a time.

Each filter has an index that leads with it and goes on with (created_at, id)
(store/schema.py), so a page is a short index scan however many runs there are; the
search (`q`) has a trigram index on Postgres where pg_trgm could be had, and reads the
table otherwise (and on SQLite). Pages are keyset pages: the cursor names the last run of
a page, and the next page is the runs before it, so runs started meanwhile never shift a
later page (no run is skipped or shown twice).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Text,
    and_,
    func,
    literal,
    or_,
    select,
    tuple_,
    union,
)

from ..encryption.envelope import TEXT_MARK
from ..errors import InvalidRequestError
from ..schedules.spec import PREFIX as SCHEDULE_PREFIX
from .db import contains_nul
from .runs import RUN_STATUSES
from .schema import SEARCH_TEXT, runs, tool_calls
from .view import RunView

MAX_LIMIT = 500
MAX_Q = 500  # characters: a search is a word or an id, not a document


@dataclass(frozen=True)
class RunFilter:
    """Which runs a page holds: all of these that are set (statuses: any of them)."""

    statuses: tuple[str, ...] = ()
    agent: str | None = None
    actor: str | None = None
    thread_id: str | None = None
    parent_run_id: str | None = None
    root_run_id: str | None = None
    schedule: str | None = None  # started by this schedule (its metadata's `schedule`)
    q: str | None = None  # a run id, or a piece of its input or metadata (any case)
    since: datetime | None = None  # created_at >= since
    until: datetime | None = None  # created_at < until


@dataclass(frozen=True)
class Reader:
    """A reader who may not read every run: SQL keeps the runs they might read (a superset the
    HTTP layer then checks exactly): runs of `actor`, runs whose root run is `actor`'s, and runs
    whose tree (same root_run_id) has an `action` tool call named in `tools`."""

    actor: str
    tools: frozenset[str]


@dataclass(frozen=True)
class RunPage:
    runs: list[RunView]
    next_cursor: str | None  # None: no more


def list_runs(
    conn: Connection,
    where: RunFilter,
    *,
    reader: Reader | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> RunPage:
    """A page of the runs `where` picks (those `reader` might read), newest first, after
    the run `cursor` names. Bad input raises `InvalidRequestError` and reads nothing."""
    rows = conn.execute(list_runs_query(where, reader=reader, limit=limit, cursor=cursor)).all()
    page = [RunView.from_row(row) for row in rows[:limit]]
    last = page[-1] if len(rows) > limit else None
    return RunPage(page, None if last is None else encode_cursor(last.created_at, last.run_id))


def list_runs_query(
    where: RunFilter, *, reader: Reader | None = None, limit: int = 50, cursor: str | None = None
) -> Select[Any]:
    """The statement of `list_runs`: its page and one run more (whether there is a next
    page, without asking again)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequestError(f"invalid request: limit: {limit} is not 1 to {MAX_LIMIT}")
    conditions = _conditions(where)
    if cursor is not None:
        created_at, run_id = decode_cursor(cursor)
        conditions.append(_before(created_at, run_id))
    if reader is None:
        return _newest(select(runs), conditions, limit + 1)
    return _readable(conditions, reader, limit + 1)


def _newest(query: Select[Any], conditions: Sequence[ColumnElement[bool]], n: int) -> Select[Any]:
    order = (runs.c.created_at.desc(), runs.c.id.desc())
    return query.where(*conditions).order_by(*order).limit(n)


def _readable(conditions: list[ColumnElement[bool]], reader: Reader, n: int) -> Select[Any]:
    """The newest `n` runs of the reader's scopes: each scope is a page of its own (each
    scanned by its own index, newest first), and the page is the newest of their union."""
    keys = select(runs.c.created_at, runs.c.id)
    pages = [_newest(keys, [*conditions, scope], n).subquery() for scope in _scopes(reader)]
    found = union(*(select(page) for page in pages)).subquery("readable")
    return _newest(select(runs).join(found, found.c.id == runs.c.id), [], n)


def _scopes(reader: Reader) -> list[ColumnElement[bool]]:
    own = runs.alias("own")
    scopes: list[ColumnElement[bool]] = [
        runs.c.actor == reader.actor,
        runs.c.root_run_id.in_(select(own.c.id).where(own.c.actor == reader.actor)),
    ]
    if reader.tools:
        called = runs.alias("called")
        exact = sorted(t for t in reader.tools if not t.endswith(".*"))
        # `<server>.*`: every tool of an MCP server (its names are known only to its runs).
        named: list[ColumnElement[bool]] = [tool_calls.c.name.in_(exact)] if exact else []
        named += [
            tool_calls.c.name.startswith(t[:-1], autoescape=True)
            for t in sorted(reader.tools)
            if t.endswith(".*")
        ]
        deciders = (
            select(called.c.root_run_id)
            .select_from(tool_calls.join(called, called.c.id == tool_calls.c.run_id))
            .where(tool_calls.c.kind == "action", or_(*named))
        )
        scopes.append(runs.c.root_run_id.in_(deciders))
    return scopes


def _conditions(where: RunFilter) -> list[ColumnElement[bool]]:
    _check(where)
    found: list[ColumnElement[bool]] = []
    if where.statuses:
        statuses = sorted(set(where.statuses))
        found.append(
            runs.c.status == statuses[0] if len(statuses) == 1 else runs.c.status.in_(statuses)
        )
    for column, value in (
        (runs.c.agent, where.agent),
        (runs.c.actor, where.actor),
        (runs.c.thread_id, where.thread_id),
        (runs.c.parent_run_id, where.parent_run_id),
        (runs.c.root_run_id, where.root_run_id),
    ):
        if value is not None:
            found.append(column == value)
    if where.schedule is not None:
        found.append(_of_schedule(where.schedule))
    if where.since is not None:
        found.append(runs.c.created_at >= _utc(where.since))
    if where.until is not None:
        found.append(runs.c.created_at < _utc(where.until))
    if where.q:
        found.append(_search(where.q))
    return found


def _of_schedule(name: str) -> ColumnElement[bool]:
    """The runs a schedule started: by their ids (`sched:<name>:…`, which a payload
    codec leaves as they are), or by their metadata's `schedule` where it is stored
    clear."""
    return or_(
        runs.c.id.startswith(f"{SCHEDULE_PREFIX}:{name}:", autoescape=True),
        runs.c.metadata["schedule"].as_string() == name,
    )


def _search(q: str) -> ColumnElement[bool]:
    """The run with id `q`, or any whose search text holds `q` (any case); `%`, `_` and
    `\\` in `q` are themselves, not wildcards. A sealed run (encryption at rest) is
    found by its id only: its search text is ciphertext, which a word must not match
    (`enc`, a data key's id or a letter would otherwise find every sealed run)."""
    escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    clear = func.substr(runs.c.input, 1, len(TEXT_MARK), type_=Text) != TEXT_MARK
    return or_(runs.c.id == q, and_(clear, SEARCH_TEXT.ilike(f"%{escaped}%", escape="\\")))


def _check(where: RunFilter) -> None:
    unknown = sorted(set(where.statuses) - set(RUN_STATUSES))
    if unknown:
        known = ", ".join(RUN_STATUSES)
        raise InvalidRequestError(f"invalid request: status: {unknown[0]!r} is not one of {known}")
    texts = {
        "agent": where.agent,
        "actor": where.actor,
        "thread_id": where.thread_id,
        "parent_run_id": where.parent_run_id,
        "root_run_id": where.root_run_id,
        "schedule": where.schedule,
        "q": where.q,
    }
    for name, value in texts.items():
        if value is not None and contains_nul(value):
            raise InvalidRequestError(f"invalid request: {name}: holds a NUL character")
    if where.q is not None and len(where.q) > MAX_Q:
        raise InvalidRequestError(f"invalid request: q: longer than {MAX_Q} characters")


def _utc(moment: datetime) -> datetime:
    """`moment` in UTC (a naive one is taken to be UTC): as the store writes its times."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _before(created_at: datetime, run_id: str) -> ColumnElement[bool]:
    """The runs after this one, newest first: older, or as old with a smaller id."""
    key = (runs.c.created_at, runs.c.id)
    bound = (literal(created_at, runs.c.created_at.type), literal(run_id, runs.c.id.type))
    # One row comparison: Postgres scans an index for it from the position on.
    return tuple_(*key) < tuple_(*bound)


# --- what deciding who may read a page needs, in two queries --------------------------------


@dataclass(frozen=True)
class Trees:
    """Of some run trees (by root run id): who started each, and the action calls made
    anywhere in it (each a dict of the call's `run_id`, `call_id`, `name`, `kind`,
    `approvers` and `escalated`). A reader may read a run when it is theirs, its root is,
    or they may decide one of its tree's calls (http/access.py): for a page of the list,
    that is these two queries, not a few for each run."""

    owners: dict[str, str]  # root run id -> its actor
    calls: dict[str, list[dict[str, Any]]]  # root run id -> the tree's action calls


def trees(conn: Connection, root_run_ids: Collection[str]) -> Trees:
    roots = sorted(set(root_run_ids))
    if not roots:
        return Trees({}, {})
    owners = conn.execute(select(runs.c.id, runs.c.actor).where(runs.c.id.in_(roots))).all()
    called = runs.alias("called")
    query = (
        select(
            called.c.root_run_id,
            tool_calls.c.run_id,
            tool_calls.c.call_id,
            tool_calls.c.name,
            tool_calls.c.kind,
            tool_calls.c.approvers,
            tool_calls.c.escalated,
        )
        .select_from(called.join(tool_calls, tool_calls.c.run_id == called.c.id))
        .where(called.c.root_run_id.in_(roots), tool_calls.c.kind == "action")
        .order_by(tool_calls.c.run_id, tool_calls.c.call_id)
    )
    calls: dict[str, list[dict[str, Any]]] = {root: [] for root in roots}
    for row in conn.execute(query):
        found = dict(row._mapping)
        calls[found.pop("root_run_id")].append(found)
    return Trees({root: actor for root, actor in owners}, calls)


# --- cursors ------------------------------------------------------------------------------


def encode_cursor(created_at: datetime, run_id: str) -> str:
    """The opaque cursor of the page after the run (created_at, run_id)."""
    body = json.dumps({"t": _utc(created_at).isoformat(), "id": run_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The run a cursor names; `InvalidRequestError` for one this module did not make."""
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        created_at, run_id = body["t"], body["id"]
        if not isinstance(created_at, str) or not isinstance(run_id, str):
            raise ValueError("not a run's position")
        if len(run_id) > 64 or contains_nul(run_id):
            raise ValueError("not a run's position")
        return _utc(datetime.fromisoformat(created_at)), run_id
    except (ValueError, TypeError, KeyError, binascii.Error, UnicodeDecodeError):
        # json's and base64's errors are ValueErrors; a body that is no object, TypeError
        raise InvalidRequestError(
            "invalid request: cursor: not one this server gave (pass next_cursor as it came)"
        ) from None
