"""A kept step: the first remote step a pass schedules, kept back from the broker for the
task that made the pass to run at once (the chain, `DurableRunner._chain`). Its row is
written claimed with the pass's own insert; on a failure it is given back and sent."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...dispatch import own_queue, tool_of
from ...leases import Holder
from ...store import RunView, Store
from ...store import holds as hold_rows
from ...store.journal import JournalRow, JournalRowWithRun
from .replay import DurableHooks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kept:
    """A step a pass kept back to run at once, with its row as the pass wrote it: the
    pass held the run's lock and nothing else knows of the step yet, so the task that
    runs it need not read the row again."""

    task: str
    step: str
    row: JournalRowWithRun
    holder: Holder  # the claim the pass wrote on the row

    @property
    def send(self) -> tuple[str, str]:
        """The step as the broker takes it."""
        return self.task, self.step

    @property
    def tool(self) -> str | None:
        """The tool the step calls, if it calls one (Flower shows it)."""
        return tool_of(self.row.intent)


def claim(run: RunView, hooks: DurableHooks, lease: float) -> Kept | None:
    """Keep the first remote step the pass schedules for this process to run at once:
    its row is written claimed (started, leased to this process), so the claim costs
    nothing beyond the pass's own insert; the other steps are sent."""
    # A step with a queue of its own (a CPU-bound tool's) is always sent there.
    mine = [i for i, (task, _) in enumerate(hooks.to_dispatch) if own_queue(task)[1] is None]
    if not mine:
        return None
    task, step = hooks.to_dispatch.pop(mine[0])
    [written] = [r for r in hooks.new_rows if r["step"] == step]
    holder = Holder.me()
    hold_rows.claim(written, str(holder), lease)
    # The row as a step task reads it (`journal.get_with_run`), its intent whole.
    snapshot = JournalRowWithRun(
        **{**written, "intent": hooks.whole_intent(step)},
        run_status="running",
        run_actor=run.actor,
        root_run_id=run.root_run_id,
        thread_id=run.thread_id,
        run_created_at=run.created_at,
    )
    return Kept(task, step, snapshot, holder)


def on_own_queue(row: JournalRow) -> bool:
    """Whether the step went to a queue of its own (a tool's): the step after it is
    sent, not run on that queue's worker."""
    return isinstance(row.intent, dict) and bool(row.intent.get("queue"))


def give_back(store: Store, run_id: str, kept: Kept) -> bool:
    """Give a kept step back to the broker; False when its claim is no longer this
    process's (recovery let go of it and sent the step again)."""
    try:
        with store.begin() as conn:
            return hold_rows.unclaim(conn, run_id, kept.step, str(kept.holder))
    except Exception as exc:  # the claim lapses; then the sweep sends the step
        log.warning("could not give back %s of run %s: %s", kept.step, run_id, exc)
        return True
