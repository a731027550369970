"""The journal cache keeps a run's final prefix, and nothing a pass might still change."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from agent_jobs.runners.durable.journal_cache import JournalCache, after

BORN = datetime(2026, 12, 1, tzinfo=UTC)


def _row(seq: int, state: str) -> SimpleNamespace:
    return SimpleNamespace(step=f"s{seq}", seq=seq, state=state, result={"n": seq}, error=None)


def test_only_the_final_rows_up_to_the_first_unfinished_one_are_kept() -> None:
    cache = JournalCache()
    rows = [_row(1, "done"), _row(2, "failed"), _row(3, "scheduled"), _row(4, "done")]
    cache.keep("r", BORN, reversed(rows))  # in any order
    known = cache.prefix("r", BORN)
    assert [r.seq for r in known] == [1, 2] and after(known) == 2


def test_a_missing_position_ends_the_prefix() -> None:
    cache = JournalCache()
    cache.keep("r", BORN, [_row(1, "done"), _row(3, "done")])
    assert [r.seq for r in cache.prefix("r", BORN)] == [1]
    assert after(JournalCache().prefix("r", BORN)) == 0


def test_a_run_of_the_same_id_created_again_is_another_run() -> None:
    cache = JournalCache()
    cache.keep("r", BORN, [_row(1, "done")])
    assert cache.prefix("r", datetime(2026, 12, 2, tzinfo=UTC)) == []
    cache.drop("r", datetime(2026, 12, 2, tzinfo=UTC))  # not the run it knows
    assert cache.prefix("r", BORN) != []
    cache.drop("r", BORN)
    assert cache.prefix("r", BORN) == []


def test_what_is_known_of_a_run_id_is_read_before_its_row() -> None:
    """A pass reads the run's row and the journal after the known prefix together: it
    asks by run id, and the creation time it gets back tells whether it is that run."""
    cache = JournalCache()
    assert cache.latest("r") is None
    cache.keep("r", BORN, [_row(1, "done"), _row(2, "done")])
    latest = cache.latest("r")
    assert latest is not None and latest[0] == BORN and after(latest[1]) == 2
    later = datetime(2026, 12, 2, tzinfo=UTC)
    cache.keep("r", later, [_row(1, "done")])  # the same id, another run
    assert cache.latest("r") == (later, cache.prefix("r", later))


def test_nothing_final_forgets_the_run_and_the_oldest_run_is_evicted() -> None:
    cache = JournalCache(capacity=2)
    for run in ("a", "b", "c"):
        cache.keep(run, BORN, [_row(1, "done")])
    assert cache.prefix("a", BORN) == [] and cache.prefix("c", BORN) != []
    cache.keep("c", BORN, [_row(1, "waiting")])
    assert cache.prefix("c", BORN) == []


def test_the_prefix_handed_out_is_a_copy() -> None:
    cache = JournalCache()
    cache.keep("r", BORN, [_row(1, "done")])
    cache.prefix("r", BORN).append(_row(2, "done"))
    assert len(cache.prefix("r", BORN)) == 1
