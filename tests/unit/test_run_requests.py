"""A run request's text as Postgres can store it: no NUL character anywhere (a 500 on
Postgres once, whose log then held the statement's values), and metadata of a bounded
size. The same refusals over HTTP: tests/doors/test_http_api.py."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs.errors import InvalidRequestError
from agent_jobs.runs import MAX_METADATA, RunRequest
from agent_jobs.store.db import make_engine

NUL = "\x00"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"input": f"refund{NUL}42"}, "input"),
        ({"actor": f"user{NUL}"}, "actor"),
        ({"persona": f"p{NUL}"}, "persona"),
        ({"metadata": {f"key{NUL}": 1}}, "metadata"),
        ({"metadata": {"ticket": [1, {"note": f"a{NUL}b"}]}}, "metadata"),
    ],
    ids=["input", "actor", "persona", "metadata-key", "metadata-value"],
)
def test_a_nul_anywhere_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"{named}: .*NUL characters") as refused:
        RunRequest.parse({"agent": "support", "input": "go", **fields})
    assert NUL not in str(refused.value)


def test_metadata_is_bounded_and_what_is_within_the_bound_is_kept() -> None:
    kept = {"ticket": 7, "note": "x" * (MAX_METADATA - 100)}
    assert RunRequest.parse({"agent": "a", "input": "go", "metadata": kept}).metadata == kept
    with pytest.raises(InvalidRequestError, match=f"metadata: .*at most {MAX_METADATA} bytes"):
        RunRequest.parse({"agent": "a", "input": "go", "metadata": {"n": "x" * MAX_METADATA}})


def test_the_engines_never_put_a_statements_values_in_an_error(tmp_path: Any) -> None:
    for url in (f"sqlite:///{tmp_path / 'x.db'}", "postgresql+psycopg://u@127.0.0.1:1/db"):
        engine = make_engine(url, password="")
        assert engine.hide_parameters, url
        engine.dispose()
