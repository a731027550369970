"""`agent_jobs.diagnostics`: subscribe to a run's lifecycle diagnostics (`run.started`,
`assistant.message`, `tool.executed|rejected|failed`, `run.finished`); with no listener
they cost nothing. The events come from `agent_jobs.observability.diagnostics`."""

from .observability.diagnostics import Listener, active, publish, set_enabled, subscribe

__all__ = ["Listener", "active", "publish", "set_enabled", "subscribe"]
