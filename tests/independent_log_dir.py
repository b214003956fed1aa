"""A Kafka broker log dir written WITHOUT kts's own code: the other implementation the independent
checks of ``kts sync`` / ``kts status`` run against (tests/test_sync_independent.py).

Nothing here imports ``kts_resources`` or ``kts_assets``. Record batches come from kafka-python's
``DefaultRecordBatchBuilder`` (magic 2, none/gzip/snappy/lz4/zstd); everything a broker adds on top —
base offsets, partition leader epochs, control markers, rolling, ``.index`` / ``.timeindex``,
producer snapshots, the log-dir checkpoints, ``leader-epoch-checkpoint``, ``partition.metadata`` —
is written here straight from ../shared/KAFKA_FORMATS.md (and Kafka's classes it names), one
function per file format.

The writer keeps every partition in memory and ``write()`` puts it on disk; a file whose bytes did
not change is left alone, so appending and writing again behaves like a broker that appended (closed
segments keep their files; the segment that closes gets its trimmed indexes). ``describe()`` says
what was written: per partition the segments (base offset, next base offset, paths), high
watermark, recovery point, log start offset and log end offset.
"""

from __future__ import annotations

import base64
import itertools
import os
import random
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

# --- constants from KAFKA_FORMATS.md -------------------------------------------------------------

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
INDEX_INTERVAL_BYTES = 4096  # index.interval.bytes default (§3)
SEGMENT_INDEX_BYTES = 10 * 1024 * 1024  # segment.index.bytes default: the active segment's preallocation (§1)
OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position (§3)
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset (§4)
NO_TIMESTAMP = -1

# Batch header fields a broker sets after the producer built the batch (§2). The CRC covers bytes
# [21, end) only, so base offset and leader epoch can be written without re-checksumming.
BASE_OFFSET = struct.Struct(">q")  # at 0
LEADER_EPOCH = struct.Struct(">i")  # at 12
CRC = struct.Struct(">I")  # at 17
ATTRIBUTES = struct.Struct(">h")  # at 21
CRC_START = 21
CONTROL_BIT = 0x20

# Producer snapshot (§5): version, crc, count, 46-byte entries.
SNAPSHOT_HEADER = struct.Struct(">hIi")
SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")


def segment_name(base_offset: int) -> str:
    """Segment files are named by their base offset, 20 digits (§1)."""
    return f"{base_offset:020d}"


