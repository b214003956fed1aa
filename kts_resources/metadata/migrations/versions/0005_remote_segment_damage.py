"""A finished remote segment found damaged in the tier (an object missing, of the wrong size or
failing its checksum): recorded on the segment, so `kts status` counts it and the next copy pass
re-copies it from the local segment while that still exists.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: no damage found. The first finding is kept (a later one adds nothing a re-copy needs).
    op.add_column("remote_segments", sa.Column("damage", sa.Text, nullable=True))
    op.add_column("remote_segments", sa.Column("damage_found_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("remote_segments_damaged", "remote_segments", ["topic_id", "partition", "start_offset"],
                    postgresql_where=sa.text("damage IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("remote_segments_damaged", table_name="remote_segments")
    op.drop_column("remote_segments", "damage_found_at")
    op.drop_column("remote_segments", "damage")
