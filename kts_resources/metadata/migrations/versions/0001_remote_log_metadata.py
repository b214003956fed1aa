"""Remote log metadata store: topics, partitions, remote segments and their leader epochs, the
event log, and KIP-956 quota samples.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None

# Spelled out rather than imported from the models: a migration is a fixed record of one change.
SEGMENT_STATES = "'COPY_SEGMENT_STARTED', 'COPY_SEGMENT_FINISHED', 'DELETE_SEGMENT_STARTED', 'DELETE_SEGMENT_FINISHED'"
PARTITION_DELETE_STATES = "'DELETE_PARTITION_MARKED', 'DELETE_PARTITION_STARTED', 'DELETE_PARTITION_FINISHED'"


def _created_updated() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "topics",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("topic_id", sa.Uuid, nullable=False, unique=True),
        sa.Column("configs", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
        *_created_updated(),
    )
    op.create_table(
        "partitions",
        sa.Column("topic_id", sa.Uuid, primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("log_start_offset", sa.BigInteger, server_default=sa.text("0"), nullable=False),
        sa.Column("highest_copied_offset", sa.BigInteger, server_default=sa.text("-1"), nullable=False),
        sa.Column("delete_state", sa.Text, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("partition >= 0", name="partitions_partition_check"),
        sa.CheckConstraint(f"delete_state IN ({PARTITION_DELETE_STATES})", name="partitions_delete_state_check"),
    )
    op.create_table(
        "remote_segments",
        sa.Column("segment_id", sa.Uuid, primary_key=True),
        sa.Column("topic_id", sa.Uuid, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.Column("max_timestamp_ms", sa.BigInteger, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("leader_epochs", JSONB, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("broker_id", sa.Integer, nullable=False),
        sa.Column("event_timestamp_ms", sa.BigInteger, nullable=False),
        sa.Column("custom_metadata", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
        *_created_updated(),
        sa.ForeignKeyConstraint(
            ["topic_id", "partition"], ["partitions.topic_id", "partitions.partition"],
            name="remote_segments_partition_fkey",
        ),
        sa.CheckConstraint("start_offset >= 0 AND end_offset >= start_offset", name="remote_segments_offsets_check"),
        sa.CheckConstraint("size_bytes >= 0", name="remote_segments_size_check"),
        sa.CheckConstraint(f"state IN ({SEGMENT_STATES})", name="remote_segments_state_check"),
    )
    op.create_index(
        "remote_segments_partition_state_start", "remote_segments", ["topic_id", "partition", "state", "start_offset"]
    )
    op.create_index("remote_segments_partition_start", "remote_segments", ["topic_id", "partition", "start_offset"])

    op.create_table(
        "remote_segment_leader_epochs",
        sa.Column("segment_id", sa.Uuid, primary_key=True),
        sa.Column("leader_epoch", sa.Integer, primary_key=True),
        sa.Column("topic_id", sa.Uuid, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.Column("referenced", sa.Boolean, server_default=sa.false(), nullable=False),
        sa.Column("copied", sa.Boolean, server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(
            ["segment_id"], ["remote_segments.segment_id"], name="remote_segment_leader_epochs_segment_fkey"
        ),
    )
    op.create_index(
        "remote_segment_leader_epochs_lookup", "remote_segment_leader_epochs",
        ["topic_id", "partition", "leader_epoch", "start_offset"],
        unique=True, postgresql_where=sa.text("referenced"),
    )
    op.create_index(
        "remote_segment_leader_epochs_highest", "remote_segment_leader_epochs",
        ["topic_id", "partition", "leader_epoch", "end_offset"],
        postgresql_where=sa.text("copied"),
    )
    op.create_index(
        "remote_segment_leader_epochs_by_epoch", "remote_segment_leader_epochs", ["topic_id", "partition", "leader_epoch"]
    )

    op.create_table(
        "remote_log_events",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.clock_timestamp(), nullable=False),
        sa.Column("topic_id", sa.Uuid, nullable=True),
        sa.Column("partition", sa.Integer, nullable=True),
        sa.Column("segment_id", sa.Uuid, nullable=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("old_state", sa.Text, nullable=True),
        sa.Column("new_state", sa.Text, nullable=True),
        sa.Column("details", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
    )
    op.create_index("remote_log_events_partition", "remote_log_events", ["topic_id", "partition", "id"])
    op.create_index(
        "remote_log_events_segment", "remote_log_events", ["segment_id"],
        postgresql_where=sa.text("segment_id IS NOT NULL"),
    )

    op.create_table(
        "quota_samples",
        sa.Column("quota", sa.Text, primary_key=True),
        sa.Column("window_start_ms", sa.BigInteger, primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    for table in ("quota_samples", "remote_log_events", "remote_segment_leader_epochs", "remote_segments",
                  "partitions", "topics"):
        op.drop_table(table)
