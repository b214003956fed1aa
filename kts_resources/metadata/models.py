"""The remote log metadata store's tables (SQLAlchemy 2 declarative).

Migrations (``migrations/versions``) create these; the models are what the store queries, and a
test checks the two agree. States are stored by their Kafka names (``COPY_SEGMENT_FINISHED``), so
a person reading the tables with psql sees Kafka's vocabulary.

A topic's partitions and segments are keyed by the topic ID, not its name: a topic deleted and
re-created under the same name gets a new ID, and the old incarnation's rows stay apart.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kts_resources.remote_log import RemotePartitionDeleteState, RemoteLogSegmentState


def _names(enum_type) -> str:
    return ", ".join(f"'{member.name}'" for member in enum_type)


SEGMENT_STATES = _names(RemoteLogSegmentState)
PARTITION_DELETE_STATES = _names(RemotePartitionDeleteState)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONB, uuid.UUID: sa.Uuid(), dt.datetime: sa.DateTime(timezone=True)}


class Topic(Base):
    """A topic by name, its current topic ID, and its config overrides under Kafka's names."""

    __tablename__ = "topics"

    name: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    topic_id: Mapped[uuid.UUID] = mapped_column(unique=True)
    # Only the overrides, as strings, as Kafka keeps topic configs; defaults live in code.
    configs: Mapped[dict[str, Any]] = mapped_column(server_default=sa.text("'{}'::jsonb"))
    # When a kts process last saw the topic in a log dir (NULL: not yet since revision 0004).
    last_seen_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.now())


class Partition(Base):
    """One partition of one topic incarnation: log start offset, highest copied offset, delete state."""

    __tablename__ = "partitions"

    topic_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    partition: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    # The name the topic had when this ID was current (old incarnations are gone from `topics`).
    topic: Mapped[str] = mapped_column(sa.Text)
    log_start_offset: Mapped[int] = mapped_column(sa.BigInteger, server_default=sa.text("0"))
    highest_copied_offset: Mapped[int] = mapped_column(sa.BigInteger, server_default=sa.text("-1"))
    delete_state: Mapped[str | None] = mapped_column(sa.Text)
    updated_at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.now())
    # The local log start offset when kts first looked at the partition (NULL: not yet): data
    # below it was gone before kts could copy it, so it is never counted as lost.
    first_observed_offset: Mapped[int | None] = mapped_column(sa.BigInteger)
    # The partition's current leader-epoch lineage, [[epoch, start offset], ...] (NULL: none
    # recorded yet): the newest any replica's kts saw (kts_resources/tiering/lineage.py, migration 0007).
    leader_epochs: Mapped[list[Any] | None] = mapped_column(JSONB, nullable=True)

    __table_args__ = (
        sa.CheckConstraint("partition >= 0", name="partitions_partition_check"),
        sa.CheckConstraint(f"delete_state IN ({PARTITION_DELETE_STATES})", name="partitions_delete_state_check"),
    )


