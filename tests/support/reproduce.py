"""After a run with failures: the commands that run them again, with the same seed.

pytest-randomly shuffles the order of the tests with a seed it prints at the start; the
same seed gives the same order. The first command runs the failed tests alone, in one
process, in that order; the second runs the whole suite again with the seed.
"""

from __future__ import annotations

import shlex

import pytest

PYTEST = ".venv/bin/python -m pytest"


def _nodeid(report: pytest.TestReport) -> str:
    return report.nodeid.split("@", 1)[0]  # xdist adds "@group" to grouped tests' ids


def summary(reporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    failed = [
        _nodeid(r)
        for kind in ("failed", "error")
        for r in reporter.stats.get(kind, [])
        if isinstance(r, pytest.TestReport)
    ]
    if not failed:
        return
    seed = getattr(config.option, "randomly_seed", None)
    with_seed = f" -p randomly --randomly-seed={seed}" if isinstance(seed, int) else ""
    ids = " ".join(shlex.quote(n) for n in dict.fromkeys(failed))
    reporter.write_sep("=", "run the failures again")
    reporter.write_line(f"{PYTEST} -n 0{with_seed} {ids}")
    reporter.write_line(f"the whole suite, same seed: {PYTEST}{with_seed}")
