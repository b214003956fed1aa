"""Consumer groups' committed offsets (issue 29): what OffsetCommit stores and OffsetFetch answers,
kept here rather than in a `kts serve` process, so a restarted `kts serve`, or a second one sharing
the store, resumes every group where it stopped. Keyed by topic name, as Kafka's
__consumer_offsets keys them (OffsetCommit names topics up to v9).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_offsets",
        sa.Column("group_id", sa.Text, primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("committed_offset", sa.BigInteger, nullable=False),
        sa.Column("leader_epoch", sa.Integer, nullable=False, server_default=sa.text("-1")),
        sa.Column("metadata", sa.Text, nullable=True),
        sa.Column("committed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("group_offsets")