class RemoteSegment(Base):
    """One copy attempt of one segment (RemoteLogSegmentMetadata): a fresh UUID per attempt."""

    __tablename__ = "remote_segments"

    segment_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    topic_id: Mapped[uuid.UUID] = mapped_column()
    partition: Mapped[int] = mapped_column(sa.Integer)
    start_offset: Mapped[int] = mapped_column(sa.BigInteger)
    end_offset: Mapped[int] = mapped_column(sa.BigInteger)
    max_timestamp_ms: Mapped[int] = mapped_column(sa.BigInteger)
    size_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    # {"<epoch>": first offset of that epoch in the segment}; JSON keys are strings.
    leader_epochs: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(sa.Text)
    broker_id: Mapped[int] = mapped_column(sa.Integer)
    event_timestamp_ms: Mapped[int] = mapped_column(sa.BigInteger)
    # Object keys and checksums, as the remote storage manager reports them.
    custom_metadata: Mapped[dict[str, Any]] = mapped_column(server_default=sa.text("'{}'::jsonb"))
    created_at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.now())
    # What was found wrong with the segment's objects in the tier (NULL: nothing); the next copy
    # pass re-copies it from the local segment while that exists (copier.recopy_damaged).
    damage: Mapped[str | None] = mapped_column(sa.Text)
    damage_found_at: Mapped[dt.datetime | None] = mapped_column()

    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["topic_id", "partition"], ["partitions.topic_id", "partitions.partition"],
            name="remote_segments_partition_fkey",
        ),
        sa.CheckConstraint("start_offset >= 0 AND end_offset >= start_offset", name="remote_segments_offsets_check"),
        sa.CheckConstraint("size_bytes >= 0", name="remote_segments_size_check"),
        sa.CheckConstraint(f"state IN ({SEGMENT_STATES})", name="remote_segments_state_check"),
        sa.Index("remote_segments_partition_state_start", "topic_id", "partition", "state", "start_offset"),
        sa.Index("remote_segments_partition_start", "topic_id", "partition", "start_offset"),
        sa.Index("remote_segments_damaged", "topic_id", "partition", "start_offset",
                 postgresql_where=sa.text("damage IS NOT NULL")),
        # Finished segments whose manifest is not recorded (migration 0006): empty in steady state.
        sa.Index("remote_segments_without_manifest", "topic_id", "partition", "start_offset",
                 postgresql_where=sa.text("state = 'COPY_SEGMENT_FINISHED' AND NOT (custom_metadata ? 'manifest.key')")),
    )


class RemoteSegmentLeaderEpoch(Base):
    """One leader epoch of one remote segment: the store's form of Kafka's per-epoch state
    (RemoteLogLeaderEpochState). ``referenced`` rows are the epoch's offset → segment map that
    lookups search; ``copied`` rows (ever COPY_SEGMENT_FINISHED) give the epoch's highest offset.
    """

    __tablename__ = "remote_segment_leader_epochs"

    segment_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("remote_segments.segment_id", name="remote_segment_leader_epochs_segment_fkey"),
        primary_key=True,
    )
    leader_epoch: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    topic_id: Mapped[uuid.UUID] = mapped_column()
    partition: Mapped[int] = mapped_column(sa.Integer)
    start_offset: Mapped[int] = mapped_column(sa.BigInteger)  # the epoch's first offset in the segment
    end_offset: Mapped[int] = mapped_column(sa.BigInteger)  # the epoch's last offset in the segment
    referenced: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())
    copied: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())

    __table_args__ = (
        # At most one segment answers for an (epoch, start offset), as in Kafka's offset map.
        sa.Index(
            "remote_segment_leader_epochs_lookup", "topic_id", "partition", "leader_epoch", "start_offset",
            unique=True, postgresql_where=sa.text("referenced"),
        ),
        sa.Index(
            "remote_segment_leader_epochs_highest", "topic_id", "partition", "leader_epoch", "end_offset",
            postgresql_where=sa.text("copied"),
        ),
        sa.Index("remote_segment_leader_epochs_by_epoch", "topic_id", "partition", "leader_epoch"),
    )


class LostRange(Base):
    """Offsets deleted locally before they reached the remote tier (the data-loss alarm): open
    until a person acknowledges them, kept afterwards as the record of what was lost."""

    __tablename__ = "lost_ranges"

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(always=True), primary_key=True)
    topic_id: Mapped[uuid.UUID] = mapped_column()
    partition: Mapped[int] = mapped_column(sa.Integer)
    start_offset: Mapped[int] = mapped_column(sa.BigInteger)
    end_offset: Mapped[int] = mapped_column(sa.BigInteger)  # inclusive
    detected_at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.now())
    how_found: Mapped[str] = mapped_column(sa.Text)
    acknowledged_by: Mapped[str | None] = mapped_column(sa.Text)
    acknowledged_at: Mapped[dt.datetime | None] = mapped_column()
    reason: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["topic_id", "partition"], ["partitions.topic_id", "partitions.partition"],
            name="lost_ranges_partition_fkey",
        ),
        sa.CheckConstraint("start_offset >= 0 AND end_offset >= start_offset", name="lost_ranges_offsets_check"),
        sa.CheckConstraint("(acknowledged_by IS NULL) = (acknowledged_at IS NULL)", name="lost_ranges_acknowledged_check"),
        sa.UniqueConstraint("topic_id", "partition", "start_offset", "end_offset", name="lost_ranges_range_key"),
    )


