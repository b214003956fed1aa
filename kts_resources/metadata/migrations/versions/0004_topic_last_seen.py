"""When any kts process last saw each topic in a log dir: a topic no process has seen for the
grace period is treated as deleted (its remote data removed), and every process sharing the store
keeps it alive while the topic is in any of their log dirs (a partition reassigned to another
broker is not a deletion).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: not seen since this column exists (the first pass after the upgrade sets it).
    op.add_column("topics", sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("topics", "last_seen_at")