def kafka_uuid_string(u: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 of the 16 bytes, no padding (22 characters)."""
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode("ascii")


# --- one batch as the broker stores it ------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    data: bytes
    base_offset: int
    last_offset: int
    max_timestamp: int
    leader_epoch: int

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class Record:
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def _stamp(built: bytearray, base_offset: int, leader_epoch: int, extra_attributes: int = 0) -> bytes:
    """What the broker does to a produced batch: assign the base offset and the partition leader
    epoch (header bytes the CRC does not cover); for a control batch also set attribute bit 5,
    which the CRC does cover, so the CRC is computed again."""
    BASE_OFFSET.pack_into(built, 0, base_offset)
    LEADER_EPOCH.pack_into(built, 12, leader_epoch)
    if extra_attributes:
        (attributes,) = ATTRIBUTES.unpack_from(built, 21)
        ATTRIBUTES.pack_into(built, 21, attributes | extra_attributes)
        CRC.pack_into(built, 17, calc_crc32c(memoryview(built)[CRC_START:]))
    return bytes(built)


def build_batch(
    base_offset: int,
    leader_epoch: int,
    records: list[Record],
    codec: str = "none",
    producer: tuple[int, int, int] | None = None,
    transactional: bool = False,
) -> Batch:
    """A magic-2 data batch from kafka-python's builder. ``producer`` is (id, epoch, base sequence).
    The builder keeps a batch uncompressed when compression would not make it smaller, as the Java
    producer does, so callers give it compressible values."""
    pid, pepoch, seq = producer if producer else (-1, -1, -1)
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=CODECS[codec], is_transactional=transactional,
        producer_id=pid, producer_epoch=pepoch, base_sequence=seq, batch_size=1 << 30,
    )
    for delta, r in enumerate(records):
        builder.append(delta, timestamp=r.timestamp, key=r.key, value=r.value, headers=r.headers)
    data = _stamp(builder.build(), base_offset, leader_epoch)
    return Batch(data, base_offset, base_offset + len(records) - 1, max(r.timestamp for r in records), leader_epoch)


def build_control_batch(offset: int, leader_epoch: int, producer: tuple[int, int], timestamp: int,
                        commit: bool = True, coordinator_epoch: int = 0) -> Batch:
    """An end-transaction marker (§2): one record, key = version int16 0 + type int16 (0 ABORT,
    1 COMMIT), value = version int16 0 + coordinator epoch int32; transactional and control bits
    set, no sequence. The builder has no control flag, so bit 5 is added afterwards."""
    pid, pepoch = producer
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True,
        producer_id=pid, producer_epoch=pepoch, base_sequence=-1, batch_size=1 << 20,
    )
    builder.append(0, timestamp=timestamp, key=struct.pack(">hh", 0, 1 if commit else 0),
                   value=struct.pack(">hi", 0, coordinator_epoch), headers=[])
    data = _stamp(builder.build(), offset, leader_epoch, CONTROL_BIT)
    return Batch(data, offset, offset, timestamp, leader_epoch)


def read_batches(data: bytes) -> list[Batch]:
    """Batches of a segment another implementation wrote, read with kafka-python; ValueError
    unless every byte belongs to a whole, CRC-valid magic-2 batch."""
    records = MemoryRecords(data)
    if records.valid_bytes() != len(data):
        raise ValueError(f"{len(data) - records.valid_bytes()} invalid bytes at the end")
    batches, position = [], 0
    while (batch := records.next_batch()) is not None:
        if not isinstance(batch, DefaultRecordBatch) or not batch.validate_crc():
            raise ValueError(f"byte {position}: not a CRC-valid magic-2 batch")
        size = batch.size_in_bytes
        batches.append(Batch(data[position:position + size], batch.base_offset, batch.last_offset,
                             batch.max_timestamp, batch.leader_epoch))
        position += size
    return batches


# --- file formats ---------------------------------------------------------------------------------


def offset_and_time_index(base_offset: int, batches: list[Batch], closed: bool) -> tuple[bytes, bytes]:
    """``.index`` and ``.timeindex`` entries by the broker's rule (§3, §4; LogSegment.append/recover).

    Before each batch: if more than index.interval.bytes were appended since the last entry, add
    (batch last offset, batch position) to the offset index and (max timestamp so far, last offset
    of the batch holding it) to the time index — the max so far already includes this batch — then
    reset the byte count. The first batch is never indexed. A time entry is only added when its
    timestamp is strictly greater than the last entry's (an empty time index counts as NO_TIMESTAMP).
    When the segment rolls, one more time entry (max timestamp so far, its offset) under the same rule.
    """
    offset_entries, time_entries = [], []
    last_time = NO_TIMESTAMP
    max_ts, max_ts_offset = NO_TIMESTAMP, base_offset
    since_last, position = 0, 0

    def maybe_append_time() -> None:
        nonlocal last_time
        if max_ts > last_time:
            time_entries.append(TIME_ENTRY.pack(max_ts, max_ts_offset - base_offset))
            last_time = max_ts

    for batch in batches:
        if batch.max_timestamp > max_ts:
            max_ts, max_ts_offset = batch.max_timestamp, batch.last_offset
        if since_last > INDEX_INTERVAL_BYTES:
            offset_entries.append(OFFSET_ENTRY.pack(batch.last_offset - base_offset, position))
            maybe_append_time()
            since_last = 0
        since_last += batch.size
        position += batch.size
    if closed:
        maybe_append_time()
    return b"".join(offset_entries), b"".join(time_entries)


def preallocated(entries: bytes, entry_size: int) -> bytes:
    """The active segment's index as a broker leaves it: segment.index.bytes rounded down to whole
    entries, zero-filled past the last entry (§1). Closed segments' indexes are trimmed instead."""
    size = SEGMENT_INDEX_BYTES - SEGMENT_INDEX_BYTES % entry_size
    return entries + bytes(size - len(entries))


def text_checkpoint(entries: list[str]) -> bytes:
    """Kafka's CheckpointFile text format: version 0, entry count, one entry per line (§1)."""
    return ("\n".join(["0", str(len(entries)), *entries]) + "\n").encode("utf-8")


def offset_checkpoint(offsets: dict[tuple[str, int], int]) -> bytes:
    """``replication-offset-checkpoint`` and friends: ``topic partition offset`` lines."""
    return text_checkpoint([f"{topic} {partition} {offset}" for (topic, partition), offset in offsets.items()])


def leader_epoch_checkpoint(lineage: list[tuple[int, int]]) -> bytes:
    """``leader-epoch-checkpoint``: ``epoch startOffset`` lines."""
    return text_checkpoint([f"{epoch} {start}" for epoch, start in lineage])


def partition_metadata(topic_id: uuid.UUID) -> bytes:
    """``partition.metadata`` exactly as Kafka's PartitionMetadataFileFormatter writes it:
    ``version: 0``, newline, ``topic_id: <Uuid.toString>`` — no newline at the end."""
    return f"version: 0\ntopic_id: {kafka_uuid_string(topic_id)}".encode("ascii")


@dataclass
class ProducerEntry:
    producer_id: int
    epoch: int
    last_sequence: int = -1
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = NO_TIMESTAMP
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1


def producer_snapshot(producers: list[ProducerEntry]) -> bytes:
    """``<offset>.snapshot`` (§5): version 1, CRC-32C of bytes [6, end), count, 46-byte entries.
    A broker takes one at every roll, at the new segment's base offset, even with no producers."""
    body = struct.pack(">i", len(producers)) + b"".join(
        SNAPSHOT_ENTRY.pack(p.producer_id, p.epoch, p.last_sequence, p.last_offset, p.offset_delta,
                            p.timestamp, p.coordinator_epoch, p.current_txn_first_offset)
        for p in sorted(producers, key=lambda p: p.producer_id)
    )
    return struct.pack(">hI", 1, calc_crc32c(body)) + body


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` unless the file already holds exactly it (a closed segment's files stay as
    the broker left them); through a temp file, fsync and rename, as Kafka writes checkpoints."""
    if path.exists() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- a partition ------------------------------------------------------------------------------------


@dataclass
class Segment:
    base_offset: int
    batches: list[Batch] = field(default_factory=list)
    snapshot: bytes | None = None  # taken when the NEXT segment was rolled, named after its base offset

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)

    def log_bytes(self) -> bytes:
        return b"".join(b.data for b in self.batches)


@dataclass(frozen=True)
class SegmentDescription:
    base_offset: int
    next_base_offset: int | None  # None for the active segment
    last_offset: int  # last offset held (−1 if empty)
    log: Path
    index: Path
    timeindex: Path
    snapshot: Path | None  # the producer snapshot at next_base_offset, when one was written
    size: int
    active: bool


@dataclass(frozen=True)
class PartitionDescription:
    topic: str
    partition: int
    path: Path
    topic_id: uuid.UUID
    segments: tuple[SegmentDescription, ...]
    high_watermark: int
    recovery_point: int
    log_start_offset: int
    log_end_offset: int
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset)


@dataclass(frozen=True)
class LogDirDescription:
    path: Path
    partitions: dict[tuple[str, int], PartitionDescription]


class PartitionWriter:
    """One partition's log as a broker would hold it: appends with offsets assigned contiguously,
    rolls by size (§6: roll when size > segment.bytes − incoming batch size), leader-epoch lineage,
    producer state for snapshots. High watermark, recovery point and log start offset are set by
    the caller (they default to the log end offset / first segment's base offset)."""

    def __init__(self, topic: str, partition: int, topic_id: uuid.UUID, segment_bytes: int):
        self.topic, self.partition, self.topic_id = topic, partition, topic_id
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = [Segment(0)]
        self.lineage: list[tuple[int, int]] = []
        self.producers: dict[int, ProducerEntry] = {}
        self.next_offset = 0
        self.high_watermark: int | None = None
        self.recovery_point: int | None = None
        self.log_start_offset: int | None = None

    @property
    def dir_name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def _note_epoch(self, epoch: int, offset: int) -> None:
        if not self.lineage or epoch > self.lineage[-1][0]:
            self.lineage.append((epoch, offset))

    def _append(self, batch: Batch) -> None:
        active = self.segments[-1]
        if active.batches and active.size > self.segment_bytes - batch.size:
            self.roll()
        self._note_epoch(batch.leader_epoch, batch.base_offset)
        self.segments[-1].batches.append(batch)
        self.next_offset = batch.last_offset + 1

    def roll(self) -> None:
        """Close the active segment: a new one starts at the log end offset, with a producer
        snapshot at that offset."""
        self.segments[-1].snapshot = producer_snapshot(list(self.producers.values()))
        self.segments.append(Segment(self.next_offset))

    def append(self, records: list[Record], *, leader_epoch: int, codec: str = "none",
               producer: tuple[int, int] | None = None, transactional: bool = False) -> Batch:
        seq = None
        if producer is not None:
            entry = self.producers.setdefault(producer[0], ProducerEntry(producer[0], producer[1]))
            seq = entry.last_sequence + 1
        batch = build_batch(self.next_offset, leader_epoch, records, codec,
                            (producer[0], producer[1], seq) if producer else None, transactional)
        self._append(batch)
        if producer is not None:
            entry.epoch = producer[1]
            entry.last_sequence = seq + len(records) - 1
            entry.last_offset, entry.offset_delta = batch.last_offset, len(records) - 1
            entry.timestamp = batch.max_timestamp
            if transactional and entry.current_txn_first_offset < 0:
                entry.current_txn_first_offset = batch.base_offset
        return batch

    def end_transaction(self, producer: tuple[int, int], *, leader_epoch: int, timestamp: int,
                        commit: bool = True, coordinator_epoch: int = 0) -> Batch:
        batch = build_control_batch(self.next_offset, leader_epoch, producer, timestamp, commit, coordinator_epoch)
        self._append(batch)
        entry = self.producers[producer[0]]
        entry.current_txn_first_offset, entry.coordinator_epoch, entry.timestamp = -1, coordinator_epoch, timestamp
        return batch

    def adopt_segment(self, data: bytes) -> list[Batch]:
        """Take another implementation's segment file as this (empty) partition's first segment,
        base offset 0, then roll so it is closed. Its batches' offsets must start at ≥ 0 (a first
        batch above the segment's base offset is legal — Kafka only requires offsets to grow)."""
        assert self.next_offset == 0 and not self.segments[-1].batches
        batches = read_batches(data)
        if not batches or batches[0].base_offset < 0:
            raise ValueError("no batches, or offsets below the segment's base offset 0")
        for previous, batch in itertools.pairwise(batches):
            if batch.base_offset <= previous.last_offset:
                raise ValueError(f"offsets go backwards at {batch.base_offset}")
        for batch in batches:
            self._note_epoch(batch.leader_epoch, batch.base_offset)
        self.segments[-1].batches.extend(batches)
        self.next_offset = batches[-1].last_offset + 1
        self.roll()
        return batches

    # --- to disk ---

    def write(self, log_dir: Path) -> PartitionDescription:
        path = log_dir / self.dir_name
        path.mkdir(parents=True, exist_ok=True)
        described = []
        for i, segment in enumerate(self.segments):
            active = i == len(self.segments) - 1
            stem = path / segment_name(segment.base_offset)
            log, index, timeindex = (stem.with_suffix(s) for s in (".log", ".index", ".timeindex"))
            write_file(log, segment.log_bytes())
            offset_entries, time_entries = offset_and_time_index(segment.base_offset, segment.batches, closed=not active)
            if active:
                offset_entries, time_entries = preallocated(offset_entries, OFFSET_ENTRY.size), preallocated(time_entries, TIME_ENTRY.size)
            write_file(index, offset_entries)
            write_file(timeindex, time_entries)
            next_base = None if active else self.segments[i + 1].base_offset
            snapshot = None
            if segment.snapshot is not None:
                snapshot = path / f"{segment_name(next_base)}.snapshot"
                write_file(snapshot, segment.snapshot)
            described.append(SegmentDescription(
                base_offset=segment.base_offset, next_base_offset=next_base,
                last_offset=segment.batches[-1].last_offset if segment.batches else -1,
                log=log, index=index, timeindex=timeindex, snapshot=snapshot, size=segment.size, active=active,
            ))
        write_file(path / "leader-epoch-checkpoint", leader_epoch_checkpoint(self.lineage))
        write_file(path / "partition.metadata", partition_metadata(self.topic_id))
        return PartitionDescription(
            topic=self.topic, partition=self.partition, path=path, topic_id=self.topic_id,
            segments=tuple(described),
            high_watermark=self.next_offset if self.high_watermark is None else self.high_watermark,
            recovery_point=self.next_offset if self.recovery_point is None else self.recovery_point,
            log_start_offset=self.segments[0].base_offset if self.log_start_offset is None else self.log_start_offset,
            log_end_offset=self.next_offset,
            leader_epochs=tuple(self.lineage),
        )


def write_log_dir(log_dir: Path, partitions: list[PartitionWriter]) -> LogDirDescription:
    """Every partition directory, then the three log-dir checkpoints (one line per partition)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    described = {(p.topic, p.partition): p.write(log_dir) for p in partitions}
    for name, attribute in (("replication-offset-checkpoint", "high_watermark"),
                            ("recovery-point-offset-checkpoint", "recovery_point"),
                            ("log-start-offset-checkpoint", "log_start_offset")):
        write_file(log_dir / name, offset_checkpoint({k: getattr(d, attribute) for k, d in described.items()}))
    return LogDirDescription(log_dir, described)


# --- the workload -------------------------------------------------------------------------------------

BASE_TIME = 1_700_000_000_000
WORDS = ("kafka", "broker", "segment", "offset", "tiered", "storage", "remote", "index", "leader", "epoch", "commit",
         "replica", "fetch")


def random_records(rng: random.Random, count: int, start_ts: int) -> list[Record]:
    """Keys (some null), text values that compress, headers on some records (one with a null
    value); timestamps mostly rising, with an occasional late one."""
    records = []
    for i in range(count):
        ts = start_ts + i * 7 - (rng.randrange(5_000) if rng.random() < 0.1 else 0)
        key = None if rng.random() < 0.2 else f"user-{rng.randrange(50)}".encode()
        value = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(15, 45))).encode()
        headers = [("trace", f"{rng.getrandbits(32):08x}".encode()), ("null-header", None)] if rng.random() < 0.3 else []
        records.append(Record(ts, key, value, headers))
    return records


@dataclass
class Workload:
    """The partitions of the independent log dir and how they are appended to. ``write()`` is
    repeatable; ``append_roll()`` makes page.views-0 roll once more (for a second sync)."""

    third_party_dir: Path | None = None
    seed: int = 405
    segment_bytes: int = 12 * 1024
    partitions: list[PartitionWriter] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.clock = BASE_TIME

        def topic_id(name: str) -> uuid.UUID:
            return uuid.UUID(int=random.Random(name).getrandbits(128), version=4)

        def writer(topic: str, partition: int) -> PartitionWriter:
            w = PartitionWriter(topic, partition, topic_id(topic), self.segment_bytes)
            self.partitions.append(w)
            return w

        # page.views-0: none + gzip, a leader change from epoch 0 to 3 mid-way; everything
        # committed and flushed (HW = recovery point = log end).
        self.page_views = writer("page.views", 0)
        self._fill(self.page_views, 36, codecs=("none", "gzip"), epochs={0: 0, 18: 3})

        # click-stream-0: lz4, zstd, snappy; the high watermark lies inside the second-to-last
        # closed segment, so the last closed segment (and the one holding the HW) is not eligible.
        self.click0 = writer("click-stream", 0)
        self._fill(self.click0, 70, codecs=("lz4", "zstd", "snappy"), epochs={0: 5})
        closed = self.click0.segments[:-1]
        self.click0.high_watermark = closed[-2].batches[1].base_offset

        # click-stream-1: an idempotent, transactional producer with COMMIT markers; flushed only
        # up to an earlier segment boundary (recovery point < high watermark = log end).
        self.click1 = writer("click-stream", 1)
        self._fill(self.click1, 30, codecs=("zstd", "none"), epochs={0: 1, 12: 2, 20: 4},
                   producer=(7001, 0), transactional_every=3)
        self.click1.recovery_point = self.click1.segments[-3].base_offset

        # orders-0: DeleteRecords moved the log start offset into the first segment: it still
        # holds offsets ≥ the log start offset, so it is still tiered.
        self.orders = writer("orders", 0)
        self._fill(self.orders, 24, codecs=("gzip", "snappy", "lz4"), epochs={0: 0})
        self.orders.log_start_offset = self.orders.segments[0].batches[2].base_offset

        # Two segments other implementations wrote, each the closed first segment of a partition,
        # then an active segment written here (a new leader epoch after theirs).
        if self.third_party_dir is not None:
            for partition, name in enumerate(("kafka-gleam-00000000000000000000.log",
                                              "codecrafters-kafka-go-00000000000000000000.log")):
                w = writer("vendor.segments", partition)
                adopted = w.adopt_segment((self.third_party_dir / name).read_bytes())
                self.clock = max(self.clock, max(b.max_timestamp for b in adopted))
                self._fill(w, 4, codecs=("none", "zstd"), epochs={0: adopted[-1].leader_epoch + 1})

    def _fill(self, w: PartitionWriter, batches: int, *, codecs: tuple[str, ...], epochs: dict[int, int],
              producer: tuple[int, int] | None = None, transactional_every: int = 0) -> None:
        epoch = 0
        for i in range(batches):
            epoch = epochs.get(i, epoch)
            self.clock += 1_000
            records = random_records(self.rng, self.rng.randrange(4, 14), self.clock)
            # Every transactional_every-th batch comes from a plain (non-idempotent) producer.
            txn = bool(transactional_every) and i % transactional_every != transactional_every - 1
            w.append(records, leader_epoch=epoch, codec=codecs[i % len(codecs)],
                     producer=producer if txn else None, transactional=txn)
            if txn and (i + 2) % transactional_every == 0:
                w.end_transaction(producer, leader_epoch=epoch, timestamp=self.clock + 500)

    def append_roll(self) -> None:
        """page.views-0 grows until it has rolled once more; still all committed and flushed."""
        w = self.page_views
        before = len(w.segments)
        epoch = w.lineage[-1][0]
        while len(w.segments) == before:
            self.clock += 1_000
            w.append(random_records(self.rng, self.rng.randrange(4, 14), self.clock), leader_epoch=epoch, codec="gzip")

    def write(self, log_dir: Path) -> LogDirDescription:
        return write_log_dir(log_dir, self.partitions)
