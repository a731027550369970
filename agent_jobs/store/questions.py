"""Questions a tool asked a person, and their answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select, update

from ..encryption.keyring import owns
from .db import utcnow
from .runs import TERMINAL
from .schema import questions, runs


def ask(
    conn: Connection,
    *,
    run_id: str,
    request_id: str,
    call_id: str,
    tool: str,
    asked: list[dict[str, Any]],
) -> None:
    owns(conn, run_id)
    conn.execute(
        insert(questions).values(
            run_id=run_id,
            request_id=request_id,
            call_id=call_id,
            tool=tool,
            questions=asked,
            created_at=utcnow(),
        )
    )


def get(conn: Connection, run_id: str, request_id: str) -> Any | None:
    return conn.execute(
        select(questions).where(questions.c.run_id == run_id, questions.c.request_id == request_id)
    ).first()


def answer(
    conn: Connection, run_id: str, request_id: str, *, answers: dict[str, Any], actor: str
) -> bool:
    """Record the answers to an open question; the first answer wins."""
    owns(conn, run_id)
    result = conn.execute(
        update(questions)
        .where(
            questions.c.run_id == run_id,
            questions.c.request_id == request_id,
            questions.c.answers.is_(None),
        )
        .values(answers=answers, answered_by=actor, answered_at=utcnow())
    )
    return result.rowcount == 1


def open_questions(conn: Connection, *, run_id: str | None = None) -> Sequence[Any]:
    """Questions waiting for answers, oldest first, with their run's actor; a question
    of a run that has ended waits for no one and is not listed."""
    query = (
        select(questions, runs.c.actor)
        .join(runs, runs.c.id == questions.c.run_id)
        .where(questions.c.answers.is_(None), runs.c.status.not_in(TERMINAL))
        .order_by(questions.c.created_at)
    )
    if run_id is not None:
        query = query.where(questions.c.run_id == run_id)
    return conn.execute(query).all()
