"""Data-loss alarm: offset ranges deleted locally before they reached the remote tier, kept until a
person acknowledges them; and the first local log start offset kts observed per partition (data
below it was gone before kts looked, so it is never counted as lost).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: kts has not looked at the partition's local log since this column exists.
    op.add_column("partitions", sa.Column("first_observed_offset", sa.BigInteger, nullable=True))
    op.create_table(
        "lost_ranges",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("topic_id", sa.Uuid, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("how_found", sa.Text, nullable=False),
        sa.Column("acknowledged_by", sa.Text, nullable=True),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.ForeignKeyConstraint(
            ["topic_id", "partition"], ["partitions.topic_id", "partitions.partition"],
            name="lost_ranges_partition_fkey",
        ),
        sa.CheckConstraint("start_offset >= 0 AND end_offset >= start_offset", name="lost_ranges_offsets_check"),
        sa.CheckConstraint("(acknowledged_by IS NULL) = (acknowledged_at IS NULL)", name="lost_ranges_acknowledged_check"),
        sa.UniqueConstraint("topic_id", "partition", "start_offset", "end_offset", name="lost_ranges_range_key"),
    )


def downgrade() -> None:
    op.drop_table("lost_ranges")
    op.drop_column("partitions", "first_observed_offset")
