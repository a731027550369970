"""A worker host cut off from the network, twice, while it runs steps: its frames
dropped for 8 s, then its link down for 8 s (tests/support/partition.py). Nothing is lost,
no step runs on two live workers at once, no finished step and no action runs again, and
the host that was never cut off is never taken for dead. The full experiment, with its
figures, is `bench/partition.py` (docs/durable.md, "A host cut off from the network")."""

from __future__ import annotations

from tests.support.partition import experiment, lab


def test_a_host_cut_off_twice_loses_nothing_and_slows_nobody() -> None:
    with lab() as made:
        found = experiment(made, [("drop", 8.0), ("link", 8.0)], runs=8, every=2.0)
        summary = found.summary()
        assert found.steps_on_a_at_cuts >= 2, summary  # each cut caught a step running
        assert found.runs_lost == 0 and found.runs_completed == found.runs_sent, summary
        assert found.two_live_at_once == 0, summary
        assert found.finished_again == 0, summary
        assert found.actions_twice == 0, summary
        assert found.healthy_taken == 0, (summary, made.silences)
