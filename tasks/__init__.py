"""The Celery side of agent-jobs: the app factory and thin task adapters.

`celery -A tasks worker` finds `tasks.app`. Building it opens no connection.
"""

from .app import create_app

app = create_app()

__all__ = ["app", "create_app"]
