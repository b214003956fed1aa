"""Alembic environment for the metadata store, run programmatically (``database.migrate``).

The caller hands over an open connection in ``config.attributes["connection"]`` (it already holds
the migration advisory lock); there is no alembic.ini and no offline mode.
"""

from __future__ import annotations

from alembic import context

from kts_resources.metadata.database import VERSION_TABLE
from kts_resources.metadata.models import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("kts migrations run through kts_resources.metadata.database.migrate(engine)")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    compare_type=True,
    # One transaction for the whole upgrade: PostgreSQL's DDL is transactional, so a failed
    # upgrade leaves the schema where it was.
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
