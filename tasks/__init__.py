"""The Celery side of agent-jobs: the app factory and thin task adapters.

`celery -A tasks worker` finds `tasks.app`. Building it opens no connection.
"""
