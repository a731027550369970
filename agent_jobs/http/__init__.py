"""The HTTP API and the approval inbox page (`agent-jobs serve`; the `api` extra).

`agent_jobs.http:app` is the app built from the settings, on first use (nothing is
connected or read at import), so `uvicorn agent_jobs.http:app` serves what
`agent-jobs serve` does. `create_app(door, settings)` builds one around another door.

- `factory`: `create_app`; `door`: what the server serves (a deployment's commands and
  its streams; `agent_jobs/serving.py` joins it to a runner); `auth`, `access`: tokens,
  actors and who may do what; `runs`, `decisions`, `service`, `page`: the routes; `sse`:
  event streams; `errors`: the error shape; `middleware`: headers and body size.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        # Assembled above this package, where a runner may be reached.
        from ..serving import default_app

        return default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
