"""Alembic's entry point for the archive's migrations: run on the connection ``jobs.archive.database``
hands over, recording the version in ``leash_alembic_version``."""

from alembic import context

from jobs.archive.tables import metadata

context.configure(connection=context.config.attributes["connection"], target_metadata=metadata,
                  version_table="leash_alembic_version")
with context.begin_transaction():
    context.run_migrations()