class RemoteLogEvent(Base):
    """The append-only log of every change, written in the same transaction as the change."""

    __tablename__ = "remote_log_events"

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(always=True), primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(server_default=sa.func.clock_timestamp())
    topic_id: Mapped[uuid.UUID | None] = mapped_column()
    partition: Mapped[int | None] = mapped_column(sa.Integer)
    segment_id: Mapped[uuid.UUID | None] = mapped_column()
    kind: Mapped[str] = mapped_column(sa.Text)
    old_state: Mapped[str | None] = mapped_column(sa.Text)
    new_state: Mapped[str | None] = mapped_column(sa.Text)
    details: Mapped[dict[str, Any]] = mapped_column(server_default=sa.text("'{}'::jsonb"))

    __table_args__ = (
        sa.Index("remote_log_events_partition", "topic_id", "partition", "id"),
        sa.Index("remote_log_events_segment", "segment_id", postgresql_where=sa.text("segment_id IS NOT NULL")),
    )


# KIP-956 copy-quota samples shared by concurrent copy processes (the quota module owns its use).
quota_samples = sa.Table(
    "quota_samples",
    Base.metadata,
    sa.Column("quota", sa.Text, primary_key=True),
    sa.Column("window_start_ms", sa.BigInteger, primary_key=True),
    sa.Column("bytes", sa.BigInteger, nullable=False),
)

# Broker-level settings shared by every kts process (the KIP-956 quotas), by Kafka's config names.
broker_configs = sa.Table(
    "broker_configs",
    Base.metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

# The users `kts serve` authenticates over SASL/SCRAM: each one's salted credential per mechanism
# (metadata/credentials.py owns its use), never a password.
scram_credentials = sa.Table(
    "scram_credentials",
    Base.metadata,
    sa.Column("user_name", sa.Text, primary_key=True),
    sa.Column("mechanism", sa.Text, primary_key=True),
    sa.Column("salt", sa.LargeBinary, nullable=False),
    sa.Column("stored_key", sa.LargeBinary, nullable=False),
    sa.Column("server_key", sa.LargeBinary, nullable=False),
    sa.Column("iterations", sa.Integer, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

# Consumer groups' committed offsets (OffsetCommit / OffsetFetch of `kts serve`; group_offsets.py owns their use).
group_offsets = sa.Table(
    "group_offsets",
    Base.metadata,
    sa.Column("group_id", sa.Text, primary_key=True),
    sa.Column("topic", sa.Text, primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("committed_offset", sa.BigInteger, nullable=False),
    sa.Column("leader_epoch", sa.Integer, nullable=False, server_default=sa.text("-1")),
    sa.Column("metadata", sa.Text, nullable=True),
    sa.Column("committed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

class VerifiedObject(NamedTuple):
    """A tier object whose bytes were read and matched ``crc32c``, when the tier listed it at
    ``size`` and version ``tag`` (``ObjectInfo.tag``)."""

    segment_id: uuid.UUID
    key: str
    size: int
    tag: str
    crc32c: int


# Tier objects whose bytes were read and matched their recorded CRC-32C, with the version the
# tier listed them at (a file's inode and times, S3's ETag): the routine bucket check reads an
# object again only when it changed since (maintenance/verified_objects.py owns their use).
verified_objects = sa.Table(
    "verified_objects",
    Base.metadata,
    sa.Column("segment_id", sa.Uuid, sa.ForeignKey("remote_segments.segment_id", ondelete="CASCADE"), primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("tag", sa.Text, nullable=False),
    sa.Column("crc32c", sa.BigInteger, nullable=False),
    sa.Column("verified_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

metadata = Base.metadata
