"""`python -m agent_jobs.cli` is `agent-jobs`."""

from . import main

main()
