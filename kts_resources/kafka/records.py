"""Kafka record batches: the header-only scan, the full decode, and the batch writer.

Magic 2 (``DefaultRecordBatch``) in full; magic 0/1 message sets (``LegacyRecord``) readable,
compressed wrappers included. Everything is big-endian. Pure: bytes in, values out.

The header-only scan (:func:`scan_batches`) reads the 61-byte batch headers and, when asked,
checks each batch's CRC-32C, but never decompresses or decodes records; the inventory's
:func:`tally_batches` does the same without a header object per batch.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from kts_resources.kafka.crc import crc32c

from . import codecs
from .errors import CodecError, CorruptRecordError

# --- layout -------------------------------------------------------------------------------------

# baseOffset, batchLength: the "log overhead" every format starts with.
LOG_OVERHEAD = 12
# Magic 2 header: baseOffset q, batchLength i, partitionLeaderEpoch i, magic b, crc I,
# attributes h, lastOffsetDelta i, baseTimestamp q, maxTimestamp q, producerId q, producerEpoch h,
# baseSequence i, recordsCount i.
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_HEADER_SIZE = _V2_HEADER.size  # 61
V2_CRC_START = 21  # the CRC covers attributes .. end, so offset/length/epoch can be rewritten
_V2_CRC_FIELD = struct.Struct(">I")
# Legacy message: offset q, size i, crc I, magic b, attributes b (+ timestamp q in v1).
_LEGACY_HEADER = struct.Struct(">qiIbb")
_LEGACY_TIMESTAMP = struct.Struct(">q")
LEGACY_V0_HEADER_SIZE = 12 + 4 + 1 + 1 + 4 + 4  # up to an empty key and value
LEGACY_V1_HEADER_SIZE = LEGACY_V0_HEADER_SIZE + 8

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1

ATTR_CODEC_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08  # 0 CreateTime, 1 LogAppendTime
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
# Kafka's ControlRecordType: the two transaction markers, then KRaft's own control records.
CONTROL_TYPE_NAMES = {
    CONTROL_ABORT: "ABORT",
    CONTROL_COMMIT: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}


# --- values -------------------------------------------------------------------------------------


@dataclass(slots=True)
class BatchHeader:
    """One batch (magic 2) or one top-level message/wrapper (magic 0/1) as it sits in a segment.

    Not frozen on purpose: a frozen dataclass's __init__ costs ~9x more, and the header scan makes
    one of these per batch (bench/scan_bench.py). Treat it as read-only.
    """

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    # None when the scan was asked not to check CRCs.
    crc_ok: bool | None = None

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def codec(self) -> int:
        return self.attributes & ATTR_CODEC_MASK

    @property
    def codec_name(self) -> str:
        return codecs.CODEC_NAMES[self.codec] if self.codec < len(codecs.CODEC_NAMES) else f"unknown({self.codec})"

    @property
    def timestamp_type(self) -> int:
        if self.magic == 0:
            return CREATE_TIME  # magic 0 has no timestamps at all
        return LOG_APPEND_TIME if self.attributes & ATTR_TIMESTAMP_TYPE else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & ATTR_CONTROL)

    @property
    def has_delete_horizon(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & ATTR_DELETE_HORIZON)

    def to_json(self) -> dict:
        """The batch fields of ARCHITECTURE.md's JSON contract."""
        return {
            "position": self.position,
            "size": self.size,
            "base_offset": self.base_offset,
            "last_offset": self.last_offset,
            "leader_epoch": self.partition_leader_epoch,
            "magic": self.magic,
            "codec": self.codec_name,
            "crc": self.crc,
            "crc_ok": self.crc_ok,
            "is_control": self.is_control,
            "is_transactional": self.is_transactional,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "base_sequence": self.base_sequence,
            "timestamp_type": "LogAppendTime" if self.timestamp_type == LOG_APPEND_TIME else "CreateTime",
            "base_timestamp": self.base_timestamp,
            "max_timestamp": self.max_timestamp,
            "record_count": self.record_count,
        }


Header = tuple[str, "bytes | None"]


