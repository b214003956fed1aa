"""Each partition's current leader-epoch lineage (issue 30): the newest lineage any replica's kts
saw, as [[epoch, start offset], ...]. Copying, reading and retention follow it, so that after an
unclean election the tier serves the new leader's records and never the old leader's.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: no replica's lineage recorded yet (the next copy pass records it).
    op.add_column("partitions", sa.Column("leader_epochs", JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("partitions", "leader_epochs")
