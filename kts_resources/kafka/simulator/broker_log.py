"""A broker-like writer for Kafka log dirs: the files a partition leader writes, byte for byte.

:class:`PartitionLog` drives one partition directory the way Kafka's UnifiedLog / LocalLog /
LogSegment drive it on the leader:

- ``append`` assigns the base offset (the log end offset) and the partition leader epoch, rolls
  first when ``LogSegment.shouldRoll`` says so, appends to the active segment's ``.log`` and
  maintains its ``.index`` / ``.timeindex`` entry by entry (files preallocated to
  ``segment.index.bytes`` and zero-filled past the last entry, as the broker maps them);
- a roll appends the final time-index entry, trims both index files, writes the producer
  snapshot at the new segment's base offset and opens the next segment;
- a new leader epoch is appended to ``leader-epoch-checkpoint``; producer state (sequences,
  epochs, open transactions) is tracked as ProducerStateManager does, and an ABORT marker appends
  an ``AbortedTxn`` to the marker's segment's ``.txnindex`` with Kafka's last stable offset;
  snapshots list the producers in the broker's HashMap order;
- ``delete_old_segments`` applies the log-start-offset, retention.bytes and retention.ms rules
  as UnifiedLog.deleteOldSegments does (the active segment too, once the high watermark reaches
  the log end offset).

:class:`BrokerLogDir` owns the log dir root: ``meta.properties``, each partition's
``partition.metadata`` and the three offset checkpoints.

The state modelled is a RUNNING broker's: the active segment's indexes stay preallocated, the
recovery point is the active segment's base offset (the broker flushes up to it on roll), and
there is no clean-shutdown snapshot at the log end offset. Batches and txn index entries are
written through at once, as Kafka's FileChannel writes are. Reopening continues that running
broker seamlessly (the same calls then write the same bytes as without the reopen), rather
than replaying a restart's side effects (see :meth:`PartitionLog.open`). Nothing reads the wall
clock: every time comes from the caller (batch timestamps, ``now_ms``), so the same calls write
the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


from ..checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    META_PROPERTIES,
    PARTITION_METADATA,
    PARTITION_METADATA_VERSION,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    MissingCheckpointError,
    PartitionMetadata,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
    topic_id_to_base64,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)
from ..errors import CheckpointError
from ..files import mapped, write_atomically
from ..indexes import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    DEFAULT_SEGMENT_INDEX_BYTES,
    OFFSET_ENTRY_SIZE,
    TIME_ENTRY_SIZE,
    OffsetPosition,
    SegmentIndexer,
    TimestampOffset,
    encode_offset_index,
    encode_time_index,
    largest_timestamp,
    last_time_index_entry,
    preallocated_size,
    read_offset_index,
    read_time_index,
)
from ..logdir import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PRODUCER_SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    PartitionDir,
    discover_partitions,
    list_producer_snapshots,
    list_segments,
    offset_file_name,
)
from ..partition import TopicPartition
from ..records import (
    ATTR_TIMESTAMP_TYPE,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    NO_TIMESTAMP,
    BatchHeader,
    decode_batch,
    parse_control_record,
    restamp_batch,
    scan_batches,
    with_base_offset_and_epoch,
)
from ..snapshots import (
    NO_TXN_FIRST_OFFSET,
    TXN_INDEX_ENTRY_SIZE,
    AbortedTxn,
    ProducerSnapshotEntry,
    encode_aborted_txns,
    read_producer_snapshot,
    read_txn_index,
    write_producer_snapshot,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Kafka's topic-config defaults.
DEFAULT_SEGMENT_BYTES = 1 * GiB  # segment.bytes
DEFAULT_SEGMENT_MS = 7 * 24 * 3600 * 1000  # segment.ms
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 3600 * 1000  # producer.id.expiration.ms (broker)
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12  # max.message.bytes: the largest batch a leader accepts
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS = 10 * 60 * 1000  # producer.id.expiration.check.interval.ms

NO_SEQUENCE = -1
NO_PRODUCER_EPOCH = -1
UNDEFINED_EPOCH = -1  # OffsetsForLeaderEpoch's "no such epoch"
UNDEFINED_EPOCH_OFFSET = -1
_INT32_MAX = 2**31 - 1
_SEQUENCE_MODULUS = 2**31  # sequences wrap from Integer.MAX_VALUE to 0


# --- configuration and results ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The configs that shape a partition's files; Kafka's names with ``.`` as ``_``."""

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int = DEFAULT_SEGMENT_MS
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        if not 1 <= self.segment_bytes <= _INT32_MAX:
            raise ValueError(f"segment.bytes must be 1..{_INT32_MAX}, not {self.segment_bytes}")
        if self.segment_ms < 1:
            raise ValueError(f"segment.ms must be at least 1, not {self.segment_ms}")
        if self.index_interval_bytes < 0:
            raise ValueError(f"index.interval.bytes must not be negative, not {self.index_interval_bytes}")
        # The time index keeps its last slot for the roll's entry, so it needs two.
        if not 2 * TIME_ENTRY_SIZE <= self.segment_index_bytes <= _INT32_MAX:
            raise ValueError(f"segment.index.bytes must be {2 * TIME_ENTRY_SIZE}..{_INT32_MAX}, not {self.segment_index_bytes}")
        if self.max_message_bytes < 0:
            raise ValueError(f"max.message.bytes must not be negative, not {self.max_message_bytes}")
        if self.producer_id_expiration_ms < 1:
            raise ValueError(f"producer.id.expiration.ms must be at least 1, not {self.producer_id_expiration_ms}")


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where one appended batch went (Kafka's LogAppendInfo, trimmed to what callers use)."""

    base_offset: int
    last_offset: int
    position: int  # byte position in the segment's .log
    size: int
    segment_base_offset: int
    rolled: bool  # a new segment was started for this batch
    max_timestamp: int
    aborted_txn: AbortedTxn | None = None  # set when this was an ABORT marker closing a transaction


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """A segment as the log sees it; ``largest_timestamp`` is NO_TIMESTAMP when it has none."""

    base_offset: int
    next_offset: int  # the next segment's base offset, or the log end offset for the active one
    size: int
    largest_timestamp: int
    active: bool


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction closed by a marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


# --- producer state -----------------------------------------------------------------------------


def next_sequence(sequence: int, increment: int = 1) -> int:
    """``DefaultRecordBatch.incrementSequence``: sequences wrap from Integer.MAX_VALUE to 0."""
    return (sequence + increment) % _SEQUENCE_MODULUS


@dataclass(slots=True)
class _Producer:
    """One producer id's state (ProducerStateEntry, keeping only the last batch's metadata)."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_sequence: int = NO_SEQUENCE
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = NO_TIMESTAMP
    coordinator_epoch: int = -1
    current_txn_first_offset: int = NO_TXN_FIRST_OFFSET

    def maybe_update_epoch(self, epoch: int) -> None:
        # A new epoch forgets the batch metadata (ProducerStateEntry.maybeUpdateProducerEpoch).
        if epoch != self.producer_epoch:
            self.producer_epoch = epoch
            self.last_sequence = NO_SEQUENCE
            self.last_offset = -1
            self.offset_delta = 0

    def to_entry(self) -> ProducerSnapshotEntry:
        return ProducerSnapshotEntry(
            self.producer_id, self.producer_epoch, self.last_sequence, self.last_offset,
            self.offset_delta, self.timestamp, self.coordinator_epoch, self.current_txn_first_offset,
        )

    @classmethod
    def from_entry(cls, e: ProducerSnapshotEntry) -> _Producer:
        return cls(
            e.producer_id, e.producer_epoch, e.last_sequence, e.last_offset,
            e.offset_delta, e.timestamp, e.coordinator_epoch, e.current_txn_first_offset,
        )


class JavaLongHashMapOrder:
    """The iteration order of a ``java.util.HashMap<Long, …>`` holding these keys.

    ProducerStateManager keeps its producers in a HashMap and writes a snapshot by iterating it,
    so the entries of a ``.snapshot`` file come in that order, not by producer id. The order is:
    bucket by bucket (bucket = the spread Long hash masked by the table size), and within a bucket
    in insertion order. The table starts at 16 buckets when the first key goes in and doubles
    when the size passes 0.75 × the table, or when a bucket reaches 9 keys while the table has
    fewer than 64 buckets; a resize keeps each bucket's relative order; removing keys and
    ``clear`` never shrink it. Not modelled: a bucket of 9+ keys in a table of 64+ buckets
    (Java turns it into a tree), which producer ids would have to be chosen to provoke.
    """

    _INITIAL_CAPACITY = 16
    _TREEIFY_THRESHOLD = 8
    _MIN_TREEIFY_CAPACITY = 64

    def __init__(self) -> None:
        self._table: list[list[int]] = []  # allocated on the first put, as Java does
        self._size = 0

    @staticmethod
    def spread_hash(key: int) -> int:
        """``HashMap.hash(Long.valueOf(key))``: Long.hashCode folded, then its high half mixed in."""
        k = key & 0xFFFF_FFFF_FFFF_FFFF
        h = (k ^ (k >> 32)) & 0xFFFF_FFFF
        return h ^ (h >> 16)

    @property
    def capacity(self) -> int:
        return len(self._table)

    def _bucket(self, key: int) -> list[int]:
        return self._table[self.spread_hash(key) & (len(self._table) - 1)]

    def _resize(self) -> None:
        capacity = 2 * len(self._table) if self._table else self._INITIAL_CAPACITY
        old, self._table = self._table, [[] for _ in range(capacity)]
        for bucket in old:
            for key in bucket:
                self._bucket(key).append(key)

    def put(self, key: int) -> None:
        if not self._table:
            self._resize()
        bucket = self._bucket(key)
        if key in bucket:
            return  # a new value for a present key keeps its place
        bucket.append(key)
        if len(bucket) > self._TREEIFY_THRESHOLD and len(self._table) < self._MIN_TREEIFY_CAPACITY:
            self._resize()  # treeifyBin resizes a small table instead
        self._size += 1
        if self._size > len(self._table) * 3 // 4:
            self._resize()

    def remove(self, key: int) -> None:
        if self._table:
            bucket = self._bucket(key)
            if key in bucket:
                bucket.remove(key)
                self._size -= 1

    def clear(self) -> None:
        for bucket in self._table:
            bucket.clear()
        self._size = 0

    def __iter__(self) -> Iterator[int]:
        for bucket in self._table:
            yield from bucket

    def __len__(self) -> int:
        return self._size


class ProducerStateManager:
    """Producer ids, their sequences and open transactions for one partition (ProducerStateManager)."""

    def __init__(self) -> None:
        self._producers: dict[int, _Producer] = {}
        # Where each producer sits in the broker's HashMap: the order a snapshot lists them in.
        self._order = JavaLongHashMapOrder()
        # Open transactions by first offset; appends only grow offsets, so insertion order is
        # offset order (load() sorts), which is what the last stable offset needs.
        self._ongoing: dict[int, int] = {}

    # -- reading --

    def entry(self, producer_id: int) -> ProducerSnapshotEntry | None:
        p = self._producers.get(producer_id)
        return None if p is None else p.to_entry()

    def entries(self) -> list[ProducerSnapshotEntry]:
        """Every producer's state in the order a snapshot lists them: the iteration order of
        ProducerStateManager's HashMap (see :class:`JavaLongHashMapOrder`), not producer-id order."""
        return [self._producers[pid].to_entry() for pid in self._order]

    @property
    def ongoing_transactions(self) -> dict[int, int]:
        """First offset → producer id of every open transaction, by first offset."""
        return dict(self._ongoing)

    def first_unstable_offset(self) -> int | None:
        return next(iter(self._ongoing), None)

    # -- loading --

    def load(self, entries: list[ProducerSnapshotEntry]) -> None:
        """Start from a snapshot's entries, put into a fresh map in file order (as a broker
        loading the snapshot does, so the order within each bucket survives)."""
        self._producers = {e.producer_id: _Producer.from_entry(e) for e in entries}
        self._order = JavaLongHashMapOrder()
        for e in entries:
            self._order.put(e.producer_id)
        open_txns = sorted((p.current_txn_first_offset, p.producer_id) for p in self._producers.values() if p.current_txn_first_offset >= 0)
        self._ongoing = dict(open_txns)

    # -- appending --

    def check(self, header: BatchHeader, marker: TxnMarker | None = None) -> None:
        """Reject what the leader would reject (ProducerAppendInfo: fenced producer epoch, sequence
        gap, mixed txn writes, a marker from a fenced coordinator).

        An unknown producer is accepted with any sequence: it may have expired, and Kafka's
        leader cannot tell that from a new producer here either. A known producer whose epoch has
        no batches yet (a marker bumped it) must start at sequence 0. Data with no sequence comes
        from a coordinator (AppendOrigin.COORDINATOR: transactional offset commits) and, like
        markers, gets the epoch check only.
        """
        pid = header.producer_id
        if pid < 0:
            if header.is_transactional or header.is_control:
                raise ValueError("a transactional or control batch needs a producer id")
            return
        p = self._producers.get(pid)
        if p is None:
            return
        if header.producer_epoch < p.producer_epoch:
            raise ValueError(f"producer {pid} is fenced: epoch {header.producer_epoch} is older than {p.producer_epoch}")
        if header.is_control:
            if marker is not None and marker.coordinator_epoch < p.coordinator_epoch:
                raise ValueError(
                    f"producer {pid}: marker from coordinator epoch {marker.coordinator_epoch}, older than {p.coordinator_epoch}"
                )
            return
        if header.base_sequence == NO_SEQUENCE:
            pass  # only a coordinator writes data with no sequence (transactional offset commits): no check
        elif header.producer_epoch != p.producer_epoch:
            if header.base_sequence != 0 and p.producer_epoch != NO_PRODUCER_EPOCH:
                raise ValueError(f"producer {pid}: a new epoch {header.producer_epoch} must start at sequence 0, not {header.base_sequence}")
        elif p.producer_epoch != NO_PRODUCER_EPOCH and header.base_sequence != next_sequence(p.last_sequence):
            raise ValueError(
                f"producer {pid}: out-of-order sequence {header.base_sequence}, expected {next_sequence(p.last_sequence)}"
            )
        if p.current_txn_first_offset >= 0 and not header.is_transactional:
            raise ValueError(f"producer {pid} wrote a non-transactional batch inside its open transaction")

    def update(self, header: BatchHeader, marker: TxnMarker | None = None) -> CompletedTxn | None:
        """Apply one appended batch (offsets assigned); a marker returns the transaction it closes."""
        pid = header.producer_id
        if pid < 0:
            return None
        p = self._producers.get(pid)
        if p is None:
            p = self._producers[pid] = _Producer(pid)
            self._order.put(pid)
        if header.is_control:
            if marker is None:
                return None  # an empty control batch: its transaction was cleaned away
            completed = None
            # Only a transaction with data closes; an empty one leaves no trace in the txn index.
            if p.current_txn_first_offset >= 0:
                completed = CompletedTxn(pid, p.current_txn_first_offset, header.base_offset, marker.type == CONTROL_ABORT)
            p.maybe_update_epoch(header.producer_epoch)
            p.coordinator_epoch = marker.coordinator_epoch
            p.current_txn_first_offset = NO_TXN_FIRST_OFFSET
            # The marker RECORD's timestamp (ProducerAppendInfo.appendEndTxnMarker), not the batch's.
            p.timestamp = marker.timestamp
            return completed
        p.maybe_update_epoch(header.producer_epoch)
        # RecordBatch.lastSequence: no sequence stays no sequence.
        if header.base_sequence == NO_SEQUENCE:
            p.last_sequence = NO_SEQUENCE
        else:
            p.last_sequence = next_sequence(header.base_sequence, header.last_offset_delta)
        p.last_offset = header.last_offset
        p.offset_delta = header.last_offset_delta
        p.timestamp = header.max_timestamp
        if header.is_transactional and p.current_txn_first_offset < 0:
            p.current_txn_first_offset = header.base_offset
            self._ongoing[header.base_offset] = pid
        return None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO recorded with a completed transaction: the first offset of the earliest open
        transaction of ANOTHER producer, else the offset after the marker."""
        for first_offset, pid in self._ongoing.items():
            if pid != completed.producer_id:
                return first_offset
        return completed.last_offset + 1

    def complete(self, completed: CompletedTxn) -> None:
        if self._ongoing.pop(completed.first_offset, None) is None:
            raise ValueError(f"transaction of producer {completed.producer_id} at {completed.first_offset} was not open")

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle for ``producer.id.expiration.ms`` with no open transaction."""
        expired = [
            pid for pid, p in self._producers.items()
            if p.current_txn_first_offset < 0 and now_ms - p.timestamp >= expiration_ms
        ]
        for pid in expired:
            del self._producers[pid]
            self._order.remove(pid)
        return sorted(expired)


# --- leader epochs ------------------------------------------------------------------------------


class LeaderEpochCache:
    """The epoch lineage behind ``leader-epoch-checkpoint`` (LeaderEpochFileCache)."""

    def __init__(self, path: Path, entries: list[EpochEntry]):
        self._path = path
        self._entries = list(entries)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; written at once, as Kafka does."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        latest = self._entries[-1] if self._entries else None
        if latest is not None and latest.epoch == epoch and start_offset >= latest.start_offset:
            return False
        # Entries at or after the new one (by epoch or by offset) are superseded.
        self._entries = [e for e in self._entries if e.epoch < epoch and e.start_offset < start_offset]
        self._entries.append(EpochEntry(epoch, start_offset))
        self.write()
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """LeaderEpochFileCache.endOffsetFor: (the largest epoch at or below ``requested_epoch``, the
        offset where the next higher epoch starts, or the log end offset for the latest epoch).

        The answer to OffsetsForLeaderEpoch, which a follower uses to find where its log diverges.
        An epoch below every entry answers itself with the first entry's start offset; one above
        every entry, or UNDEFINED_EPOCH, answers (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
        """
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._entries and self._entries[-1].epoch == requested_epoch:
            return requested_epoch, log_end_offset
        higher = next((e for e in self._entries if e.epoch > requested_epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = [e for e in self._entries if e.epoch <= requested_epoch]
        return (floor[-1].epoch if floor else requested_epoch), higher.start_offset

    def clear(self) -> None:
        """Forget every entry (a log truncated fully: UnifiedLog.truncateFullyAndStartAt)."""
        self._entries = []
        self.write()

    def truncate_from_end(self, end_offset: int) -> None:
        """The log ends at ``end_offset``: entries starting at or after it go (no batch has them)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self.write()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start offset moved: entries at or before it collapse into one starting there."""
        removed = [e for e in self._entries if e.start_offset <= start_offset]
        if not removed:
            return
        kept = [e for e in self._entries if e.start_offset > start_offset]
        self._entries = [EpochEntry(removed[-1].epoch, start_offset), *kept]
        self.write()

    def write(self) -> None:
        write_leader_epoch_checkpoint(self._path, self._entries)


# --- files --------------------------------------------------------------------------------------


def with_log_append_time(batch: bytes, log_append_time: int) -> bytes:
    """Stamp a magic-2 batch LogAppendTime as the broker does: the timestamp-type bit and
    maxTimestamp change (records keep their deltas), so the CRC is recomputed."""
    return restamp_batch(batch, add_attributes=ATTR_TIMESTAMP_TYPE, max_timestamp=log_append_time)


def _parse_one_batch(batch: bytes, *, verify_crc: bool = False) -> BatchHeader:
    scan = scan_batches(batch, verify_crc=verify_crc)
    if len(scan.batches) != 1 or scan.invalid is not None or scan.batches[0].magic != 2:
        raise ValueError("append takes exactly one whole magic-2 record batch")
    if verify_crc and scan.batches[0].crc_ok is False:
        # UnifiedLog.analyzeAndValidateRecords' CorruptRecordException.
        raise ValueError("the batch is corrupt: its CRC does not match")
    return scan.batches[0]


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT/ABORT marker as ProducerAppendInfo reads it: its type, coordinator epoch and the
    marker record's own timestamp."""

    type: int
    coordinator_epoch: int
    timestamp: int


def _transaction_marker(data: bytes | memoryview, header: BatchHeader) -> TxnMarker | None:
    """The COMMIT/ABORT marker a control batch holds; None for an empty batch or another control type."""
    records = decode_batch(data, header, verify_crc=False)
    if not records:
        return None
    control = parse_control_record(records[0])
    if control.type not in (CONTROL_ABORT, CONTROL_COMMIT) or control.coordinator_epoch is None:
        return None
    return TxnMarker(control.type, control.coordinator_epoch, records[0].timestamp)


def _write_fully(f: BinaryIO, data: bytes) -> None:
    """Write through at once, as Kafka's FileChannel writes do: a reader of the directory sees
    every appended batch (and its txn index entry) as soon as its index entries point at it."""
    view = memoryview(data)
    while view:
        view = view[f.write(view):]


def _rename_deleted(path: Path) -> Path:
    """Kafka renames a file to ``<name>.deleted`` before removing it, so readers never see half a delete."""
    target = path.with_name(path.name + DELETED_SUFFIX)
    os.replace(path, target)
    return target


class _ActiveSegment:
    """The segment being appended to: its .log, its preallocated indexes, its lazy .txnindex."""

    def __init__(self, directory: Path, base_offset: int, config: LogConfig):
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.indexer = SegmentIndexer(base_offset, config.index_interval_bytes)
        self.size = 0
        self.next_offset = base_offset
        # The first batch's max timestamp: LogSegment's rollingBasedTimestamp for segment.ms.
        self.first_batch_timestamp: int | None = None
        self._offset_prealloc = preallocated_size(config.segment_index_bytes, OFFSET_ENTRY_SIZE)
        self._time_prealloc = preallocated_size(config.segment_index_bytes, TIME_ENTRY_SIZE)
        self._log: BinaryIO | None = None
        self._offset_fd = -1
        self._time_fd = -1
        self._txn: BinaryIO | None = None

    def path(self, suffix: str) -> Path:
        return self.directory / offset_file_name(self.base_offset, suffix)

    # -- opening --

    @classmethod
    def create(cls, directory: Path, base_offset: int, config: LogConfig) -> _ActiveSegment:
        seg = cls(directory, base_offset, config)
        seg.path(LOG_SUFFIX).touch(exist_ok=False)
        seg._open_files()
        seg._write_indexes()
        return seg

    @classmethod
    def recover(cls, directory: Path, base_offset: int, config: LogConfig) -> _ActiveSegment:
        """Reopen the last segment as LogSegment.recover does: rescan its batches, truncate
        anything after the last whole valid batch, rebuild and re-preallocate its indexes."""
        seg = cls(directory, base_offset, config)
        log_path = seg.path(LOG_SUFFIX)
        with mapped(log_path) as view:
            scan = scan_batches(view, verify_crc=True)
            valid = scan.valid_bytes
            for b in scan.batches:
                if b.crc_ok is False:
                    valid = b.position
                    break
                seg.indexer.append_batch(b.position, b.size, b.last_offset, b.max_timestamp)
                if seg.first_batch_timestamp is None:
                    seg.first_batch_timestamp = b.max_timestamp
                seg.next_offset = b.last_offset + 1
            total = len(view)
        if valid < total:
            os.truncate(log_path, valid)
        seg.size = valid
        seg._open_files()
        seg._write_indexes()
        return seg

    @classmethod
    def truncated(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        target: int,
        offset_entries: list[OffsetPosition],
        time_entries: list[TimestampOffset],
    ) -> _ActiveSegment:
        """The segment holding ``target`` cut there, to be the active one (LogSegment.truncateTo).

        Its index entries are the ones it had (``offset_entries`` / ``time_entries``) below the
        target, not a rebuild: the broker cuts its index files, it does not re-derive them. The
        indexes are preallocated again, the byte count towards the next index entry restarts at
        0, the largest timestamp is the remaining batches' largest, and ``.txnindex`` entries
        whose last offset is at or past the target go. ValueError when the target falls inside
        a batch: a replica truncates only at batch boundaries (epoch starts, log end offsets).
        """
        seg = cls(directory, base_offset, config)
        log_path = seg.path(LOG_SUFFIX)
        with mapped(log_path) as view:
            for b in scan_batches(view, verify_crc=False).batches:
                if b.base_offset >= target:
                    break
                if b.last_offset >= target:
                    raise ValueError(f"{log_path}: offset {target} is inside the batch {b.base_offset}..{b.last_offset}")
                seg.size = b.position + b.size
                seg.next_offset = b.next_offset
                if seg.first_batch_timestamp is None:
                    seg.first_batch_timestamp = b.max_timestamp
                if b.max_timestamp > seg.indexer.max_timestamp_so_far:
                    seg.indexer.max_timestamp_so_far = b.max_timestamp
                    seg.indexer.offset_of_max_timestamp_so_far = b.last_offset
        os.truncate(log_path, seg.size)
        seg.indexer.offset_entries = [e for e in offset_entries if e.offset < target]
        seg.indexer.time_entries = [e for e in time_entries if e.offset < target]
        txn_path = seg.path(TXN_INDEX_SUFFIX)
        if txn_path.exists():
            # TransactionIndex.truncateTo: cut at the first entry ending at or past the target.
            kept = 0
            for txn in read_txn_index(txn_path):
                if txn.last_offset >= target:
                    break
                kept += 1
            os.truncate(txn_path, kept * TXN_INDEX_ENTRY_SIZE)
        seg._open_files()
        seg._write_indexes()
        return seg

    def _open_files(self) -> None:
        self._log = open(self.path(LOG_SUFFIX), "ab", buffering=0)
        self._offset_fd = os.open(self.path(INDEX_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)
        self._time_fd = os.open(self.path(TIME_INDEX_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)

    def _write_indexes(self) -> None:
        # Zero the files, preallocate them sparse, then lay the entries at the front.
        for fd, prealloc, data in (
            (self._offset_fd, self._offset_prealloc, encode_offset_index(self.indexer.offset_entries, self.base_offset)),
            (self._time_fd, self._time_prealloc, encode_time_index(self.indexer.time_entries, self.base_offset)),
        ):
            os.ftruncate(fd, 0)
            os.ftruncate(fd, prealloc)
            if data:
                os.pwrite(fd, data, 0)

    # -- appending --

    def should_roll(self, batch_size: int, max_timestamp: int, last_offset: int) -> bool:
        """LogSegment.shouldRoll (rollJitterMs = 0)."""
        if self.size == 0:
            # Rolling an empty segment recreates it at the same offset: nothing changes.
            return False
        if self.size > self.config.segment_bytes - batch_size:
            return True
        # Kafka falls back to the segment's creation time on the wall clock when the first batch
        # has no timestamp; a simulated log never reads the wall clock, so it just does not roll.
        if self.first_batch_timestamp is not None and self.first_batch_timestamp >= 0:
            if max_timestamp - self.first_batch_timestamp > self.config.segment_ms:
                return True
        if self.indexer.is_full(self.config.segment_index_bytes):
            return True
        return not 0 <= last_offset - self.base_offset <= _INT32_MAX

    def append(self, batch: bytes, last_offset: int, max_timestamp: int) -> int:
        assert self._log is not None
        position = self.size
        _write_fully(self._log, batch)
        self.size += len(batch)
        self.next_offset = last_offset + 1
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = max_timestamp
        offset_entry, time_entry = self.indexer.append_batch(position, len(batch), last_offset, max_timestamp)
        if offset_entry is not None:
            slot = len(self.indexer.offset_entries) - 1
            os.pwrite(self._offset_fd, encode_offset_index([offset_entry], self.base_offset), slot * OFFSET_ENTRY_SIZE)
        if time_entry is not None:
            self._write_time_entry(time_entry)
        return position

    def _write_time_entry(self, entry: TimestampOffset) -> None:
        slot = len(self.indexer.time_entries) - 1
        os.pwrite(self._time_fd, encode_time_index([entry], self.base_offset), slot * TIME_ENTRY_SIZE)

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        if self._txn is None:
            # Created on the first aborted transaction only (TransactionIndex opens lazily);
            # unbuffered, like the .log, so the entry is on disk when append returns.
            self._txn = open(self.path(TXN_INDEX_SUFFIX), "ab", buffering=0)
        _write_fully(self._txn, encode_aborted_txns([txn]))

    # -- closing --

    def roll(self) -> int:
        """onBecomeInactiveSegment: final time entry, trimmed indexes; returns the largest timestamp."""
        final = self.indexer.close()
        if final is not None:
            self._write_time_entry(final)
        os.ftruncate(self._offset_fd, len(self.indexer.offset_entries) * OFFSET_ENTRY_SIZE)
        os.ftruncate(self._time_fd, len(self.indexer.time_entries) * TIME_ENTRY_SIZE)
        self.close()
        return self.indexer.max_timestamp_so_far

    def flush(self) -> None:
        if self._log is not None:
            self._log.flush()
        if self._txn is not None:
            self._txn.flush()

    def close(self) -> None:
        """Release the files, leaving the indexes preallocated (the broker is still running)."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._txn is not None:
            self._txn.close()
            self._txn = None
        for fd in (self._offset_fd, self._time_fd):
            if fd >= 0:
                os.close(fd)
        self._offset_fd = self._time_fd = -1


@dataclass(slots=True)
class _ClosedSegment:
    base_offset: int
    size: int
    largest_timestamp: int  # NO_TIMESTAMP when the time index has no entry


# --- one partition ------------------------------------------------------------------------------


class PartitionLog:
    """One partition directory written as its leader writes it. Open with :meth:`open`."""

    def __init__(self, directory: Path, topic_partition: TopicPartition, config: LogConfig):
        self.directory = directory
        self.topic_partition = topic_partition
        self.config = config
        self._closed: list[_ClosedSegment] = []
        self._active: _ActiveSegment | None = None
        self.producer_state = ProducerStateManager()
        self.epochs = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT, [])
        self._log_start_offset = 0
        self._high_watermark = 0
        self._snapshot_offsets: list[int] = []
        self.metadata_log = False  # KRaft's __cluster_metadata-0 (see open)

    # -- opening --

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike,
        config: LogConfig = LogConfig(),
        *,
        topic_id: uuid.UUID | None = None,
        log_start_offset: int | None = None,
        high_watermark: int | None = None,
        metadata_log: bool = False,
    ) -> PartitionLog:
        """Create the partition directory, or reopen an existing one and recover its state.

        Reopening reads the closed segments' sizes and largest timestamps, rescans the active
        segment (its indexes are rebuilt as LogSegment.recover does), loads the producer state
        from the latest snapshot plus the batches after it, and reads the epoch lineage, trimmed
        as LogLoader trims it (from the end at the log end offset, from the start at the
        checkpointed log start offset). The log start offset and high watermark come from the
        log dir's checkpoints when given.

        A real broker restart also leaves traces this continuation does not: the clean shutdown
        appends the active segment's final time-index entry and a snapshot at the log end
        offset, loading deletes snapshots at or below the log start offset, and the next index
        entry waits for a fresh index.interval.bytes. Reopening here continues as if the broker
        had never stopped, so a run split by a reopen writes what an unsplit one writes.

        ``topic_id`` is written to ``partition.metadata`` when that file is missing; a different
        id already there raises ValueError (Kafka's InconsistentTopicIdException).

        ``metadata_log=True`` opens KRaft's ``__cluster_metadata-0`` as its raft leader writes it
        (KafkaMetadataLog over a UnifiedLog): control batches without a producer id (LeaderChange,
        the raft's own) are appended as they are, outside producer state.
        """
        path = Path(directory)
        tp = PartitionDir.at(path, metadata_log=metadata_log).topic_partition
        log = cls(path, tp, config)
        log.metadata_log = metadata_log
        reopened = path.is_dir() and bool(list_segments(path))
        if reopened:
            log._recover()
        else:
            path.mkdir(parents=True, exist_ok=True)
            # Kafka's CheckpointFile creates the file empty before the first epoch is written.
            (path / LEADER_EPOCH_CHECKPOINT).touch()
            log._active = _ActiveSegment.create(path, 0, config)
        if topic_id is not None:
            log._ensure_topic_id(topic_id)
        start = log._closed[0].base_offset if log._closed else log.active_segment_base_offset
        log._log_start_offset = max(start, log_start_offset if log_start_offset is not None else start)
        if reopened:
            # LogLoader.load: the lineage ends below the log end offset and starts at the
            # checkpointed log start offset (0 when the partition is not checkpointed).
            log.epochs.truncate_from_end(log.log_end_offset)
            log.epochs.truncate_from_start(log_start_offset if log_start_offset is not None else 0)
        log._high_watermark = log._clamp_high_watermark(high_watermark if high_watermark is not None else log._log_start_offset)
        return log

    def _recover(self) -> None:
        segments = list_segments(self.directory)
        for s in segments[:-1]:
            try:
                last = last_time_index_entry(s.time_index, s.base_offset)
            except FileNotFoundError:
                last = None
            largest = last.timestamp if last is not None else NO_TIMESTAMP
            self._closed.append(_ClosedSegment(s.base_offset, s.log.stat().st_size, largest))
        self._active = _ActiveSegment.recover(self.directory, segments[-1].base_offset, self.config)
        try:
            self.epochs = LeaderEpochCache(self.directory / LEADER_EPOCH_CHECKPOINT, read_leader_epoch_checkpoint(self.directory / LEADER_EPOCH_CHECKPOINT))
        except MissingCheckpointError:
            self.epochs = LeaderEpochCache(self.directory / LEADER_EPOCH_CHECKPOINT, [])
        self._load_producer_state()

    def _load_producer_state(self) -> None:
        """Latest readable snapshot at or below the log end offset, then replay the batches after it."""
        snapshots = list_producer_snapshots(self.directory)
        self._snapshot_offsets = sorted(snapshots)
        leo = self.log_end_offset
        start = None
        for offset in sorted((o for o in snapshots if o <= leo), reverse=True):
            try:
                self.producer_state.load(read_producer_snapshot(snapshots[offset]))
            except CheckpointError:
                continue  # Kafka drops a corrupt snapshot and falls back to an older one
            start = offset
            break
        if start is None:
            self.producer_state.load([])
            # From the log start offset (0 while opening: it is not set yet), as ProducerStateManager does.
            first = self._closed[0].base_offset if self._closed else self.active_segment_base_offset
            start = max(first, self._log_start_offset)
        bases = [s.base_offset for s in self._closed] + [self.active_segment_base_offset]
        for i, base in enumerate(bases):
            end = bases[i + 1] if i + 1 < len(bases) else leo
            if end <= start:
                continue
            with mapped(self.directory / offset_file_name(base, LOG_SUFFIX)) as view:
                for b in scan_batches(view, verify_crc=False).batches:
                    if b.base_offset < start or b.magic != 2 or b.producer_id < 0:
                        continue
                    marker = _transaction_marker(view, b) if b.is_control else None
                    completed = self.producer_state.update(b, marker)
                    if completed is not None:
                        self.producer_state.complete(completed)

    def _ensure_topic_id(self, topic_id: uuid.UUID) -> None:
        path = self.directory / PARTITION_METADATA
        try:
            existing = read_partition_metadata(path)
        except MissingCheckpointError:
            write_partition_metadata(path, PartitionMetadata(PARTITION_METADATA_VERSION, topic_id))
            return
        if existing.topic_id != topic_id:
            raise ValueError(
                f"{path}: topic id {topic_id_to_base64(existing.topic_id)} differs from {topic_id_to_base64(topic_id)}"
            )

    # -- offsets --

    @property
    def topic_id(self) -> uuid.UUID | None:
        try:
            return read_partition_metadata(self.directory / PARTITION_METADATA).topic_id
        except MissingCheckpointError:
            return None

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        assert self._active is not None
        return self._active.next_offset

    @property
    def active_segment_base_offset(self) -> int:
        assert self._active is not None
        return self._active.base_offset

    @property
    def recovery_point(self) -> int:
        """Flushed up to here: the broker flushes the rolled segments, so the active segment's base."""
        return self.active_segment_base_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark (as replication would); clamped to [log start, log end]."""
        self._high_watermark = self._clamp_high_watermark(offset)
        return self._high_watermark

    def _clamp_high_watermark(self, offset: int) -> int:
        return min(max(offset, self._log_start_offset), self.log_end_offset)

    @property
    def snapshot_offsets(self) -> list[int]:
        """Offsets of the producer snapshot files in the directory."""
        return list(self._snapshot_offsets)

    @property
    def max_timestamp(self) -> int:
        """The largest timestamp in the log (NO_TIMESTAMP when there is none)."""
        assert self._active is not None
        candidates = [s.largest_timestamp for s in self._closed] + [self._active.indexer.max_timestamp_so_far]
        return max(candidates, default=NO_TIMESTAMP)

    def segments(self) -> list[LocalSegment]:
        """Every segment, oldest first; the last is active."""
        assert self._active is not None
        out = []
        bases = [s.base_offset for s in self._closed] + [self._active.base_offset]
        for i, s in enumerate(self._closed):
            out.append(LocalSegment(s.base_offset, bases[i + 1], s.size, s.largest_timestamp, False))
        a = self._active
        out.append(LocalSegment(a.base_offset, a.next_offset, a.size, a.indexer.max_timestamp_so_far, True))
        return out

    @property
    def size(self) -> int:
        assert self._active is not None
        return sum(s.size for s in self._closed) + self._active.size

    # -- appending --

    def append(self, batch: bytes, *, leader_epoch: int, log_append_time: int | None = None) -> AppendResult:
        """Append one magic-2 batch as the leader: offsets from the log end offset, this epoch.

        ``log_append_time`` stamps the batch LogAppendTime (message.timestamp.type=LogAppendTime).
        Raises ValueError, writing nothing, for what the leader would reject: a batch over
        max.message.bytes or segment.bytes, a CRC that does not match, a record count that
        disagrees with lastOffsetDelta, an older leader epoch, and the producer-state checks.
        """
        active = self._active
        assert active is not None
        if leader_epoch < 0:
            raise ValueError(f"leader epoch {leader_epoch} is negative")
        latest_epoch = self.epochs.latest_epoch
        if latest_epoch is not None and leader_epoch < latest_epoch:
            raise ValueError(f"leader epoch {leader_epoch} is older than the latest epoch {latest_epoch}")
        incoming = _parse_one_batch(batch, verify_crc=True)
        if incoming.size > self.config.max_message_bytes:
            raise ValueError(f"a {incoming.size}-byte batch exceeds max.message.bytes {self.config.max_message_bytes}")
        if log_append_time is not None:
            batch = with_log_append_time(batch, log_append_time)
        base_offset = active.next_offset
        batch = with_base_offset_and_epoch(batch, base_offset, leader_epoch)
        header = _parse_one_batch(batch)
        if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
            # LogValidator: the leader assigns one offset per record, so the two must agree.
            raise ValueError(
                f"inconsistent batch: {header.record_count} records but lastOffsetDelta {header.last_offset_delta}"
            )
        if len(batch) > self.config.segment_bytes:
            # UnifiedLog.append's RecordBatchTooLargeException: a batch never spans segments.
            raise ValueError(f"a {len(batch)}-byte batch exceeds segment.bytes {self.config.segment_bytes}")
        marker = _transaction_marker(batch, header) if header.is_control else None
        if not (self.metadata_log and header.producer_id < 0):
            # The raft's own batches (AppendOrigin.RAFT_LEADER) carry no producer id.
            self.producer_state.check(header, marker)

        self.epochs.assign(leader_epoch, base_offset)
        rolled = False
        if active.should_roll(len(batch), header.max_timestamp, header.last_offset):
            active = self._roll()
            rolled = True
        position = active.append(batch, header.last_offset, header.max_timestamp)

        aborted = None
        completed = self.producer_state.update(header, marker)
        if completed is not None:
            if completed.is_aborted:
                lso = self.producer_state.last_stable_offset(completed)
                aborted = AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset, lso)
                active.append_aborted_txn(aborted)
            self.producer_state.complete(completed)
        return AppendResult(
            base_offset, header.last_offset, position, len(batch), active.base_offset, rolled, header.max_timestamp, aborted,
        )

    def roll(self) -> bool:
        """Start a new segment at the log end offset now; False when the active one is empty."""
        assert self._active is not None
        if self._active.size == 0:
            return False
        self._roll()
        return True

    def _roll(self) -> _ActiveSegment:
        old = self._active
        assert old is not None
        largest = old.roll()
        self._closed.append(_ClosedSegment(old.base_offset, old.size, largest))
        new_base = old.next_offset
        # Snapshot at the new base offset, so recovery can start there (UnifiedLog.roll).
        if not self._snapshot_offsets or new_base > self._snapshot_offsets[-1]:
            write_producer_snapshot(self.directory / offset_file_name(new_base, PRODUCER_SNAPSHOT_SUFFIX), self.producer_state.entries())
            self._snapshot_offsets.append(new_base)
        self._active = _ActiveSegment.create(self.directory, new_base, self.config)
        return self._active

    def append_as_follower(self, records: bytes) -> list[AppendResult]:
        """Append what a fetch from the leader returned, as a follower does (UnifiedLog.appendAsFollower).

        ``records`` is one or more whole magic-2 batches exactly as the leader holds them: offsets,
        leader epochs and timestamps are kept, byte for byte. The first must start at the log end
        offset and each follow the one before. As on the broker, the chunk goes into one segment:
        the roll check runs once, for the chunk's size, so a follower rolls at its own points.
        Each batch's leader epoch enters the epoch cache; producer state follows the batches
        without the leader's checks (AppendOrigin.REPLICATION); an ABORT marker gets its
        ``.txnindex`` entry, with the last stable offset computed once the whole chunk's producer
        state is applied, as Kafka computes it. Returns one AppendResult per batch. Raises
        ValueError, writing nothing, for bytes that are not such a chunk, and for a chunk larger
        than segment.bytes (Kafka's RecordBatchTooLargeException, which a follower hits too).
        """
        active = self._active
        assert active is not None
        scan = scan_batches(records, verify_crc=True)
        if scan.invalid is not None or not scan.batches:
            raise ValueError("a follower appends whole record batches only")
        headers = scan.batches
        expected = active.next_offset
        for h in headers:
            if h.magic != 2:
                raise ValueError(f"the batch at offset {h.base_offset} is magic {h.magic}, not 2")
            if h.crc_ok is False:
                raise ValueError(f"the batch at offset {h.base_offset} is corrupt: its CRC does not match")
            if h.base_offset != expected:
                raise ValueError(f"the batch at offset {h.base_offset} does not start at offset {expected}, where the log continues")
            expected = h.next_offset
        if len(records) > self.config.segment_bytes:
            raise ValueError(f"a {len(records)}-byte fetch exceeds segment.bytes {self.config.segment_bytes}")

        for h in headers:
            if h.partition_leader_epoch >= 0:
                self.epochs.assign(h.partition_leader_epoch, h.base_offset)
        rolled = False
        if active.should_roll(len(records), max(h.max_timestamp for h in headers), headers[-1].last_offset):
            active = self._roll()
            rolled = True
        positions = []
        completed: list[CompletedTxn] = []
        for h in headers:
            positions.append(active.append(bytes(records[h.position : h.position + h.size]), h.last_offset, h.max_timestamp))
            if h.producer_id >= 0:
                marker = _transaction_marker(records, h) if h.is_control else None
                done = self.producer_state.update(h, marker)
                if done is not None:
                    completed.append(done)
        aborted: dict[int, AbortedTxn] = {}
        for done in completed:
            if done.is_aborted:
                txn = AbortedTxn(done.producer_id, done.first_offset, done.last_offset, self.producer_state.last_stable_offset(done))
                active.append_aborted_txn(txn)
                aborted[done.last_offset] = txn
            self.producer_state.complete(done)
        return [
            AppendResult(h.base_offset, h.last_offset, position, h.size, active.base_offset, rolled and i == 0,
                         h.max_timestamp, aborted.get(h.base_offset))
            for i, (h, position) in enumerate(zip(headers, positions))
        ]

    # -- truncation --

    def truncate_to(self, target: int) -> bool:
        """Cut the log so it ends just before ``target`` (UnifiedLog.truncateTo): what a follower
        does where its log diverged from the leader's. False when the log already ends there.

        Segments starting after the target go (with their producer snapshots); the one holding
        it is cut there and becomes the active segment again (see :meth:`_ActiveSegment.truncated`);
        the epoch cache loses the entries at or past the target; producer state is rebuilt from
        the newest snapshot left and a snapshot is taken at the target; the log start offset and
        high watermark come down to the target if they were above. A target below the first
        segment empties the log (:meth:`truncate_fully_and_start_at`). Even with nothing to cut,
        the epoch cache loses an entry at the log end offset: a leader that assigned its epoch
        and lost the leadership before appending holds one. ValueError for a target inside a
        batch (nothing is changed then).
        """
        if target < 0:
            raise ValueError(f"cannot truncate to a negative offset ({target})")
        active = self._active
        assert active is not None
        if target >= active.next_offset:
            self.epochs.truncate_from_end(active.next_offset)
            return False
        segments = self.segments()
        if segments[0].base_offset > target:
            self.truncate_fully_and_start_at(target)
            return True
        kept = [s for s in segments if s.base_offset <= target]
        doomed = segments[len(kept):]
        last = kept[-1]
        if last.active:
            offset_entries, time_entries = list(active.indexer.offset_entries), list(active.indexer.time_entries)
        else:
            offset_entries = read_offset_index(self.directory / offset_file_name(last.base_offset, INDEX_SUFFIX), last.base_offset)
            time_entries = read_time_index(self.directory / offset_file_name(last.base_offset, TIME_INDEX_SUFFIX), last.base_offset)
        truncated = _ActiveSegment.truncated(self.directory, last.base_offset, self.config, target, offset_entries, time_entries)
        active.close()
        self._delete_segment_files(doomed)
        self._closed = self._closed[: len(kept) - 1]
        self._active = truncated
        self.epochs.truncate_from_end(target)
        self._log_start_offset = min(target, self._log_start_offset)
        self._rebuild_producer_state(target)
        if self._high_watermark >= target:
            self._high_watermark = target
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start an empty log at ``offset`` (UnifiedLog.truncateFullyAndStartAt):
        a follower whose log end is below the leader's log start offset. The epoch cache and the
        producer state are emptied, every producer snapshot goes, and the log start offset and
        high watermark move to ``offset``."""
        if offset < 0:
            raise ValueError(f"cannot start a log at a negative offset ({offset})")
        assert self._active is not None
        self._active.close()
        self._delete_segment_files(self.segments())
        for path in list_producer_snapshots(self.directory).values():
            _rename_deleted(path).unlink()
        self._closed = []
        self._active = _ActiveSegment.create(self.directory, offset, self.config)
        self.epochs.clear()
        self.producer_state.load([])
        self._snapshot_offsets = []
        self._log_start_offset = offset
        self._high_watermark = offset

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to ``offset`` (UnifiedLog.maybeIncrementLogStartOffset), as a
        follower does with the leader's; the segments wholly below it go at the next
        :meth:`delete_old_segments`. ValueError past the high watermark, as Kafka refuses it."""
        if offset > self._high_watermark:
            raise ValueError(f"cannot move the log start offset to {offset}, past the high watermark {self._high_watermark}")
        if offset <= self._log_start_offset:
            return False
        self._log_start_offset = offset
        self.epochs.truncate_from_start(offset)
        return True

    def _delete_segment_files(self, segments: list[LocalSegment]) -> None:
        """A truncation's segment deletion: each file renamed ``.deleted`` and removed, and the
        producer snapshots at their base offsets (UnifiedLog.deleteProducerSnapshots)."""
        renamed = []
        for s in segments:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, PRODUCER_SNAPSHOT_SUFFIX):
                path = self.directory / offset_file_name(s.base_offset, suffix)
                if path.exists():
                    renamed.append(_rename_deleted(path))
        for path in renamed:
            path.unlink()

    def _rebuild_producer_state(self, end_offset: int) -> None:
        """UnifiedLog.rebuildProducerState after a truncation: snapshots past the new end, or at or
        below the log start offset, go (ProducerStateManager.truncateAndReload); the state is
        reloaded from the newest snapshot left plus the batches after it; then a snapshot is
        taken at the new end unless one is there already."""
        for offset, path in list_producer_snapshots(self.directory).items():
            if offset > end_offset or offset <= self._log_start_offset:
                _rename_deleted(path).unlink()
        self._load_producer_state()
        latest = self._snapshot_offsets[-1] if self._snapshot_offsets else self._log_start_offset
        if end_offset > latest:
            write_producer_snapshot(self.directory / offset_file_name(end_offset, PRODUCER_SNAPSHOT_SUFFIX), self.producer_state.entries())
            self._snapshot_offsets.append(end_offset)

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """The broker's periodic producer-id expiration (every 10 minutes on its clock)."""
        return self.producer_state.remove_expired(now_ms, self.config.producer_id_expiration_ms)

    # -- retention --

    def delete_old_segments(self, now_ms: int, *, retention_ms: int = -1, retention_bytes: int = -1) -> list[int]:
        """Broker-side retention (UnifiedLog.deleteOldSegments): returns the deleted base offsets.

        Three passes, in Kafka's order, each walking the segments oldest first and stopping at the
        first one kept: segments wholly below the log start offset (the next segment starts at or
        before it); retention.bytes (delete while the log stays at or above the limit without the
        segment); retention.ms (the segment's largest timestamp, else its file's modification
        time, is more than retention.ms before ``now_ms``). −1 disables a rule. A segment is only
        deleted when it lies wholly below the high watermark, and an empty active segment never
        is; the active segment itself can be (cleanup.policy=delete on a non-tiered topic): when
        every segment goes, the log first rolls, so it keeps an empty active segment at the log
        end offset.
        """
        deleted = self._delete_old_segments(lambda s: not s.active and s.next_offset <= self._log_start_offset)
        if retention_bytes >= 0 and self.size >= retention_bytes:
            excess = self.size - retention_bytes

            def size_breached(s: LocalSegment) -> bool:
                nonlocal excess
                if excess - s.size < 0:
                    return False
                excess -= s.size
                return True

            deleted += self._delete_old_segments(size_breached)
        if retention_ms >= 0:
            deleted += self._delete_old_segments(lambda s: now_ms - self._largest_timestamp(s) > retention_ms)
        return deleted

    def _delete_old_segments(self, predicate: Callable[[LocalSegment], bool]) -> list[int]:
        """UnifiedLog.deletableSegments + deleteSegments for one predicate."""
        segments = self.segments()
        count = 0
        for s in segments:
            # The predicate only runs for segments below the high watermark (it may keep state).
            if not (self._high_watermark >= s.next_offset and predicate(s)):
                break
            if s.active and s.size == 0:
                break
            count += 1
        if count == 0:
            return []
        if count == len(segments):
            self._roll()  # a log always keeps a segment: roll first, then delete all the old ones
        return self._delete_oldest(count)

    def _largest_timestamp(self, s: LocalSegment) -> int:
        """LogSegment.largestTimestamp: the largest timestamp seen, else the .log's modification time."""
        return largest_timestamp(s.largest_timestamp, (self.directory / offset_file_name(s.base_offset, LOG_SUFFIX)).stat().st_mtime_ns)

    def _delete_oldest(self, count: int) -> list[int]:
        doomed, self._closed = self._closed[:count], self._closed[count:]
        new_start = self._closed[0].base_offset if self._closed else self.active_segment_base_offset
        # The log start offset moves before any file goes, so no reader is sent to a missing one.
        if new_start > self._log_start_offset:
            self._log_start_offset = new_start
            self.epochs.truncate_from_start(new_start)
        renamed: list[Path] = []
        for s in doomed:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                path = self.directory / offset_file_name(s.base_offset, suffix)
                if path.exists():
                    renamed.append(_rename_deleted(path))
        # UnifiedLog.deleteProducerSnapshots: the snapshots AT the deleted segments' base offsets.
        doomed_bases = {s.base_offset for s in doomed}
        for offset in self._snapshot_offsets:
            path = self.directory / offset_file_name(offset, PRODUCER_SNAPSHOT_SUFFIX)
            if offset in doomed_bases and path.exists():
                renamed.append(_rename_deleted(path))
        self._snapshot_offsets = [o for o in self._snapshot_offsets if o not in doomed_bases]
        # Kafka removes the .deleted files file.delete.delay.ms (60 s) later; the state written
        # here is the one after that delay.
        for path in renamed:
            path.unlink()
        return [s.base_offset for s in doomed]

    # -- lifecycle --

    def flush(self) -> None:
        assert self._active is not None
        self._active.flush()

    def close(self) -> None:
        if self._active is not None:
            self._active.close()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- a whole log dir ----------------------------------------------------------------------------


def derived_uuid(*parts: object) -> uuid.UUID:
    """A version-4-shaped UUID derived from ``parts``: deterministic ids for simulated topics/clusters.

    Like Kafka's Uuid.randomUuid, never the zero/metadata ids and never one whose string starts
    with ``-`` (it would read as a command-line flag).
    """
    counter = 0
    while True:
        digest = hashlib.sha256(":".join(str(p) for p in (*parts, counter)).encode("utf-8")).digest()
        candidate = uuid.UUID(bytes=digest[:16], version=4)
        if candidate.int > 1 and not topic_id_to_base64(candidate).startswith("-"):
            return candidate
        counter += 1


class BrokerLogDir:
    """A broker log dir: every partition in it, ``meta.properties`` and the root checkpoints.

    Opening loads every partition already there (from the checkpoints' log start offsets and
    high watermarks). Topic ids come from existing ``partition.metadata`` files, else are
    derived from ``seed`` and the topic name.

    ``log-start-offset-checkpoint`` lists every partition, as Kafka writes it for topics with
    remote.storage.enable (for other topics Kafka omits a partition whose log start offset is its
    first segment's base offset; readers take that base offset either way). Set
    ``checkpoint_all_log_start_offsets=False`` for Kafka's behaviour on non-tiered topics, which
    is what a broker running :meth:`PartitionLog.delete_old_segments` (retention that moves the log
    start offset, as on a topic without remote.storage.enable) would write. Entries are sorted by
    partition; Kafka writes them in its map's iteration order (readers take them as a map).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        config: LogConfig = LogConfig(),
        *,
        seed: int = 0,
        node_id: int = 0,
        created_ms: int = 0,
        checkpoint_all_log_start_offsets: bool = True,
    ):
        self.path = Path(path)
        self.config = config
        self.seed = seed
        self.checkpoint_all_log_start_offsets = checkpoint_all_log_start_offsets
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_meta_properties(node_id, created_ms)
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._topic_ids: dict[str, uuid.UUID] = {}
        high_watermarks = self._read_checkpoint(REPLICATION_OFFSET_CHECKPOINT)
        log_start_offsets = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT)
        for pdir in discover_partitions(self.path):
            tp = pdir.topic_partition
            metadata = pdir.metadata()
            if metadata is not None:
                self._topic_ids.setdefault(tp.topic, metadata.topic_id)
            self._logs[tp] = PartitionLog.open(
                pdir.path, config, log_start_offset=log_start_offsets.get(tp), high_watermark=high_watermarks.get(tp),
            )

    def _read_checkpoint(self, name: str) -> dict[TopicPartition, int]:
        try:
            return read_offset_checkpoint(self.path / name)
        except MissingCheckpointError:
            return {}

    def _write_meta_properties(self, node_id: int, created_ms: int) -> None:
        """What ``kafka-storage format`` leaves (KRaft, version 1); kept if already there."""
        path = self.path / META_PROPERTIES
        if path.exists():
            return
        # java.util.Properties.store: a comment line, a date line, then key=value lines.
        when = datetime.fromtimestamp(created_ms / 1000, tz=timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y")
        props = {
            "cluster.id": topic_id_to_base64(derived_uuid("cluster", self.seed)),
            "directory.id": topic_id_to_base64(derived_uuid("directory", self.seed, node_id)),
            "node.id": str(node_id),
            "version": "1",
        }
        text = "#\n#" + when + "\n" + "".join(f"{k}={v}\n" for k, v in props.items())
        write_atomically(path, text.encode("utf-8"))

    def topic_id(self, topic: str) -> uuid.UUID:
        if topic not in self._topic_ids:
            self._topic_ids[topic] = derived_uuid("topic", self.seed, topic)
        return self._topic_ids[topic]

    def partition(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log, created (with ``partition.metadata``) when it does not exist yet."""
        tp = TopicPartition(topic, partition)
        log = self._logs.get(tp)
        if log is None:
            log = self._logs[tp] = PartitionLog.open(self.path / tp.dir_name, self.config, topic_id=self.topic_id(topic))
        elif log.topic_id is None:
            log._ensure_topic_id(self.topic_id(topic))
        return log

    @property
    def logs(self) -> dict[TopicPartition, PartitionLog]:
        return dict(sorted(self._logs.items()))

    def checkpoint(self) -> None:
        """Write the root checkpoints for every partition, each atomically."""
        for log in self._logs.values():
            log.flush()
        logs = self.logs
        write_offset_checkpoint(self.path / REPLICATION_OFFSET_CHECKPOINT, {tp: log.high_watermark for tp, log in logs.items()})
        write_offset_checkpoint(self.path / RECOVERY_POINT_OFFSET_CHECKPOINT, {tp: log.recovery_point for tp, log in logs.items()})
        write_offset_checkpoint(self.path / LOG_START_OFFSET_CHECKPOINT, {
            tp: log.log_start_offset for tp, log in logs.items()
            if self.checkpoint_all_log_start_offsets or log.log_start_offset > log.segments()[0].base_offset
        })

    def close(self) -> None:
        for log in self._logs.values():
            log.close()

    def __enter__(self) -> BrokerLogDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
