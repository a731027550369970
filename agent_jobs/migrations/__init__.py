"""Alembic migrations of the store.

`HEAD` names the newest revision, so that checking a database is current needs no
migration scripts loaded (a test keeps it equal to Alembic's own head).
"""

HEAD = "0013"
