"""What a process of agent-jobs starts beside its work, written once.

Every entry point calls `start` once it has its store and its settings: a worker's
process (tasks/runtime.py), `agent-jobs serve` (agent_jobs/serving.py), the approvals
listener, the command line when it drives runs in its own process, a Python client, and
a program of yours that drives runs with `InlineRunner` (docs/agents.md, "Running agents
from Python"). The runners and the doors start none of it.

- `check`, before anything connects: a webhook without a secret, tracing without its
  extra (each a `ConfigurationError` naming the setting);
- the diagnostics switch (`AGENT_JOBS_DIAGNOSTICS`);
- the notification sender for the store's database (agent_jobs/notify), unless
  `deliver=False` (a client records, it does not deliver);
- tracing, after the app was loaded (it may have set OpenTelemetry up itself);
- with `serve_metrics`, the metrics on `AGENT_JOBS_METRICS_PORT` (a worker's are served
  by its main process once its pool has forked: tasks/runtime.py).

Each part starts once per process (the sender once per database): calling `start` again
is harmless.
"""

from __future__ import annotations

import redis

from .notify.sender import start_sender
from .notify.webhook import check as check_webhook
from .observability import diagnostics, metrics, tracing
from .settings import Settings
from .store import Store


def check(settings: Settings) -> None:
    """Refuse settings this process could not run with, before anything connects."""
    check_webhook(settings)
    tracing.check(settings)


def start(
    store: Store,
    settings: Settings,
    *,
    deliver: bool = True,
    serve_metrics: bool = False,
    redis_client: redis.Redis | None = None,
) -> None:
    """Start this process's services for `store` (`redis_client`: the sender's Redis, by
    default one of its own from the settings)."""
    check(settings)
    if serve_metrics:  # first: a missing extra or a port in use stops the start here
        metrics.serve(settings, store=store)
    diagnostics.set_enabled(settings.diagnostics)
    if deliver:
        start_sender(store, settings, redis_client=redis_client)
    tracing.setup(settings)
