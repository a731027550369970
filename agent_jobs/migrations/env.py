"""Alembic environment: migrations run on the engine the caller hands over."""

from __future__ import annotations

from alembic import context

from agent_jobs.store.db import make_engine
from agent_jobs.store.schema import metadata

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # the plain `alembic` command line: fall back to the settings
    from agent_jobs.settings import get_settings

    engine = make_engine(get_settings().database_url)

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
