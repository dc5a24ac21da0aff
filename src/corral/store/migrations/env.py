"""Alembic environment: runs on the connection handed over by ``corral.store.migrate``."""

from alembic import context

from corral.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("corral migrations run through corral.store.migrate.upgrade()")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
