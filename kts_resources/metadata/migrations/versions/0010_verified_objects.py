"""Tier objects already verified (issue 33): each object whose bytes a bucket check read and found
matching its recorded CRC-32C, with the version the tier listed it at, so that a routine check
reads it again only once it changed. `kts scrub --deep` still reads every byte.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verified_objects",
        sa.Column("segment_id", sa.Uuid, sa.ForeignKey("remote_segments.segment_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("tag", sa.Text, nullable=False),
        sa.Column("crc32c", sa.BigInteger, nullable=False),
        sa.Column("verified_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("verified_objects")
