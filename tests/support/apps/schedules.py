"""The app of the schedule tests (AGENT_JOBS_APP=tests.support.apps.schedules:app).

Its schedules come from `TEST_SCHEDULES`, read when the module is imported: entries
`name|catch_up|cron` separated by `;` (a worker, beat and the CLI of one test read the
same). Without it, one schedule `nightly` at 02:30 Europe/Paris that no test waits for.
A run of each is one model turn that answers with its input.
"""

from __future__ import annotations

import os

from agent_jobs import AgentApp, ScriptedModel

DEFAULT = "nightly|latest|30 2 * * *"

app = AgentApp(roles={"ops": ["reports"], "olga": ["operator"]})
app.agent("reporter", model=ScriptedModel([{"text": "report written"}]), system="Write a report.")


def define(spec: str, *, timezone: str = "Europe/Paris") -> None:
    for entry in filter(None, (part.strip() for part in spec.split(";"))):
        name, catch_up, cron = entry.split("|")
        app.schedule(
            name,
            agent="reporter",
            cron=cron,
            timezone=timezone,
            input=f"the {name} report",
            actor="ops",
            metadata={"team": "ops"},
            catch_up=catch_up,
        )


define(os.environ.get("TEST_SCHEDULES", DEFAULT))
