"""`e2e_app`'s app in a worker whose spans are written to `$TEST_SPANS_DIR`, one file a
process (tests/support/apps/otel.py sets that provider up when imported):

    AGENT_JOBS_APP=e2e_otel:app   AGENT_JOBS_OTEL=1   TEST_SPANS_DIR=…
"""

from __future__ import annotations

import e2e_app

import tests.support.apps.otel  # noqa: F401  (the span files' provider)
from agent_jobs import AgentApp


def __getattr__(name: str) -> AgentApp:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return e2e_app.app