@dataclass(slots=True)
class Record:
    """A decoded record with its absolute offset and timestamp.

    Not frozen on purpose, like :class:`BatchHeader`: a full read makes one per record, and a
    frozen dataclass's __init__ costs several times more. Treat it as read-only.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """The key and value of the one record in a control batch: a transaction marker or a KRaft control record."""

    version: int
    type: int  # CONTROL_ABORT, CONTROL_COMMIT, or one of KRaft's (see CONTROL_TYPE_NAMES)
    coordinator_epoch: int | None  # transaction markers only

    @property
    def type_name(self) -> str:
        return CONTROL_TYPE_NAMES.get(self.type, f"UNKNOWN({self.type})")


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to write: the writer assigns its offset from its place in the batch."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = ()


@dataclass(frozen=True, slots=True)
class InvalidBytes:
    """Bytes after the last whole batch that do not form a batch (a crash's partial write)."""

    position: int
    length: int
    reason: str


@dataclass(slots=True)
class SegmentScan:
    """What a header-only scan found: the whole batches and any invalid bytes after them."""

    batches: list[BatchHeader] = field(default_factory=list)
    valid_bytes: int = 0
    invalid: InvalidBytes | None = None
    # How many of ``batches`` failed their CRC: a reader checks this once instead of every header.
    crc_failure_count: int = 0

    @property
    def crc_failures(self) -> list[BatchHeader]:
        return [b for b in self.batches if b.crc_ok is False] if self.crc_failure_count else []


def minimum_batch_length(magic: int) -> int:
    """The smallest batchLength (magic 2) or message size (magic 0/1) a frame of ``magic`` can
    declare: its header without the offset and length fields before it."""
    return (V2_HEADER_SIZE if magic == 2 else LEGACY_V1_HEADER_SIZE if magic == 1 else LEGACY_V0_HEADER_SIZE) - LOG_OVERHEAD


def framing_problem(magic: int, batch_length: int, remaining: int) -> str:
    """Why the ``remaining`` bytes at a position, whose header says ``magic`` and ``batch_length``,
    are not a whole batch (magic 2) or message (magic 0/1): the reason an :class:`InvalidBytes` gives."""
    legacy = magic != 2
    minimum = minimum_batch_length(magic)
    if batch_length < minimum:
        return f"{'message size' if legacy else 'batch length'} {batch_length} is below the minimum of {minimum}"
    return f"partial {'message' if legacy else 'batch'}: {remaining} of {batch_length + LOG_OVERHEAD} bytes"


# --- varints ------------------------------------------------------------------------------------


_UINT32_MASK = 0xFFFFFFFF
_UINT64_MASK = 0xFFFFFFFFFFFFFFFF


def encode_varint(value: int) -> bytes:
    """Zigzag, then base-128 with the low group first (Kafka's ByteUtils.writeVarlong)."""
    v = ((value << 1) ^ (value >> 63)) & _UINT64_MASK
    out = bytearray()
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def decode_varint(buf: bytes | memoryview, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """Read one zigzag varint/varlong at ``pos``; return (value, position after it).

    ``max_bytes`` is 5 for a varint (int32) and 10 for a varlong, as Kafka enforces. Like Kafka's
    ``ByteUtils``, the bits of the last group that do not fit the type are dropped, so the value
    always lies in int32 (int64).
    """
    result = 0
    shift = 0
    end = len(buf)
    mask = _UINT32_MASK if max_bytes <= 5 else _UINT64_MASK
    for i in range(max_bytes):
        if pos >= end:
            raise CorruptRecordError("varint runs past the end of the data")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            result &= mask
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise CorruptRecordError(f"varint longer than {max_bytes} bytes")


# --- header-only scan ---------------------------------------------------------------------------


def scan_batches(data: bytes | memoryview, *, verify_crc: bool = True, start: int = 0) -> SegmentScan:
    """Walk a segment's batches reading only their headers (and CRCs when ``verify_crc``).

    Stops at the first bytes that cannot be a whole batch and reports them as ``invalid`` rather
    than raising: that is what a crash leaves behind, and Kafka's recovery truncates there.
    """
    view = memoryview(data)
    end = len(view)
    scan = SegmentScan(valid_bytes=start)
    pos = start
    append = scan.batches.append
    unpack_v2 = _V2_HEADER.unpack_from
    header_size = V2_HEADER_SIZE
    min_v2_length = V2_HEADER_SIZE - LOG_OVERHEAD
    crc_start = V2_CRC_START
    while pos < end:
        remaining = end - pos
        if remaining >= header_size and view[pos + 16] == 2:
            # The common case, a whole magic-2 header: one unpack gives the length too.
            f = unpack_v2(view, pos)
            batch_length = f[1]
            size = batch_length + LOG_OVERHEAD
            if batch_length < min_v2_length or size > remaining:
                scan.invalid = InvalidBytes(pos, remaining, framing_problem(2, batch_length, remaining))
                break
            crc_ok = None
            if verify_crc:
                crc_ok = crc32c(view[pos + crc_start : pos + size]) == f[4]
                if not crc_ok:
                    scan.crc_failure_count += 1
            # The unpacked fields are the header's in order (f[3] is the magic, 2).
            append(BatchHeader(pos, *f, crc_ok))
            pos += size
            continue
        if remaining < LOG_OVERHEAD + 5:
            scan.invalid = InvalidBytes(pos, remaining, f"partial batch header: {remaining} bytes")
            break
        batch_length = int.from_bytes(view[pos + 8 : pos + 12], "big", signed=True)
        magic = view[pos + 16]
        size = batch_length + LOG_OVERHEAD
        if magic == 2:
            # Fewer bytes left than a magic-2 header: too short a length, or a batch cut off.
            scan.invalid = InvalidBytes(pos, remaining, framing_problem(2, batch_length, remaining))
            break
        elif magic in (0, 1):
            if batch_length < minimum_batch_length(magic) or size > remaining:
                scan.invalid = InvalidBytes(pos, remaining, framing_problem(magic, batch_length, remaining))
                break
            try:
                legacy = _legacy_header(view, pos, size, verify_crc)
            except (CorruptRecordError, CodecError) as e:
                # A wrapper whose inner messages cannot be read: its framing is whole, so it is a
                # corrupt batch rather than trailing garbage.
                legacy = _legacy_header(view, pos, size, verify_crc, inner_error=e)
            if legacy.crc_ok is False:
                scan.crc_failure_count += 1
            append(legacy)
        else:
            scan.invalid = InvalidBytes(pos, remaining, f"unknown magic {magic}")
            break
        pos += size
    # Everything before pos is whole batches: where the loop ran out of data or met invalid bytes.
    scan.valid_bytes = pos
    return scan


@dataclass(slots=True)
class SegmentVerification:
    """What the copy needs to know of a segment, from one pass (:func:`verify_segment`)."""

    size: int
    crc32c: int  # of the whole file: the checksum its remote object gets
    batches: int = 0
    last_offset: int | None = None
    last_position: int | None = None  # of the last whole batch
    max_timestamp: int = NO_TIMESTAMP
    # Leader epoch → offset of the first batch written in it, in the order they appear (magic 2
    # only: magic 0/1 messages carry no epoch).
    epochs: dict[int, int] = field(default_factory=dict)
    # The first problem, as (byte position, what is wrong): a CRC failure or invalid bytes.
    problem: tuple[int, str] | None = None
    # With ``chunk_bytes``: the segment's runs of whole batches of at most that many bytes (a larger
    # batch alone), each (first offset, last offset, first timestamp, max timestamp, position,
    # bytes) — the remote log index's entries, from the same pass. None when not asked for, or when
    # the segment holds anything but magic-2 batches (the index build then reads it itself).
    chunks: list[tuple[int, int, int, int, int, int]] | None = None


# baseOffset q, batchLength i, partitionLeaderEpoch i, magic b, crc I, attributes h,
# lastOffsetDelta i, baseTimestamp q, maxTimestamp q: the part of the header the copy needs.
_V2_VERIFY_HEADER = struct.Struct(">qiibIhiqq")


def verify_segment(data: bytes | memoryview, *, chunk_bytes: int | None = None) -> SegmentVerification:
    """Check every batch's CRC and collect the few facts a copy records, in one pass (with
    ``chunk_bytes``, also the remote log index's chunks: ``SegmentVerification.chunks``).

    The copy's hot loop (bench/copy_bench.py): unlike :func:`scan_batches` it keeps no per-batch
    objects, and it also takes the whole file's CRC-32C while the bytes are in cache. It stops at
    the first problem; anything but a whole, CRC-clean magic-2 batch goes through
    :func:`scan_batches` from that position, so framing and legacy formats are judged (and worded)
    in one place. A file is verified in windows read into memory by
    ``segment.verify_segment_file`` with the same verdict.
    """
    view = memoryview(data)
    verifier = SegmentVerifier(chunk_bytes)
    pos = verifier.magic_2_batches(view, 0)
    if pos < len(view) and verifier.problem is None:
        rest = verifier.any_batches(view, 0, pos)
        if verifier.problem is None and rest.invalid is not None:
            verifier.problem = (rest.invalid.position, f"{rest.invalid.length} invalid bytes ({rest.invalid.reason})")
    return verifier.finish(len(view), crc32c(view))


class SegmentVerifier:
    """:func:`verify_segment`'s pass over a segment handed to it in consecutive windows (a whole
    file at once, or reads of it): ``magic_2_batches`` walks whole CRC-clean magic-2 batches,
    ``any_batches`` whatever else :func:`scan_batches` judges; each returns where it stopped, and
    the caller brings the bytes from there (a batch a window cut off) or judges them."""

    __slots__ = ("chunk_bytes", "chunks", "epochs", "max_timestamp", "last_offset", "last_position", "epoch",
                 "batches", "problem", "run_position", "run_offset", "run_first_ts", "run_max_ts", "run_bytes", "any_seen")

    def __init__(self, chunk_bytes: int | None = None):
        self.chunk_bytes = chunk_bytes
        # The open chunk: its first batch's position, offset and timestamp, its max timestamp, its bytes.
        self.chunks: list | None = [] if chunk_bytes else None
        self.run_position = self.run_offset = self.run_first_ts = self.run_max_ts = self.run_bytes = 0
        self.epochs: dict[int, int] = {}
        self.max_timestamp = NO_TIMESTAMP
        self.last_offset: int | None = None
        self.last_position: int | None = None
        self.epoch: int | None = None
        self.batches = 0
        self.problem: tuple[int, str] | None = None
        self.any_seen = False  # anything but whole magic-2 batches: no index chunks

    def magic_2_batches(self, view: memoryview, base: int) -> int:
        """Walk ``view`` (the segment from byte ``base``) from its start while it holds whole,
        CRC-clean magic-2 batches; a CRC failure is the ``problem``. Returns where it stopped."""
        end = len(view)
        unpack = _V2_VERIFY_HEADER.unpack_from
        min_v2_length = V2_HEADER_SIZE - LOG_OVERHEAD
        epochs = self.epochs
        max_timestamp, last_offset, last_position = self.max_timestamp, self.last_offset, self.last_position
        epoch, batches = self.epoch, self.batches
        chunks, chunk_bytes = self.chunks, self.chunk_bytes
        run_position, run_offset, run_first_ts = self.run_position, self.run_offset, self.run_first_ts
        run_max_ts, run_bytes = self.run_max_ts, self.run_bytes
        pos = 0
        while pos < end:
            if end - pos < V2_HEADER_SIZE or view[pos + 16] != 2:
                break  # short, legacy or garbage: any_batches decides which
            base_offset, batch_length, leader_epoch, _magic, crc, _attributes, last_delta, _base_ts, max_ts = unpack(view, pos)
            size = batch_length + LOG_OVERHEAD
            if batch_length < min_v2_length or size > end - pos:
                break
            if crc32c(view[pos + V2_CRC_START : pos + size]) != crc:
                self.problem = (base + pos, "batch fails its CRC")
                break
            if leader_epoch != epoch:
                epoch = leader_epoch
                if leader_epoch >= 0 and leader_epoch not in epochs:
                    epochs[leader_epoch] = base_offset
            if max_ts > max_timestamp:
                max_timestamp = max_ts
            if chunks is not None:
                if run_bytes and run_bytes + size > chunk_bytes:
                    chunks.append((run_offset, last_offset, run_first_ts, run_max_ts, run_position, run_bytes))
                    run_bytes = 0
                if run_bytes:
                    if max_ts > run_max_ts:
                        run_max_ts = max_ts
                else:
                    run_position, run_offset, run_first_ts, run_max_ts = base + pos, base_offset, _base_ts, max_ts
                run_bytes += size
            last_offset = base_offset + last_delta
            last_position = base + pos
            batches += 1
            pos += size
        self.max_timestamp, self.last_offset, self.last_position = max_timestamp, last_offset, last_position
        self.epoch, self.batches = epoch, batches
        self.run_position, self.run_offset, self.run_first_ts = run_position, run_offset, run_first_ts
        self.run_max_ts, self.run_bytes = run_max_ts, run_bytes
        return pos

    def any_batches(self, view: memoryview, base: int, start: int) -> SegmentScan:
        """:func:`scan_batches` of ``view`` from ``start`` (positions within ``view``, which holds
        the segment from byte ``base``): its whole batches are taken in, a CRC failure is the
        ``problem``; the scan says where it stopped and why (``invalid``, which may just be a batch
        the window cut off)."""
        rest = scan_batches(view, verify_crc=True, start=start)
        for batch in rest.batches:
            self.any_seen = True
            if batch.crc_ok is False:
                self.problem = (base + batch.position, "batch fails its CRC")
                break
            if batch.magic == 2 and batch.partition_leader_epoch >= 0:
                self.epochs.setdefault(batch.partition_leader_epoch, batch.base_offset)
            self.max_timestamp = max(self.max_timestamp, batch.max_timestamp)
            self.last_offset, self.last_position = batch.last_offset, base + batch.position
            self.batches += 1
        if rest.invalid is not None:  # a verdict only once the caller knows it is not a cut-off batch
            rest.invalid = InvalidBytes(base + rest.invalid.position, rest.invalid.length, rest.invalid.reason)
        return rest

    def finish(self, size: int, crc: int) -> SegmentVerification:
        """The verdict on a segment of ``size`` bytes whose CRC-32C is ``crc``."""
        chunks = self.chunks
        if chunks is not None and self.run_bytes and self.problem is None:
            chunks.append((self.run_offset, self.last_offset, self.run_first_ts, self.run_max_ts, self.run_position, self.run_bytes))
            self.run_bytes = 0
        result = SegmentVerification(size=size, crc32c=crc, batches=self.batches, last_offset=self.last_offset,
                                     last_position=self.last_position, max_timestamp=self.max_timestamp,
                                     epochs=self.epochs, problem=self.problem)
        result.chunks = chunks if not self.any_seen and self.problem is None else None
        return result


@dataclass(slots=True)
class BatchTally:
    """A segment's batches summed up rather than listed (:func:`tally_batches`): what the
    inventory keeps of them, at a fraction of the cost of a ``BatchHeader`` per batch."""

    batch_count: int = 0
    record_count: int = 0
    last_offset: int | None = None
    max_timestamp: int | None = None  # None until a batch is seen
    first_max_timestamp: int | None = None  # the first batch's max timestamp
    leader_epochs: set[int] = field(default_factory=set)  # the non-negative ones
    crc_failures: list[int] = field(default_factory=list)  # byte positions of batches failing their CRC

    def add(self, header: BatchHeader, position: int) -> None:
        """One batch known by its header (the slow path's, or a legacy message's)."""
        self.batch_count += 1
        self.record_count += header.record_count
        self.last_offset = header.last_offset
        if self.first_max_timestamp is None:
            self.first_max_timestamp = header.max_timestamp
        if self.max_timestamp is None or header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
        if header.partition_leader_epoch >= 0:
            self.leader_epochs.add(header.partition_leader_epoch)
        if header.crc_ok is False:
            self.crc_failures.append(position)


# (baseOffset) batchLength i, partitionLeaderEpoch i, magic b, crc I, (attributes, lastOffsetDelta,
# baseTimestamp) maxTimestamp q, (producerId, producerEpoch, baseSequence) recordsCount i: what the
# tally needs of every batch. The last offset is read once, from the last batch.
_V2_TALLY_HEADER = struct.Struct(">8xiibI14xq14xi")
# baseOffset q, (batchLength, partitionLeaderEpoch, magic, crc, attributes) lastOffsetDelta i.
_V2_LAST_OFFSET = struct.Struct(">q15xi")
# Below any int64 timestamp: the running maximum before the first batch.
_BELOW_ANY_TIMESTAMP = -(2**63) - 1


def walk_v2_batches_python(data: bytes | memoryview) -> tuple[int, int, int, int | None, list[int], list[int], int]:
    """Walk whole magic-2 batches from the start of ``data``, checking every CRC-32C, until the
    first bytes that are not one. Returns (where it stopped, batches, records, the maximum of
    their max timestamps or None, the non-negative leader epochs each time the epoch changes from
    the batch before, positions of the batches failing their CRC, position of the last batch).

    :func:`tally_batches`'s per-batch loop; ``_batch_tally.walk_v2_batches`` (C, built with the
    package where a compiler was at hand) is the same walk and is used when importable: at ~1.6 KB
    batches this loop pays more per batch in the interpreter than the CRC-32C of the batch costs
    (bench/inventory_bench.py). tests/test_records_tally_walk.py holds the two equal."""
    view = memoryview(data)
    end = len(view)
    unpack = _V2_TALLY_HEADER.unpack_from
    min_v2_length = V2_HEADER_SIZE - LOG_OVERHEAD
    crc_start = V2_CRC_START
    epoch_changes: list[int] = []
    failures: list[int] = []
    count = records = 0
    max_timestamp = _BELOW_ANY_TIMESTAMP
    epoch = None
    last = pos = 0
    while end - pos >= V2_HEADER_SIZE:
        batch_length, leader_epoch, magic, crc, max_ts, record_count = unpack(view, pos)
        size = batch_length + LOG_OVERHEAD
        if magic != 2 or batch_length < min_v2_length or size > end - pos:
            break
        if crc32c(view[pos + crc_start : pos + size]) != crc:
            failures.append(pos)
        if leader_epoch != epoch:
            epoch = leader_epoch
            if leader_epoch >= 0:
                epoch_changes.append(leader_epoch)
        if max_ts > max_timestamp:
            max_timestamp = max_ts
        records += record_count
        count += 1
        last = pos
        pos += size
    return pos, count, records, (max_timestamp if count else None), epoch_changes, failures, last


try:
    from ._batch_tally import walk_v2_batches
except ImportError:  # built without a compiler (the extension is optional): the same walk in Python
    walk_v2_batches = walk_v2_batches_python


def tally_batches(data: bytes | memoryview, tally: BatchTally, *, base: int = 0) -> SegmentScan:
    """:func:`scan_batches` with every CRC checked, but the batches go into ``tally`` (positions
    as ``base`` + their place in ``data``) and the scan returned lists none: its ``valid_bytes``
    and ``invalid`` are what scan_batches gives. The inventory's hot loop (``kts segments`` and the
    Spark inventory alike); whatever is not a whole magic-2 batch goes through scan_batches from
    its position, so framing and legacy formats are judged and worded in one place.

    The magic-2 batches are walked by :data:`walk_v2_batches` (C where built, else
    :func:`walk_v2_batches_python`); the first batch's and the last batch's offsets are read once
    after it (bench/inventory_bench.py)."""
    view = memoryview(data)
    end = len(view)
    pos, count, records, max_ts, epoch_changes, failures, last = walk_v2_batches(view)
    if count:
        tally.leader_epochs.update(epoch_changes)
        if failures:
            tally.crc_failures.extend(base + p for p in failures)
        if tally.first_max_timestamp is None:
            tally.first_max_timestamp = _V2_TALLY_HEADER.unpack_from(view, 0)[4]
        base_offset, last_delta = _V2_LAST_OFFSET.unpack_from(view, last)
        tally.last_offset = base_offset + last_delta
        if tally.max_timestamp is None or max_ts > tally.max_timestamp:
            tally.max_timestamp = max_ts
        tally.batch_count += count
        tally.record_count += records
    if pos >= end:
        return SegmentScan(valid_bytes=pos)
    rest = scan_batches(view, verify_crc=True, start=pos)
    for batch in rest.batches:
        tally.add(batch, base + batch.position)
    return SegmentScan(valid_bytes=rest.valid_bytes, invalid=rest.invalid, crc_failure_count=0)


# batchLength i at 8, magic b at 16, crc I at 17: what checking a batch needs.
_V2_FRAME = struct.Struct(">8xi4xbI")


def verified_batch_positions(data: bytes | memoryview) -> tuple[list[int], int]:
    """The positions of the whole, CRC-clean magic-2 batches from the start of ``data``, and where
    they end. Stops at the first anything else (a legacy message, bad framing, a CRC failure):
    :func:`scan_batches` from there judges and words it. The read path's hot loop: it builds no
    header (``BatchHeader`` objects cost more than the CRCs; :func:`read_v2_header` makes one when
    it is wanted)."""
    view = memoryview(data)
    end = len(view)
    positions: list[int] = []
    add = positions.append
    frame = _V2_FRAME.unpack_from
    min_v2_length = V2_HEADER_SIZE - LOG_OVERHEAD
    pos = 0
    while end - pos >= V2_HEADER_SIZE:
        batch_length, magic, crc = frame(view, pos)
        size = batch_length + LOG_OVERHEAD
        if magic != 2 or batch_length < min_v2_length or size > end - pos or crc32c(view[pos + V2_CRC_START : pos + size]) != crc:
            break
        add(pos)
        pos += size
    return positions, pos


def read_v2_header(data: bytes | memoryview, position: int, crc_ok: bool | None = None) -> BatchHeader:
    """The header of the magic-2 batch at ``position`` (its framing already checked)."""
    return BatchHeader(position, *_V2_HEADER.unpack_from(data, position), crc_ok)


def iter_batch_headers(data: bytes | memoryview, *, verify_crc: bool = True) -> Iterator[BatchHeader]:
    """The whole batches of a segment (see :func:`scan_batches`), ignoring invalid trailing bytes."""
    return iter(scan_batches(data, verify_crc=verify_crc).batches)


# --- full decode (magic 2) ----------------------------------------------------------------------


def batch_crc_ok(data: bytes | memoryview, header: BatchHeader) -> bool:
    """Recompute a batch's checksum: CRC-32C for magic 2, CRC-32 for each legacy message."""
    view = memoryview(data)
    if header.magic == 2:
        return crc32c(view[header.position + V2_CRC_START : header.position + header.size]) == header.crc
    return zlib.crc32(view[header.position + 16 : header.position + header.size]) == header.crc


def decode_batch(data: bytes | memoryview, header: BatchHeader, *, verify_crc: bool = True) -> list[Record]:
    """Decode every record of one batch found by :func:`scan_batches` in the same ``data``.

    Raises :class:`CorruptRecordError` (positioned at the batch) on a CRC mismatch or records that
    do not parse.
    """
    view = memoryview(data)
    try:
        if verify_crc and not batch_crc_ok(view, header):
            raise CorruptRecordError(f"batch at offset {header.base_offset} fails its CRC (stored {header.crc:#010x})")
        if header.magic < 2:
            return [r for r, _ in _legacy_records(view, header.position, header.size)]
        body = view[header.position + V2_HEADER_SIZE : header.position + header.size]
        if header.codec == codecs.NONE:
            return _decode_v2_records(body.tobytes(), header)
        return _decode_v2_records(codecs.decompress(header.codec, body, magic=2), header)
    except (CorruptRecordError, CodecError) as e:
        if isinstance(e, CodecError):
            e = CorruptRecordError(f"batch at offset {header.base_offset}: {e.message}")
        raise e.located(position=header.position) from None


def _decode_v2_records(body: bytes, header: BatchHeader) -> list[Record]:
    # The hot loop of every full read (bench/scan_bench.py): varints are inlined with a one-byte fast
    # path (most lengths, deltas and counts fit one byte) and the buffer is bytes, which indexes
    # faster than a memoryview. Running off the end surfaces as IndexError, turned into corruption.
    records: list[Record] = []
    append = records.append
    pos = 0
    end = len(body)
    base_offset = header.base_offset
    log_append = header.timestamp_type == LOG_APPEND_TIME
    base_timestamp = header.max_timestamp if log_append else header.base_timestamp
    try:
        for _ in range(header.record_count):
            b = body[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif body[pos + 1] < 0x80:  # records of 64 B to 8 KiB: a two-byte length
                raw = (b & 0x7F) | (body[pos + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                length, pos = decode_varint(body, pos, 5)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise CorruptRecordError(f"record length {length} runs past the end of the batch")
            pos += 1  # record attributes: unused
            b = body[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                ts_delta, pos = decode_varint(body, pos, 10)
            b = body[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = decode_varint(body, pos, 5)
            key, pos = _read_bytes(body, pos, record_end)
            value, pos = _read_bytes(body, pos, record_end)
            b = body[pos]
            if b == 0:
                headers = ()
                pos += 1
            else:
                header_count, pos = decode_varint(body, pos, 5)
                if header_count < 0:
                    raise CorruptRecordError(f"negative header count {header_count}")
                header_list = []
                for _ in range(header_count):
                    hkey, pos = _read_bytes(body, pos, record_end)
                    if hkey is None:
                        raise CorruptRecordError("null header key")
                    hvalue, pos = _read_bytes(body, pos, record_end)
                    # Kafka stores header keys as bytes and Java decodes them with replacement, so a
                    # key that is not UTF-8 is still a readable record, not a corrupt one.
                    header_list.append((hkey.decode("utf-8", "replace"), hvalue))
                headers = tuple(header_list)
            if pos != record_end:
                raise CorruptRecordError(f"record declares {length} bytes but holds {length + pos - record_end}")
            append(Record(base_offset + offset_delta, base_timestamp if log_append else base_timestamp + ts_delta, key, value, headers))
    except IndexError:
        raise CorruptRecordError(f"record {len(records)} runs past the end of the batch") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the batch's {header.record_count} records")
    return records


def _read_bytes(body: bytes, pos: int, limit: int) -> tuple[bytes | None, int]:
    b = body[pos]
    if b < 0x80:
        length = (b >> 1) ^ -(b & 1)
        pos += 1
    elif body[pos + 1] < 0x80:
        raw = (b & 0x7F) | (body[pos + 1] << 7)
        length = (raw >> 1) ^ -(raw & 1)
        pos += 2
    else:
        length, pos = decode_varint(body, pos, 5)
    if length < 0:
        return None, pos  # any negative length is null to Kafka's DefaultRecord, not just -1
    if pos + length > limit:
        raise CorruptRecordError(f"field of {length} bytes runs past the end of its record")
    return body[pos : pos + length], pos + length


def parse_control_record(record: Record) -> ControlRecord:
    """Read a control record: key = version int16 + type int16; a transaction marker's value is
    version int16 + coordinatorEpoch int32 (other control types have values of their own)."""
    if record.key is None or len(record.key) < 4:
        raise CorruptRecordError(f"control record at offset {record.offset} has a key of {0 if record.key is None else len(record.key)} bytes")
    version, type_ = struct.unpack_from(">hh", record.key)
    coordinator_epoch = None
    if type_ in (CONTROL_ABORT, CONTROL_COMMIT) and record.value is not None and len(record.value) >= 6:
        coordinator_epoch = struct.unpack_from(">i", record.value, 2)[0]
    return ControlRecord(version, type_, coordinator_epoch)


# --- legacy message sets (magic 0/1) ------------------------------------------------------------


def _legacy_header(view: memoryview, pos: int, size: int, verify_crc: bool, inner_error: Exception | None = None) -> BatchHeader:
    """Describe a legacy top-level message (or compressed wrapper) as a batch header."""
    offset, length, crc, magic, attributes = _LEGACY_HEADER.unpack_from(view, pos)
    timestamp = _LEGACY_TIMESTAMP.unpack_from(view, pos + 18)[0] if magic == 1 else NO_TIMESTAMP
    crc_ok = zlib.crc32(view[pos + 16 : pos + size]) == crc if verify_crc else None
    base_offset, count, max_ts = offset, 1, timestamp
    if attributes & ATTR_CODEC_MASK and inner_error is None and crc_ok is not False:
        # A wrapper's offset is its LAST inner offset; the base offset and count need the inner set.
        inner = [r for r, _ in _legacy_records(view, pos, size)]
        if inner:
            base_offset, count = inner[0].offset, len(inner)
            if magic == 1 and not attributes & ATTR_TIMESTAMP_TYPE:
                max_ts = max(r.timestamp for r in inner)
    return BatchHeader(
        position=pos, base_offset=base_offset, batch_length=length, partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
        magic=magic, crc=crc, attributes=attributes, last_offset_delta=offset - base_offset,
        base_timestamp=timestamp, max_timestamp=max_ts, producer_id=NO_PRODUCER_ID, producer_epoch=-1,
        base_sequence=-1, record_count=count, crc_ok=crc_ok if inner_error is None else False,
    )


def _legacy_records(view: memoryview, pos: int, size: int, depth: int = 0) -> list[tuple[Record, int]]:
    """The records of one top-level legacy message; a compressed wrapper yields its inner messages.

    Returns (record, wrapper-relative inner offset) pairs; inner offsets are made absolute here.
    """
    offset, length, crc, magic, attributes = _LEGACY_HEADER.unpack_from(view, pos)
    p = pos + 18
    timestamp = NO_TIMESTAMP
    if magic == 1:
        timestamp = _LEGACY_TIMESTAMP.unpack_from(view, p)[0]
        p += 8
    end = pos + size
    key, p = _legacy_bytes(view, p, end)
    value, p = _legacy_bytes(view, p, end)
    if p != end:
        raise CorruptRecordError(f"message at offset {offset} declares {size - 12} bytes but holds {p - pos - 12}")
    codec = attributes & ATTR_CODEC_MASK
    if codec == codecs.NONE:
        return [(Record(offset, timestamp, key, value), offset)]
    if depth > 0:
        raise CorruptRecordError(f"nested compressed message at offset {offset}")
    if value is None:
        raise CorruptRecordError(f"compressed wrapper at offset {offset} has no value")
    inner_bytes = memoryview(codecs.decompress(codec, value, magic=magic))
    inner: list[tuple[Record, int]] = []
    q = 0
    while q < len(inner_bytes):
        if len(inner_bytes) - q < LOG_OVERHEAD + 5:
            raise CorruptRecordError(f"truncated inner message in wrapper at offset {offset}")
        inner_length = int.from_bytes(inner_bytes[q + 8 : q + 12], "big", signed=True)
        inner_size = inner_length + LOG_OVERHEAD
        if inner_length < LEGACY_V0_HEADER_SIZE - LOG_OVERHEAD or q + inner_size > len(inner_bytes):
            raise CorruptRecordError(f"inner message of {inner_length} bytes does not fit the wrapper at offset {offset}")
        if zlib.crc32(inner_bytes[q + 16 : q + inner_size]) != int.from_bytes(inner_bytes[q + 12 : q + 16], "big"):
            raise CorruptRecordError(f"inner message {len(inner)} of wrapper at offset {offset} fails its CRC")
        inner.extend(_legacy_records(inner_bytes, q, inner_size, depth + 1))
        q += inner_size
    if not inner:
        return []
    log_append = magic == 1 and attributes & ATTR_TIMESTAMP_TYPE
    if magic == 1:
        # Magic 1 inner offsets are relative (0..n-1); the wrapper carries the absolute last one.
        last_relative = inner[-1][1]
        fixed = [Record(offset - (last_relative - rel), timestamp if log_append else r.timestamp, r.key, r.value) for r, rel in inner]
    else:
        fixed = [r for r, _ in inner]
    return [(r, r.offset) for r in fixed]


def _legacy_bytes(view: memoryview, p: int, end: int) -> tuple[bytes | None, int]:
    if p + 4 > end:
        raise CorruptRecordError("message ends inside a length field")
    n = int.from_bytes(view[p : p + 4], "big", signed=True)
    p += 4
    if n < 0:
        return None, p
    if p + n > end:
        raise CorruptRecordError(f"field of {n} bytes runs past the end of its message")
    return bytes(view[p : p + n]), p + n


# --- reading a whole segment --------------------------------------------------------------------


def read_records(data: bytes | memoryview, *, verify_crc: bool = True) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Every whole batch of a segment with its decoded records, in order."""
    for header in scan_batches(data, verify_crc=False).batches:
        yield header, decode_batch(data, header, verify_crc=verify_crc)


# --- writing (magic 2) --------------------------------------------------------------------------


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None, headers: Iterable[Header] = ()) -> bytes:
    """One magic-2 record with its length prefix."""
    parts = [b"\x00", encode_varint(timestamp_delta), encode_varint(offset_delta)]
    for field_bytes in (key, value):
        if field_bytes is None:
            parts.append(encode_varint(-1))
        else:
            parts.append(encode_varint(len(field_bytes)))
            parts.append(field_bytes)
    headers = list(headers)
    parts.append(encode_varint(len(headers)))
    for hkey, hvalue in headers:
        encoded_key = hkey.encode("utf-8")
        parts.append(encode_varint(len(encoded_key)))
        parts.append(encoded_key)
        if hvalue is None:
            parts.append(encode_varint(-1))
        else:
            parts.append(encode_varint(len(hvalue)))
            parts.append(hvalue)
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def build_batch(
    records: Sequence[NewRecord],
    *,
    base_offset: int,
    codec: int = codecs.NONE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    log_append_time: int | None = None,
    compression_level: int | None = None,
) -> bytes:
    """Write one magic-2 batch, as a producer (CreateTime) or a broker (``log_append_time``) would.

    Offsets are ``base_offset + i`` for the i-th record. With ``log_append_time`` set, the batch is
    LogAppendTime and its base and max timestamps are that time, as the broker stamps them.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    if log_append_time is not None:
        base_ts = max_ts = log_append_time
        deltas = [0] * len(records)
    else:
        timestamps = [r.timestamp for r in records]
        base_ts = timestamps[0]
        max_ts = max(timestamps)
        deltas = [t - base_ts for t in timestamps]
    body = b"".join(encode_record(i, deltas[i], r.key, r.value, r.headers) for i, r in enumerate(records))
    if codec != codecs.NONE:
        body = codecs.compress(codec, body, level=compression_level)
    attributes = codec
    if log_append_time is not None:
        attributes |= ATTR_TIMESTAMP_TYPE
    if is_transactional:
        attributes |= ATTR_TRANSACTIONAL
    if is_control:
        attributes |= ATTR_CONTROL
    header = bytearray(
        _V2_HEADER.pack(
            base_offset, V2_HEADER_SIZE - LOG_OVERHEAD + len(body), partition_leader_epoch, 2, 0, attributes,
            len(records) - 1, base_ts, max_ts, producer_id, producer_epoch, base_sequence, len(records),
        )
    )
    crc = crc32c(body, crc32c(bytes(header[V2_CRC_START:])))
    _V2_CRC_FIELD.pack_into(header, 17, crc)
    return bytes(header) + body


def build_control_batch(
    *,
    base_offset: int,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker as the coordinator writes it: one control record, transactional, no codec."""
    key = struct.pack(">hh", 0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return build_batch(
        [NewRecord(timestamp, key, value)],
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        is_transactional=True,
        is_control=True,
    )


def with_base_offset_and_epoch(batch: bytes, base_offset: int, partition_leader_epoch: int) -> bytes:
    """Rewrite the two fields a broker assigns on append; the CRC does not cover them."""
    out = bytearray(batch)
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">i", out, 12, partition_leader_epoch)
    return bytes(out)


def restamp_batch(
    batch: bytes,
    *,
    add_attributes: int = 0,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    producer_id: int | None = None,
    producer_epoch: int | None = None,
    base_sequence: int | None = None,
) -> bytes:
    """Rewrite magic-2 header fields that the CRC covers, and recompute the CRC.

    What a broker does when it stamps LogAppendTime (attribute bit + maxTimestamp), and how the
    simulator makes many batches from one template without re-encoding the records.
    """
    out = bytearray(batch)
    f = list(_V2_HEADER.unpack_from(out, 0))
    f[5] |= add_attributes
    for index, value in ((7, base_timestamp), (8, max_timestamp), (9, producer_id), (10, producer_epoch), (11, base_sequence)):
        if value is not None:
            f[index] = value
    _V2_HEADER.pack_into(out, 0, *f)
    _V2_CRC_FIELD.pack_into(out, 17, crc32c(memoryview(out)[V2_CRC_START:]))
    return bytes(out)
