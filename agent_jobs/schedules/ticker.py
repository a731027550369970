"""The embedded default's ticker: a thread that ticks the schedules every
`schedule_interval` seconds in a process that drives runs inline (`agent-jobs serve`
without a broker, or a program of yours with an `InlineRunner`). With a broker, Celery
beat ticks them instead (`agent_jobs.schedules` task)."""

from __future__ import annotations

import logging
import threading

from ..app import AgentApp
from ..settings import Settings
from ..store import Store
from .tick import Starts, tick

log = logging.getLogger(__name__)


class Ticker:
    """Ticks `app`'s schedules on `store`, starting their runs through `wake`."""

    def __init__(self, store: Store, app: AgentApp, wake: Starts, settings: Settings) -> None:
        self.store = store
        self.app = app
        self.wake = wake
        self.interval = settings.schedule_interval
        self.grace = settings.schedule_grace
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Ticker:
        self._thread = threading.Thread(target=self._run, name="schedules", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                tick(self.store, self.app, self.wake, grace=self.grace)
            except Exception:  # the next tick tries again
                log.exception("schedules: a tick failed")
            self._stop.wait(self.interval)


def start_ticker(store: Store, app: AgentApp, wake: Starts, settings: Settings) -> Ticker | None:
    """Tick the app's schedules in this process (None when it defines none)."""
    if not app.schedules:
        return None
    return Ticker(store, app, wake, settings).start()
