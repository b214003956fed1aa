"""KIP-405's value types, shared by the remote storage manager, the metadata store and the copier.

Plain data, no I/O: what a remote segment is (``RemoteLogSegmentMetadata``), the files that travel
with it (``LogSegmentData``), the one place where state transitions are defined, and the errors the
tier and the store share (``RemoteStorageError``, the one ``RemoteResourceNotFoundError``).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from kts_resources.kafka.partition import HasTopicPartition, TopicPartition


class RemoteLogSegmentState(enum.Enum):
    """A remote segment's life (RemoteLogSegmentState in Kafka)."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class RemotePartitionDeleteState(enum.Enum):
    """A partition's deletion from the remote tier (RemotePartitionDeleteState in Kafka)."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


S = RemoteLogSegmentState
# COPY_SEGMENT_STARTED → DELETE_SEGMENT_STARTED is the clean-up of a failed copy; nothing else
# skips a step, and nothing goes back.
SEGMENT_TRANSITIONS: Mapping[RemoteLogSegmentState, frozenset[RemoteLogSegmentState]] = {
    S.COPY_SEGMENT_STARTED: frozenset({S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED}),
    S.COPY_SEGMENT_FINISHED: frozenset({S.DELETE_SEGMENT_STARTED}),
    S.DELETE_SEGMENT_STARTED: frozenset({S.DELETE_SEGMENT_FINISHED}),
    S.DELETE_SEGMENT_FINISHED: frozenset(),
}

P = RemotePartitionDeleteState
PARTITION_DELETE_TRANSITIONS: Mapping[RemotePartitionDeleteState | None, frozenset[RemotePartitionDeleteState]] = {
    None: frozenset({P.DELETE_PARTITION_MARKED}),
    P.DELETE_PARTITION_MARKED: frozenset({P.DELETE_PARTITION_STARTED}),
    P.DELETE_PARTITION_STARTED: frozenset({P.DELETE_PARTITION_FINISHED}),
    P.DELETE_PARTITION_FINISHED: frozenset(),
}


class RemoteStorageError(Exception):
    """A remote-tier operation failed (RemoteStorageException); the message starts with the object's
    location, ``s3://bucket/key: …`` or ``file:///root/key: …``."""


class RemoteResourceNotFoundError(RemoteStorageError, LookupError):
    """No such remote resource (RemoteResourceNotFoundException), raised by the remote tier (no such
    object, e.g. the transaction index of a segment that had none) and by the metadata store (no
    such segment, topic or topic ID) alike, so one ``except`` covers both. A RemoteStorageError as
    in Kafka, and a LookupError as the store's lookups always were."""


class InvalidStateTransition(ValueError):
    """A state change KIP-405 does not allow (e.g. FINISHED back to STARTED)."""


def check_segment_transition(current: RemoteLogSegmentState, target: RemoteLogSegmentState) -> None:
    if target not in SEGMENT_TRANSITIONS[current]:
        raise InvalidStateTransition(f"remote segment state cannot go from {current.name} to {target.name}")


def check_partition_delete_transition(current: RemotePartitionDeleteState | None, target: RemotePartitionDeleteState) -> None:
    if target not in PARTITION_DELETE_TRANSITIONS[current]:
        raise InvalidStateTransition(
            f"partition delete state cannot go from {'none' if current is None else current.name} to {target.name}"
        )


@dataclass(frozen=True, slots=True)
class TopicIdPartition(HasTopicPartition):
    """A partition named by its topic's id as well as its name: object keys and metadata use both,
    so a topic deleted and re-created under the same name never shares remote data."""

    topic_id: uuid.UUID
    topic_partition: TopicPartition


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """One copy attempt of one segment: a fresh UUID every time, so a retried copy never collides."""

    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    @classmethod
    def generate(cls, topic_id_partition: TopicIdPartition) -> "RemoteLogSegmentId":
        return cls(topic_id_partition, uuid.uuid4())


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """What the metadata store knows about one remote segment (RemoteLogSegmentMetadata in Kafka)."""

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int  # the next segment's base offset − 1
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    segment_leader_epochs: Mapping[int, int]  # epoch → first offset of that epoch in the segment; never empty
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    # Object keys and checksums, filled in by the remote storage manager's copy.
    custom_metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"remote segment offsets [{self.start_offset}, {self.end_offset}] are not a range")
        if not self.segment_leader_epochs:
            raise ValueError("a remote segment carries at least one leader epoch")

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.segment_id.topic_id_partition

    def with_state(self, state: RemoteLogSegmentState, event_timestamp_ms: int) -> "RemoteLogSegmentMetadata":
        check_segment_transition(self.state, state)
        return replace(self, state=state, event_timestamp_ms=event_timestamp_ms)


class IndexType(enum.Enum):
    """The files that travel with a segment besides its ``.log`` (RemoteStorageManager.IndexType)."""

    OFFSET = ".index"
    TIMESTAMP = ".timeindex"
    TRANSACTION = ".txnindex"
    PRODUCER_SNAPSHOT = ".snapshot"
    LEADER_EPOCH = ".leader-epoch-checkpoint"


@dataclass(frozen=True, slots=True)
class VerifiedChecksum:
    """A local file's CRC-32C as the copy's verification read it, with the file's size and
    modification time then. The upload refuses the file if either changed since, or if the bytes
    it uploads have another CRC-32C (a rolled segment never changes)."""

    crc32c: int
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The local files of one segment to copy (LogSegmentData in Kafka). The leader-epoch lineage
    travels as bytes (checkpoint text format, up to the segment's end), not as a file.
    ``log_segment_checksum``, when the caller has just verified the .log, ties the upload to the
    bytes that were verified."""

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot: Path | None
    leader_epoch_index: bytes
    log_segment_checksum: VerifiedChecksum | None = None
