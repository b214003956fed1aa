"""Reading the tiered log back: Kafka's fetch and ListOffsets across the local and remote tiers.

The public API (README, "Reading the tiered log")::

    from kts_resources.reading.reader import TieredLogReader
    with TieredLogReader.from_environment() as reader:
        result = reader.fetch("orders", 0, offset=1234, max_bytes=1 << 20, isolation="read_committed")
        for record in result.records: ...
        reader.offsets("orders", 0, "earliest")        # also "earliest-local", "latest-tiered",
        reader.offsets("orders", 0, 1_700_000_000_000) # "latest", "max-timestamp", or a timestamp

A fetch returns whole batches from the one holding ``offset``, as Kafka's does: from the local log
while ``offset`` ≥ the local log start offset, else from the remote tier — offset →
remoteOffsetIndex → remoteLogIndex entry → one ranged GET of that entry's bytes (following entries
of the same object coalesced into the same request while ``max_bytes`` allows) → every batch
CRC-checked. A segment the remote log index does not cover yet is read as Kafka's own path does
(its offset index, then the segment). A fetch goes on across remote segments and into the local log
until ``max_bytes`` is used, never past the high watermark (``read_uncommitted``) or the last stable
offset (``read_committed``, which also drops aborted transactions). Control batches never surface as
records.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.reading import remote_index as ri
from kts_resources.reading.fetch_options import DEFAULT_MAX_BYTES, ISOLATION_LEVELS, READ_COMMITTED, READ_UNCOMMITTED  # noqa: F401 - the reader's callers name them here too
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.kafka.checkpoints import EpochEntry, epoch_for_offset
from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.kafka.files import file_tree, keep_large_buffers_in_the_heap
from kts_resources.kafka.indexes import OffsetPosition, decode_offset_index, lookup_offset, read_offset_index
from kts_resources.kafka.logdir import SegmentFiles
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import (
    CONTROL_ABORT,
    LOG_OVERHEAD,
    BatchHeader,
    Record,
    decode_batch,
    parse_control_record,
    read_v2_header,
    scan_batches,
    verified_batch_positions,
)
from kts_resources.kafka.snapshots import AbortedTxn, decode_aborted_txns, read_producer_snapshot, read_txn_index
from kts_resources.tiering.lineage import Span, copy_start_offset
from kts_resources.remote_log import IndexType, RemoteLogSegmentMetadata, RemoteResourceNotFoundError, RemoteStorageError
from kts_resources.tiering.partition_view import PartitionView, partition_view
from kts_resources.tiering.tiers import LocatedPartition, leader_epoch_lineage, locate_partitions, remote_epoch_starts

if TYPE_CHECKING:
    from kts_resources.reading.chunk_cache import ChunkCache
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.tiering.quotas import FetchQuotaManager
    from kts_resources.remote_storage.base import RemoteStorageManager

log = logging.getLogger(__name__)

# A local read takes this much beyond max_bytes so the first batch is whole in one read most times.
_LOCAL_READ_SLACK = 64 * 1024

# A magic-2 batch's base offset (bytes 0-7) and lastOffsetDelta (bytes 23-26): neither is under
# its CRC, which covers the batch from its attributes on.
_V2_OFFSETS = struct.Struct(">q15xi")

OFFSET_SPECS = ("earliest", "earliest-local", "latest-tiered", "latest", "max-timestamp")


class ReadError(Exception):
    """A read that cannot be answered; the message is the one line a user reads."""


class OffsetOutOfRangeError(ReadError):
    """An offset below the log start offset or above the log end offset (Kafka's OFFSET_OUT_OF_RANGE)."""


class UnknownPartitionError(ReadError):
    """A topic-partition in no log dir and not in the remote tier."""


class RemoteDataCorruptError(ReadError):
    """Remote bytes that fail their batch CRC, do not frame as batches, or whose batches claim
    offsets the metadata store does not give their segment: never returned as records."""


class LocalSegmentDamagedError(ReadError):
    """A local segment whose bytes are not its batches: bad framing (zeros, garbage), a CRC
    failure, or batches whose offsets do not belong in it (a foreign file named like the segment).
    A read takes the offsets from the remote tier when it holds them, and raises this otherwise."""

    def __init__(self, log_path: Path, position: int, reason: str):
        super().__init__(f"{log_path}: byte {position}: {reason}")
        self.log_path, self.position = log_path, position


# --- results ------------------------------------------------------------------------------------


@dataclass(slots=True)
class FetchedRecord:
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    leader_epoch: int

    def to_json(self) -> dict:
        import base64

        def b64(b: bytes | None) -> str | None:
            return None if b is None else base64.b64encode(b).decode("ascii")

        return {"offset": self.offset, "timestamp": self.timestamp, "key": b64(self.key), "value": b64(self.value),
                "headers": [[k, b64(v)] for k, v in self.headers]}


class FetchedBatch:
    """One whole batch as stored, and which tier it came from. ``buffer`` is the chunk it was read
    in (``position`` is its place there): a fetch slices nothing it does not have to. A remote
    chunk's batches get their header when it is first asked for (:meth:`verified`): a sequential
    reader looks at a chunk's first and last, and the headers cost more than the CRCs."""

    __slots__ = ("_header", "buffer", "remote", "position", "size")

    def __init__(self, header: BatchHeader, buffer: bytes, remote: bool):
        self._header, self.buffer, self.remote = header, buffer, remote
        self.position, self.size = header.position, header.size

    @classmethod
    def verified(cls, buffer: bytes, position: int, size: int, remote: bool) -> "FetchedBatch":
        """A magic-2 batch whose framing and CRC were checked (``verified_batch_positions``)."""
        batch = cls.__new__(cls)
        batch._header, batch.buffer, batch.remote, batch.position, batch.size = None, buffer, remote, position, size
        return batch

    @property
    def header(self) -> BatchHeader:
        header = self._header
        if header is None:
            header = self._header = read_v2_header(self.buffer, self.position, crc_ok=True)
        return header

    def offsets(self) -> tuple[int, int]:
        """(base offset, last offset) the batch claims, read without building its header."""
        header = self._header
        if header is not None:
            return header.base_offset, header.last_offset
        base, last_offset_delta = _V2_OFFSETS.unpack_from(self.buffer, self.position)
        return base, base + last_offset_delta

    @property
    def data(self) -> bytes:
        """The batch's bytes alone."""
        return self.buffer[self.position:self.position + self.size]


@dataclass
class FetchResult:
    """Kafka's fetch response for one partition: whole batches from the one holding the fetch
    offset, the offset to fetch next, and whether the remote read was throttled (KIP-956)."""

    batches: list[FetchedBatch]
    next_offset: int
    throttled: bool = False
    fetch_offset: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[AbortedTxn] = field(default_factory=list)
    isolation: str = READ_UNCOMMITTED
    remote_requests: int = 0
    remote_bytes: int = 0

    def consumed(self, until: int | None = None) -> Iterator[tuple[BatchHeader, list[Record]]]:
        """(batch header, its records) for what a consumer gets: records from the fetch offset on
        (the first batch may start before it), control batches dropped; with ``read_committed``,
        the batches of aborted transactions too (as Kafka's consumer filters them with the aborted
        list). The batches' CRCs were checked when they were fetched. ``until``: batches from that
        offset on are not decoded (a reader of a bounded range; the last batch may run past it)."""
        for batch in self.kept(until):
            h = batch.header
            records = decode_batch(batch.buffer, h, verify_crc=False)
            if h.base_offset < self.fetch_offset:
                records = [r for r in records if r.offset >= self.fetch_offset]
            yield h, records

    def kept(self, until: int | None = None) -> Iterator[FetchedBatch]:
        """The batches whose records a consumer gets (see :meth:`consumed`; the first may hold
        records before the fetch offset): control batches and, with ``read_committed``, aborted
        transactions' batches left out. Only control batches are decoded here."""
        pending = sorted(self.aborted, key=lambda t: t.first_offset) if self.isolation == READ_COMMITTED else []
        aborting: set[int] = set()
        i = 0
        for batch in self.batches:
            h = batch.header
            if until is not None and h.base_offset >= until:
                return
            while i < len(pending) and pending[i].first_offset <= h.last_offset:
                aborting.add(pending[i].producer_id)
                i += 1
            if h.is_control:
                if h.producer_id in aborting:
                    records = decode_batch(batch.buffer, h, verify_crc=False)
                    if records and parse_control_record(records[0]).type == CONTROL_ABORT:
                        aborting.discard(h.producer_id)
                continue
            if h.is_transactional and h.producer_id in aborting:
                continue
            yield batch

    @property
    def records(self) -> list[FetchedRecord]:
        """The records a consumer gets (see :meth:`consumed`)."""
        return [FetchedRecord(r.offset, r.timestamp, h.timestamp_type, r.key, r.value, tuple(r.headers), h.partition_leader_epoch)
                for h, records in self.consumed() for r in records]

    def to_json(self) -> dict:
        """ARCHITECTURE.md's fetch contract."""
        return {"records": [r.to_json() for r in self.records], "next_offset": self.next_offset, "throttled": self.throttled}


@dataclass(frozen=True)
class OffsetAnswer:
    """ListOffsets' answer: an offset and its leader epoch (−1 and −1 when there is none)."""

    offset: int
    leader_epoch: int
    timestamp: int = -1

    def to_json(self) -> dict:
        return {"offset": self.offset, "leader_epoch": self.leader_epoch}


NO_OFFSET = OffsetAnswer(-1, -1)


# --- one partition ------------------------------------------------------------------------------


@dataclass
class _RemoteChunk:
    """Batches read from the remote tier in one request, CRC-checked."""

    batches: list[FetchedBatch]
    requests: int
    bytes: int


class PartitionReader:
    """One partition's log across both tiers, as of when it was opened (offsets, segment lists)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        located: LocatedPartition | None,
        store: "RemoteLogMetadataStore | None",
        rsm: "RemoteStorageManager | None",
        index_dir: Path | None,
        fetch_quota: "FetchQuotaManager | None" = None,
        chunk_cache: "ChunkCache | None" = None,
        view: PartitionView | None = None,
    ) -> None:
        """``view``: the partition's view if the caller read one (else it is read here)."""
        self.topic, self.partition = topic, partition
        self.chunk_cache = chunk_cache
        self.located = located
        self.store, self.rsm = store, rsm
        self.fetch_quota = fetch_quota
        self.remote_requests = 0
        self._remote_index_cache: dict[int, ri.LoadedFileSet] = {}
        # The index's file sets as listed once per reader (a listing per fetch cost ~2 ms on a loaded machine).
        self._index_bases: list[int] | None = None
        self._index_refreshed = False
        self._txn_cache: dict[uuid.UUID, list[AbortedTxn]] = {}
        self._offset_index_cache: dict[uuid.UUID, list[OffsetPosition]] = {}

        # Both tiers as of now, read once (kts_resources/tiering/partition_view.py).
        if view is None:
            view = partition_view(located, store, topic_partition=TopicPartition(topic, partition))
        self.view = view
        self.tip = view.tip
        self.segments: list[SegmentFiles] = view.segments
        self.local_log_start_offset = view.local_log_start_offset
        self.finished: list[RemoteLogSegmentMetadata] = view.finished
        if located is None and not self.finished:
            raise UnknownPartitionError(f"{topic}-{partition}: the partition is in no log dir and has no data in the remote tier")
        # The remote tier as a reader sees it: the current leader-epoch lineage's offsets, each
        # served by one segment that holds it in that lineage's epoch (kts_resources/tiering/lineage.py).
        # Never a segment that ends before the offset (one may lie inside another: two copiers'
        # roll points), nor one of another lineage (an old leader's after an unclean election).
        self.current_lineage = view.lineage
        self.remote_log_start_offset = view.remote_log_start_offset
        self.log_start_offset = view.log_start_offset
        self.spans = view.readable_spans
        self._span_starts = [span.start_offset for span in self.spans]
        self.highest_remote_offset = self.spans[-1].end_offset if self.spans else -1
        self._recorded_highest_copied = view.highest_copied_offset
        # A partition only in the remote tier (moved, or its log dir is elsewhere) ends where the tier does.
        self.log_end_offset = view.log_end_offset
        self.high_watermark = view.high_watermark
        self.index_dir = index_dir if index_dir is not None and self.tip is not None else None
        self._lso: int | None = None
        self._lineage: list[EpochEntry] | None = None
        self._lost: list[tuple[int, int]] | None = None  # recorded lost ranges, read at the first fetch
        # What it read, as TieredLogReader.partition compares it (None: not taken; it is then opened again).
        self.signature: tuple | None = None

    # --- offsets ---

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest transaction still open at the high watermark (else the
        high watermark): read from the newest producer snapshot and the batches after it."""
        if self._lso is None:
            self._lso = self._compute_last_stable_offset()
        return self._lso

    @property
    def last_stable_offset_known(self) -> bool:
        """Whether ``last_stable_offset`` is already read (asking it then does no I/O)."""
        return self._lso is not None

    def reads_alike(self, other: "PartitionReader", start: int, end: int) -> bool:
        """Whether ``other`` (the same partition's reader, opened at another time) reads ``[start,
        end)`` from the same records as this one: both see every offset of it in the same remote
        segments of the same lineage, and ``other`` still holds it (a remote segment's records never
        change; a lineage, a log start offset or an expired segment may)."""
        if not other.log_start_offset <= start <= end <= other.high_watermark:
            return False
        mine = self._spans_over(start, end)
        return mine is not None and mine == other._spans_over(start, end)

    def _spans_over(self, start: int, end: int) -> list[tuple] | None:
        """(segment id, first, last offset) of the spans serving ``[start, end)``, None where one is missing."""
        out = []
        i = bisect.bisect_right(self._span_starts, start) - 1
        position = start
        while position < end:
            if not 0 <= i < len(self.spans) or not self.spans[i].start_offset <= position <= self.spans[i].end_offset:
                return None
            span = self.spans[i]
            out.append((span.segment.segment_id, span.start_offset, span.end_offset))
            position, i = span.end_offset + 1, i + 1
        return out

    def _compute_last_stable_offset(self) -> int:
        hw = self.high_watermark
        if not self.segments:
            return hw
        snapshots = self.located.partition.snapshots()
        usable = [o for o in snapshots if self.local_log_start_offset <= o <= hw]
        ongoing: dict[int, int] = {}
        start = self.local_log_start_offset
        if usable:
            start = max(usable)
            for entry in read_producer_snapshot(snapshots[start]):
                if entry.current_txn_first_offset >= 0:
                    ongoing[entry.producer_id] = entry.current_txn_first_offset
        for seg in self.segments:
            end = seg.next_base_offset if seg.next_base_offset is not None else self.log_end_offset
            if end <= start or seg.base_offset >= hw:
                continue
            for header, _data in self._segment_batches(seg, start):
                if header.base_offset >= hw:
                    break
                if not header.is_transactional:
                    continue
                if header.is_control:
                    ongoing.pop(header.producer_id, None)
                else:
                    ongoing.setdefault(header.producer_id, header.base_offset)
        return min([hw, *ongoing.values()])

    def fetch_limit(self, isolation: str) -> int:
        if isolation not in ISOLATION_LEVELS:
            raise ReadError(f"isolation {isolation!r} is not one of {', '.join(ISOLATION_LEVELS)}")
        return self.last_stable_offset if isolation == READ_COMMITTED else self.high_watermark

    @property
    def lineage(self) -> list[EpochEntry]:
        """The leader-epoch lineage from the log start offset: the partition's current one (the
        store's, or this replica's if newer), led by the readable remote segments' epochs for
        offsets below it (a checkpoint truncated with the local log keeps none)."""
        if self._lineage is None:
            served = remote_epoch_starts(span.segment for span in self.spans)
            self._lineage = leader_epoch_lineage(self.current_lineage, served, self.log_start_offset)
        return self._lineage

    @property
    def highest_copied_offset(self) -> int:
        """The highest offset of the current lineage ever copied, even once retention deleted it
        (UnifiedLog.highestOffsetInRemoteStorage): findHighestRemoteOffset over the lineage."""
        if self.store is None or self.tip is None:
            return self.highest_remote_offset
        if not self.current_lineage:
            return max(self._recorded_highest_copied, self.highest_remote_offset)
        end = self.log_end_offset if self.located is not None else 2**63 - 1  # remote only: the lineage's newest epoch is open
        copied = copy_start_offset(self.current_lineage, end,
                                   lambda epoch: self.store.highest_offset_for_epoch(self.tip, epoch)) - 1
        return max(copied, self.highest_remote_offset)

    def epoch_for(self, offset: int) -> int:
        epoch = epoch_for_offset(self.lineage, offset)
        return -1 if epoch is None else epoch

    # --- fetch ---

    def fetch(self, offset: int, max_bytes: int = DEFAULT_MAX_BYTES, isolation: str = READ_UNCOMMITTED,
              end: int | None = None) -> FetchResult:
        """Kafka's fetch (see the module docstring); ``end``: no batch from that offset on (a reader
        of a bounded range: the fetch stops there instead of reading on into what it would drop)."""
        if max_bytes <= 0:
            raise ReadError(f"max bytes {max_bytes} is not positive")
        limit = self.fetch_limit(isolation)
        stop = limit if end is None else min(end, limit)  # no batch begins at or past it
        if offset < self.log_start_offset or offset > self.log_end_offset or self.log_start_offset < 0:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: offset {offset} is out of range: the log holds "
                f"[{self.log_start_offset}, {self.log_end_offset})")
        stop = self._stop_before_lost_range(offset, stop)
        result = FetchResult([], offset, fetch_offset=offset, high_watermark=self.high_watermark, last_stable_offset=self.last_stable_offset,
                             log_start_offset=self.log_start_offset, isolation=isolation)
        used = 0
        position = offset
        admitted = False  # the quota is asked once per fetch, as Kafka asks it once per remote read
        held_back = False  # the next batch crosses the fetchable bound: nothing more to return yet
        while position < stop and (used < max_bytes or not result.batches):
            budget = max_bytes - used if result.batches else max_bytes
            try:
                batches = self._local_fetch_or_none(position, budget)
            except LocalSegmentDamagedError:
                if result.batches:
                    break  # what was read is returned; the next fetch, from here, fails
                raise
            if batches is None:
                if not admitted and self.fetch_quota is not None and not self.fetch_quota.try_acquire():
                    result.throttled = not result.batches
                    break
                admitted = True
                chunk = self._remote_chunk(position, budget)
                if self.fetch_quota is not None:
                    self.fetch_quota.record(chunk.bytes)
                result.remote_requests += chunk.requests
                result.remote_bytes += chunk.bytes
                batches = chunk.batches
                total = chunk.bytes  # whole batches, every byte read (_checked_batches)
            else:
                total = sum(b.header.batch_length for b in batches) + LOG_OVERHEAD * len(batches)
            taken, full = 0, False
            if batches:
                # The common case of a sequential read: the whole chunk is wanted (nothing before
                # ``position``, nothing past the bound, within max_bytes). Taking it at once spares
                # the per-batch checks below, which cost more than the batches' CRCs.
                first, last = batches[0].header, batches[-1].header
                if (first.base_offset + first.last_offset_delta >= position
                        and last.base_offset + last.last_offset_delta + 1 <= limit and last.base_offset < stop
                        and (used + total <= max_bytes or (not result.batches and len(batches) == 1))):
                    result.batches.extend(batches)
                    used += total
                    position = last.base_offset + last.last_offset_delta + 1
                    continue
            for batch in batches:
                if batch.header.last_offset < position:
                    continue
                # Whole batches below the bound only, and (past the first) within max_bytes: a
                # batch left out ends the fetch — reading on would fetch the same chunk again.
                if (batch.header.next_offset > limit or batch.header.base_offset >= stop
                        or (result.batches and used + batch.size > max_bytes)):
                    full = True
                    held_back = not result.batches
                    break
                result.batches.append(batch)
                used += batch.size
                taken += 1
                position = batch.header.next_offset
            if not taken or full:
                break
        if not result.batches and not result.throttled and not held_back and position < stop:
            # Never an empty answer at the fetch offset while the log holds more: a consumer would
            # fetch the same offset forever.
            raise ReadError(f"{self.topic}-{self.partition}: offset {position}: no batch holds it or follows it below "
                            f"{stop}, although the log holds [{self.log_start_offset}, {self.log_end_offset})")
        result.next_offset = position
        if isolation == READ_COMMITTED and result.batches:
            result.aborted = self.aborted_transactions(offset, position)
        return result

    def _stop_before_lost_range(self, offset: int, stop: int) -> int:
        """``stop``, lowered to the first recorded lost range above ``offset``: a fetch never reads
        across offsets that are in neither tier (it would hand out a later offset as the next one);
        OffsetOutOfRangeError when ``offset`` is in one."""
        if self._lost is None:
            self._lost = ([(r.start_offset, r.end_offset) for r in self.store.lost_ranges(self.tip, include_acknowledged=True)]
                          if self.store is not None and self.tip is not None else [])
        for first, last in self._lost:
            if first <= offset <= last:
                raise OffsetOutOfRangeError(
                    f"{self.topic}-{self.partition}: offset {offset} is in lost range {first}..{last}: deleted "
                    "locally before it was copied, in neither tier (see kts status)")
            if offset < first:
                return min(stop, first)
        return stop

    def chunk_bounds(self, lo: int, hi: int, chunk_bytes: int) -> list[int]:
        """Offsets cutting ``[lo, hi)`` into reads of about ``chunk_bytes``: the remote part along
        whole remote log index entries (a remote segment the index does not cover stays whole),
        the local part along local segments. Sorted, from ``lo`` to ``hi``. What a replay prefetches
        and ``read_tiered``'s tasks are cut by."""
        entries = self._all_index_entries()
        finished_ids = {span.segment.segment_id.id for span in self.spans}
        wanted = {span.segment.segment_id.id for span in self.spans if span.end_offset >= lo and span.start_offset < hi}
        if not wanted <= {e.segment_id for e in entries} and self._refresh_index():
            entries = self._all_index_entries()
        cuts: list[int] = []
        size = 0
        for e in entries:
            if e.segment_id in finished_ids:
                # Cut before the entry that would take a chunk past chunk_bytes: one fetch of
                # chunk_bytes from a cut then reads exactly to the next.
                if size and size + e.data_length > chunk_bytes:
                    cuts.append(e.first_offset)
                    size = 0
                size += e.data_length
        cuts += [span.start_offset for span in self.spans] + [s.base_offset for s in self.segments]
        return sorted({lo, hi, *(c for c in cuts if lo < c < hi)})

    def _all_index_entries(self) -> list[ri.RemoteLogIndexEntry]:
        if self.index_dir is None:
            return []
        try:
            return list(ri.iter_entries(ri.load_file_set(self.index_dir, b) for b in ri.file_set_offsets(self.index_dir)))
        except (OSError, ri.RemoteIndexFormatError):
            return []  # damaged or being rebuilt: whole segments then

    def read_range(self, start: int, end: int, *, chunk_bytes: int = 8 * 1024 * 1024,
                   isolation: str = READ_UNCOMMITTED, throttled_wait: bool = True) -> list[FetchedBatch]:
        """The batches from the one holding ``start`` to the last that begins below ``end``, by
        fetches of ``chunk_bytes``. A throttled remote read (fetch quota) waits for the quota, as a
        consumer would back off (or, with ``throttled_wait=False``, raises ReadError)."""
        import time

        out: list[FetchedBatch] = []
        position = start
        while position < end:
            result = self.fetch(position, chunk_bytes, isolation, end=end)
            if result.throttled:
                if not throttled_wait:
                    raise ReadError(f"{self.topic}-{self.partition}: the remote fetch quota holds reads back at offset {position}")
                time.sleep(max(0.05, (self.fetch_quota.manager.throttle_time_ms() if self.fetch_quota else 0) / 1000))
                continue
            if result.next_offset <= position:
                break
            batches = result.batches
            if batches and batches[-1].header.base_offset >= end:
                out.extend(b for b in batches if b.header.base_offset < end)
                return out
            out.extend(batches)
            position = result.next_offset
        return out

    def replay(self, start: int, end: int | None = None, *, chunk_bytes: int = 8 * 1024 * 1024,
               isolation: str = READ_UNCOMMITTED, ahead: int = 2) -> Iterator[FetchedBatch]:
        """Every batch from the one holding ``start`` up to ``end`` (default: the fetchable end),
        across remote segments and into the local log. The range is cut along the remote log index
        (:meth:`chunk_bounds`) and the next ``ahead`` chunks are fetched in background threads while
        the caller works on one (reads and CRC-32C release the GIL, so two cores share the work); a
        chunk's error surfaces when the caller reaches it. A throttled remote read waits for the quota."""
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        end = self.fetch_limit(isolation) if end is None else min(end, self.fetch_limit(isolation))
        if start >= end:
            return
        bounds = self.chunk_bounds(start, end, chunk_bytes)
        ranges = iter(zip(bounds, bounds[1:]))
        with ThreadPoolExecutor(max_workers=max(1, ahead), thread_name_prefix="kts-prefetch") as pool:
            pending: deque = deque()
            for a, b in ranges:
                pending.append(pool.submit(self.read_range, a, b, chunk_bytes=chunk_bytes, isolation=isolation))
                if len(pending) > ahead:
                    break
            while pending:
                batches = pending.popleft().result()
                for a, b in ranges:  # keep ``ahead`` chunks in flight
                    pending.append(pool.submit(self.read_range, a, b, chunk_bytes=chunk_bytes, isolation=isolation))
                    break
                yield from batches

    # --- the local tier ---

    def _segment_index(self, offset: int) -> int:
        return bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1

    def _local_batches(self, seg: SegmentFiles, from_offset: int, max_bytes: int | None = None) -> Iterator[tuple[BatchHeader, bytes]]:
        """Whole batches of a local segment from the one holding ``from_offset`` (its offset index
        finds where to start; a missing or bad index means the start of the file). Every batch read
        is checked (:meth:`_check_local_batch`); bytes that are no batch end the read only where a
        crash's torn write may be — at the end of the active segment, past the log end offset —
        and are LocalSegmentDamagedError anywhere else: a read never skips to later offsets."""
        start = 0
        try:
            entries = read_offset_index(seg.offset_index, seg.base_offset)
            start = lookup_offset(entries, from_offset, seg.base_offset).position
        except (OSError, KafkaFormatError):
            start = 0
        read_bytes = (max_bytes + _LOCAL_READ_SLACK) if max_bytes is not None else 8 * 1024 * 1024
        want = read_bytes
        floor = seg.base_offset  # no batch may begin below it: the segment's base, then the end of the batch before
        reached: int | None = None  # the offset after the last batch read
        with open(seg.log, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            while True:
                f.seek(start)
                data = f.read(want)
                scan = scan_batches(data, verify_crc=True)
                for h in scan.batches:
                    self._check_local_batch(seg, h, start + h.position, floor)
                    floor = reached = h.next_offset
                    if h.last_offset < from_offset:
                        continue
                    yield h, data
                    if max_bytes is not None:
                        max_bytes -= h.size
                        if max_bytes <= 0:
                            return
                start += scan.valid_bytes
                invalid = scan.invalid
                if invalid is None:
                    if len(data) < want:  # the end of the file
                        if reached is None and start > 0 and not self._past_the_end(seg, from_offset):
                            raise LocalSegmentDamagedError(seg.log, start, "the offset index points at or past the end of the file")
                        return
                    want = read_bytes
                    continue
                size = int.from_bytes(data[invalid.position + 8:invalid.position + 12], "big", signed=True) + LOG_OVERHEAD
                if invalid.length < size and start + size <= file_size:
                    want = max(read_bytes, size)  # a batch the read cut off, or larger than the read: read it whole
                    continue
                if not self._past_the_end(seg, from_offset if reached is None else max(reached, from_offset)):
                    raise LocalSegmentDamagedError(seg.log, start, f"{invalid.reason}: not a batch")
                return  # a torn write past the log end offset of the active segment: Kafka's recovery truncates there

    def _past_the_end(self, seg: SegmentFiles, offset: int) -> bool:
        return seg.active and offset >= self.log_end_offset

    def _check_local_batch(self, seg: SegmentFiles, h: BatchHeader, position: int, floor: int) -> None:
        """A batch belongs in ``seg`` only with a good CRC and offsets inside the segment, each
        batch after the one before: a file of another partition or segment named like this one
        fails here even though each of its batches is whole."""
        if h.crc_ok is False:
            raise LocalSegmentDamagedError(seg.log, position, f"the batch at offset {h.base_offset} fails its CRC")
        if h.base_offset < floor:
            where = (f"below the segment's base offset {seg.base_offset}" if floor == seg.base_offset
                     else f"not after the batch before it, which ends at {floor - 1}")
            raise LocalSegmentDamagedError(seg.log, position, f"the batch claims base offset {h.base_offset}, {where}: "
                                                              "not this segment's batch")
        if seg.next_base_offset is not None and h.last_offset >= seg.next_base_offset:
            raise LocalSegmentDamagedError(seg.log, position, f"the batch claims offsets up to {h.last_offset}, past the "
                                                              f"segment's end (the next segment begins at {seg.next_base_offset}): "
                                                              "not this segment's batch")

    def _tier_holds(self, offset: int) -> bool:
        """Whether a finished remote segment holds ``offset`` (and a tier to read it from is set)."""
        return self.rsm is not None and offset >= self.log_start_offset and self._segment_for(offset) is not None

    def _segment_batches(self, seg: SegmentFiles, from_offset: int) -> Iterator[tuple[BatchHeader, bytes]]:
        """:meth:`_local_batches`, but offsets of a damaged local segment that the remote tier
        holds are read from there (from the first offset not yet read); offsets neither holds are
        the damage error. For the scans over whole segments (timestamps, the last stable offset)."""
        position = max(from_offset, seg.base_offset)
        try:
            for h, data in self._local_batches(seg, from_offset):
                yield h, data
                position = max(position, h.next_offset)
            return
        except LocalSegmentDamagedError as damage:
            if not self._tier_holds(position):
                raise
            log.warning("%s; offsets from %d are read from the remote tier", damage, position)
            end = seg.next_base_offset if seg.next_base_offset is not None else self.log_end_offset
            while position < end:
                if not self._tier_holds(position):
                    raise damage from None
                chunk = self._remote_chunk(position, DEFAULT_MAX_BYTES)
                for batch in chunk.batches:
                    if batch.header.last_offset >= position:
                        yield batch.header, batch.buffer
                position = chunk.batches[-1].header.next_offset  # the chunk holds position (_remote_chunk)

    def _local_fetch_or_none(self, offset: int, max_bytes: int) -> list[FetchedBatch] | None:
        """The local log's batches for a fetch at ``offset``, or None when the remote tier is to
        answer: below the local log start offset, and where the local log is damaged or lacks
        offsets the tier holds (a segment cut short). Damage at offsets the tier does not hold is
        LocalSegmentDamagedError: a fetch never skips to later offsets."""
        if self.local_log_start_offset < 0 or offset < self.local_log_start_offset:
            return None
        try:
            batches = self._local_fetch(offset, max_bytes)
        except LocalSegmentDamagedError as damage:
            if not self._tier_holds(offset):
                raise
            log.warning("%s; offset %d is read from the remote tier", damage, offset)
            return None
        if (not batches or batches[0].header.base_offset > offset) and self._tier_holds(offset):
            return None
        return batches

    def _local_fetch(self, offset: int, max_bytes: int) -> list[FetchedBatch]:
        i = self._segment_index(offset)
        if i < 0:
            return []
        out: list[FetchedBatch] = []
        for seg in self.segments[i:]:
            try:
                for h, data in self._local_batches(seg, offset, max_bytes):
                    out.append(FetchedBatch(h, data, remote=False))
                    max_bytes -= len(data)
            except LocalSegmentDamagedError:
                if not out:
                    raise
                return out  # the whole batches before the damage; a read from there meets it
            if max_bytes <= 0 or out:
                break
        return out

    # --- the remote tier ---

    def _span_for(self, offset: int) -> Span | None:
        """The span of the current lineage holding ``offset`` (its segment holds the offset in the
        lineage's epoch, up to the span's end), or None."""
        i = bisect.bisect_right(self._span_starts, offset) - 1
        return self.spans[i] if i >= 0 and self.spans[i].end_offset >= offset else None

    def _segment_for(self, offset: int) -> RemoteLogSegmentMetadata | None:
        span = self._span_for(offset)
        return None if span is None else span.segment

    def _remote_chunk(self, offset: int, max_bytes: int) -> _RemoteChunk:
        if self.rsm is None:
            raise ReadError(f"{self.topic}-{self.partition}: offset {offset} is only in the remote tier, and no remote tier is configured")
        span = self._span_for(offset)
        if span is None:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: offset {offset} is in no remote segment and below the local log start "
                f"offset {self.local_log_start_offset}: the range is missing from both tiers")
        md = span.segment
        entries = self._index_entries(offset, md, max_bytes)
        chunk = self._read_entries(entries, md) if entries else self._read_by_segment_index(offset, md, max_bytes)
        if chunk.batches and chunk.batches[-1].header.base_offset > span.end_offset:
            # Past the span the segment is of another lineage (or another segment serves on): not these records.
            chunk = _RemoteChunk([b for b in chunk.batches if b.header.base_offset <= span.end_offset], chunk.requests, chunk.bytes)
        return chunk

    def _loaded_file_set(self, base_offset: int) -> ri.LoadedFileSet:
        fs = self._remote_index_cache.get(base_offset)
        if fs is None:
            fs = ri.load_file_set(self.index_dir, base_offset)
            self._remote_index_cache[base_offset] = fs
        return fs

    def _index_entries(self, offset: int, md: RemoteLogSegmentMetadata, max_bytes: int) -> list[ri.RemoteLogIndexEntry]:
        """The remote log index entries to read for ``offset``: the one holding it, then the
        following entries of the same object and contiguous bytes while ``max_bytes`` allows.
        Empty when the index does not cover it (not built yet, or an entry of another copy). A
        cache without the finished segment ``md`` is refreshed from the tier's current file sets
        first (another broker's kts may have indexed it)."""
        entries = self._cached_index_entries(offset, md, max_bytes)
        if not entries and self._refresh_index():
            entries = self._cached_index_entries(offset, md, max_bytes)
        return entries

    def _refresh_index(self) -> bool:
        """Bring the index cache up to the tier's current file sets, once per reader; True when a
        file changed. A failure leaves the cache as it was: reads go on (Kafka's two requests)."""
        if self._index_refreshed or self.index_dir is None or self.rsm is None:
            return False
        self._index_refreshed = True
        try:
            changed = index_tier.sync_cache(self.index_dir, self.rsm, self.tip).changed
        except (OSError, RemoteStorageError, index_tier.IndexPointerError) as e:
            log.warning("%s: remote log index not refreshed from the tier under %s: %s", self.tip.topic_partition,
                        self.index_dir, getattr(e, "strerror", None) or e)
            return False
        if changed:
            self._remote_index_cache.clear()
            self._index_bases = None
        return changed

    def _cached_index_entries(self, offset: int, md: RemoteLogSegmentMetadata, max_bytes: int) -> list[ri.RemoteLogIndexEntry]:
        if self.index_dir is None:
            return []
        bases = self._index_bases
        if bases is None:
            bases = self._index_bases = ri.file_set_offsets(self.index_dir)
        k = bisect.bisect_right(bases, offset) - 1
        if k < 0:
            return []
        try:
            fs = self._loaded_file_set(bases[k])
        except (OSError, ri.RemoteIndexFormatError) as e:
            # Damaged, or caught between two files of a rebuild: the segment's own index still
            # serves the read (the index check and rebuild runs deal with the damage).
            log.warning("remote log index not used: %s", e)
            return []
        i = ri.entry_for_offset(fs, offset)
        if i is None:
            return []
        first = fs.entries[i][1]
        if first.last_offset < offset or first.segment_id != md.segment_id.id:
            return []
        chosen = [first]
        # At an entry's first offset (a sequential reader always is), entries are taken while they
        # fit max_bytes, so nothing read is left over. Elsewhere ``offset`` may sit anywhere in the
        # first entry: the following entries of the segment are taken until max_bytes fit after
        # any point of it, so one ranged GET still serves the fetch.
        aligned = first.first_offset == offset
        taken = first.data_length if aligned else 0
        for _pos, entry in fs.entries[i + 1:]:
            prev = chosen[-1]
            if (entry.segment_id != first.segment_id or entry.rdi.position != prev.rdi.position + prev.data_length
                    or (aligned and taken + entry.data_length > max_bytes) or (not aligned and taken >= max_bytes)):
                break
            chosen.append(entry)
            taken += entry.data_length
        return chosen

    def _read_entries(self, entries: Sequence[ri.RemoteLogIndexEntry], md: RemoteLogSegmentMetadata) -> _RemoteChunk:
        first = entries[0]
        key, position = first.rdi.key, first.rdi.position
        length = sum(e.data_length for e in entries)
        def checked(data: bytes) -> list[FetchedBatch]:
            batches = self._checked_batches(data, key, position)
            self._check_claims(batches, key, position, md, first_offset=first.first_offset, last_offset=entries[-1].last_offset)
            return batches

        cached = self.chunk_cache.get(key, position, length) if self.chunk_cache is not None else None
        if cached is not None:
            try:
                return _RemoteChunk(checked(cached), 0, len(cached))
            except RemoteDataCorruptError:
                self.chunk_cache.discard(key, position, length)  # damaged on this disk: read the tier again
        data = self._ranged_get(key, position, length)
        if len(data) != length:
            raise RemoteDataCorruptError(f"{self.rsm.location(key)}: byte {position}: the remote log index "
                                         f"says {length} bytes are there, the object gave {len(data)}")
        batches = checked(data)
        if self.chunk_cache is not None:
            self.chunk_cache.put(key, position, length, data)
        return _RemoteChunk(batches, 1, len(data))

    def _read_by_segment_index(self, offset: int, md: RemoteLogSegmentMetadata, max_bytes: int) -> _RemoteChunk:
        """Kafka's own path: the segment's offset index (one request, cached), then the segment
        from the position it gives, read on until the batch holding ``offset`` (an index that is
        missing or sparse points before it)."""
        requests = 0
        entries = self._offset_index_cache.get(md.segment_id.id)
        if entries is None:
            try:
                raw = self.rsm.fetch_index(md, IndexType.OFFSET)
                requests += 1
                entries = decode_offset_index(raw, md.start_offset)
            except (RemoteResourceNotFoundError, KafkaFormatError):
                entries = []
            self._offset_index_cache[md.segment_id.id] = entries
        position = lookup_offset(entries, offset, md.start_offset).position
        key = self.rsm.segment_object_keys(md)["log"]
        first_offset = md.start_offset if position == 0 else None  # the object's first batch begins the segment
        while True:
            left = md.segment_size_in_bytes - position
            if left <= 0:
                raise RemoteDataCorruptError(f"{self.rsm.location(key)}: byte {position}: the object ends there, expected a "
                                             f"batch holding offset {offset} (remote segment {md.segment_id.id} holds "
                                             f"[{md.start_offset}, {md.end_offset}])")
            data = self._ranged_get(key, position, min(max_bytes + _LOCAL_READ_SLACK, left))
            requests += 1
            scan = scan_batches(data, verify_crc=False)
            if not scan.batches and len(data) >= 12:
                # One batch larger than the read: fetch it whole.
                size = int.from_bytes(data[8:12], "big") + 12
                data = self._ranged_get(key, position, min(size, left))
                requests += 1
            elif scan.batches:
                data = data[:scan.valid_bytes]
            batches = self._checked_batches(data, key, position)
            self._check_claims(batches, key, position, md, first_offset=first_offset)
            last = batches[-1].offsets()[1] if batches else None
            if last is not None and last < offset and position + len(data) < md.segment_size_in_bytes:
                first_offset, position = last + 1, position + len(data)
                continue
            self._check_holds(batches, key, position, md, offset)
            return _RemoteChunk(batches, requests, len(data))

    def _check_claims(self, batches: Sequence[FetchedBatch], key: str, position: int, md: RemoteLogSegmentMetadata, *,
                      first_offset: int | None = None, last_offset: int | None = None) -> None:
        """What the batches read from ``md``'s object at byte ``position`` claim, against what the
        metadata store says the segment holds: offsets inside [start, end], each batch right after
        the one before (a tiered segment is never compacted); the first beginning at
        ``first_offset`` and the last ending at ``last_offset`` where they are known (a remote log
        index entry's, the segment's start). The batch CRC does not cover the base offset: a
        rewritten one passes it, and would be returned as other offsets — or, below the fetch
        offset, as none at all, on which a consumer fetches the same offset forever."""
        expected = first_offset
        for batch in batches:
            base, last = batch.offsets()
            if expected is not None and base != expected:
                self._claim_error(batch, base, last, key, position, md, f"base offset {expected}")
            if base < md.start_offset or last > md.end_offset or last < base:
                self._claim_error(batch, base, last, key, position, md, f"offsets inside [{md.start_offset}, {md.end_offset}]")
            expected = last + 1
        if batches and last_offset is not None and expected - 1 != last_offset:
            base, last = batches[-1].offsets()
            self._claim_error(batches[-1], base, last, key, position, md, f"the last offset {last_offset} (the remote log index's)")

    def _check_holds(self, batches: Sequence[FetchedBatch], key: str, position: int, md: RemoteLogSegmentMetadata,
                     offset: int) -> None:
        """The batches read for ``offset`` begin at or before it and reach it: a read always moves on."""
        if not batches:
            raise RemoteDataCorruptError(f"{self.rsm.location(key)}: byte {position}: no batch there, expected a batch "
                                         f"holding offset {offset} (remote segment {md.segment_id.id} holds "
                                         f"[{md.start_offset}, {md.end_offset}])")
        for batch in (batches[0], batches[-1]):
            base, last = batch.offsets()
            if (batch is batches[0] and base > offset) or (batch is batches[-1] and last < offset):
                self._claim_error(batch, base, last, key, position, md, f"a batch holding offset {offset}")

    def _claim_error(self, batch: FetchedBatch, base: int, last: int, key: str, position: int,
                     md: RemoteLogSegmentMetadata, expected: str) -> None:
        raise RemoteDataCorruptError(
            f"{self.rsm.location(key)}: byte {position + batch.position}: the batch claims offsets [{base}, {last}], expected "
            f"{expected} (remote segment {md.segment_id.id} holds [{md.start_offset}, {md.end_offset}]); no records "
            "returned from it")

    def _ranged_get(self, key: str, position: int, length: int) -> bytes:
        self.remote_requests += 1
        try:
            return self.rsm.fetch_range(key, position, position + length - 1)
        except RemoteResourceNotFoundError as e:
            raise ReadError(f"{e}: the remote segment's object is missing (run kts sync to re-copy it while the local segment exists)") from None

    def _checked_batches(self, data: bytes, key: str, base_position: int) -> list[FetchedBatch]:
        positions, end = verified_batch_positions(data)
        if end == len(data):  # the common case: whole, CRC-clean magic-2 batches to the end
            ends = positions[1:] + [end]
            return [FetchedBatch.verified(data, p, e - p, True) for p, e in zip(positions, ends)]
        scan = scan_batches(data, verify_crc=True)
        if scan.crc_failure_count:
            h = scan.crc_failures[0]
            raise RemoteDataCorruptError(f"{self.rsm.location(key)}: byte {base_position + h.position}: the batch at offset "
                                         f"{h.base_offset} fails its CRC; no records returned from it")
        if scan.invalid is not None:
            raise RemoteDataCorruptError(f"{self.rsm.location(key)}: byte {base_position + scan.invalid.position}: "
                                         f"{scan.invalid.reason}")
        return [FetchedBatch(h, data, True) for h in scan.batches]

    # --- transactions ---

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions that overlap [start, end), as Kafka's collectAbortedTransactions
        finds them: a transaction is in the .txnindex of the segment holding its abort marker, which
        may come after ``end``, so segments from the one holding ``start`` on are searched until an
        entry's last stable offset reaches ``end`` (remote segments' copies, then local ones)."""
        found: dict[tuple[int, int], AbortedTxn] = {}

        def take(txns: Iterable[AbortedTxn]) -> bool:
            done = False
            for txn in txns:
                if txn.last_offset >= start and txn.first_offset < end:
                    found[(txn.producer_id, txn.first_offset)] = txn
                done = done or txn.last_stable_offset >= end
            return done

        done = False
        for span in self.spans:
            if span.end_offset < start or (self.local_log_start_offset >= 0 and span.start_offset >= self.local_log_start_offset):
                continue
            # Only transactions whose abort marker the span serves: past it the segment may hold another lineage's.
            if take(t for t in self._remote_txns(span.segment) if span.start_offset <= t.last_offset <= span.end_offset):
                done = True
                break
        if not done:
            for seg in self.segments:
                if seg.next_base_offset is not None and seg.next_base_offset <= start:
                    continue
                if seg.txn_index is not None and take(read_txn_index(seg.txn_index)):
                    break
        return sorted(found.values(), key=lambda t: t.first_offset)

    def _remote_txns(self, md: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
        txns = self._txn_cache.get(md.segment_id.id)
        if txns is None:
            try:
                txns = decode_aborted_txns(self.rsm.fetch_index(md, IndexType.TRANSACTION))
                self.remote_requests += 1
            except RemoteResourceNotFoundError:
                txns = []
            self._txn_cache[md.segment_id.id] = txns
        return txns

    # --- ListOffsets ---

    def offsets(self, spec: str | int, isolation: str = READ_UNCOMMITTED) -> OffsetAnswer:
        """ListOffsets as Kafka answers it (UnifiedLog.fetchOffsetByTimestamp with the partition's
        fetchable bound): ``earliest``, ``earliest-local``, ``latest-tiered``, ``latest``,
        ``max-timestamp``, or a timestamp in ms (the first offset whose timestamp ≥ it)."""
        if spec == "earliest":
            first = self.lineage[0] if self.lineage else None
            epoch = first.epoch if first is not None and first.start_offset <= self.log_start_offset else -1
            return OffsetAnswer(self.log_start_offset, epoch)
        if spec == "earliest-local":
            # Never below the log start offset: a broker-owned segment kts's retention or DeleteRecords
            # has passed is still on disk but no longer readable (UnifiedLog moves its local log start
            # offset with the log start offset).
            start = max(self.local_log_start_offset, self.log_start_offset) if self.local_log_start_offset >= 0 else self.log_end_offset
            return OffsetAnswer(start, self.epoch_for(start))
        if spec == "latest-tiered":
            # The highest offset ever copied, even once retention deleted it (UnifiedLog's
            # highestOffsetInRemoteStorage), with its epoch if the cache still has it.
            highest = self.highest_copied_offset
            if highest < 0:
                return NO_OFFSET
            return OffsetAnswer(highest, self.epoch_for(highest))
        limit = self.fetch_limit(isolation)
        if spec == "latest":
            latest = self.lineage[-1].epoch if self.lineage else -1
            return OffsetAnswer(limit, latest)
        if spec == "max-timestamp":
            return self._max_timestamp(limit)
        if isinstance(spec, bool) or not isinstance(spec, int):
            raise ReadError(f"offset spec {spec!r} is not one of {', '.join(OFFSET_SPECS)} or a timestamp")
        if spec < 0:
            raise ReadError(f"timestamp {spec} is negative")
        found = self._first_at_or_after(spec)
        if found is None or found.offset >= limit:
            return NO_OFFSET
        return found

    def _scan_for_timestamp(self, batches: Iterable[FetchedBatch], timestamp: int, floor: int) -> OffsetAnswer | None:
        for b in batches:
            h = b.header
            if h.last_offset < floor or h.max_timestamp < timestamp or h.is_control:
                continue
            for r in decode_batch(b.buffer, h):
                if r.offset >= floor and r.timestamp >= timestamp:
                    return OffsetAnswer(r.offset, h.partition_leader_epoch, r.timestamp)
        return None

    def _first_at_or_after(self, timestamp: int) -> OffsetAnswer | None:
        floor = self.log_start_offset
        # Remote segments first (RemoteLogManager.findOffsetByTimestamp), oldest first.
        for span in self.spans:
            # A segment's largest timestamp bounds its span's from above: a span below T is skipped.
            if span.end_offset < floor or span.segment.max_timestamp_ms < timestamp:
                continue
            if self.local_log_start_offset >= 0 and span.start_offset >= self.local_log_start_offset:
                break  # the local log has it from here on
            found = self._scan_for_timestamp(self._remote_batches_from_time(span, timestamp, floor), timestamp, floor)
            if found is not None:
                return found
        for seg in self.segments:
            end = seg.next_base_offset if seg.next_base_offset is not None else self.log_end_offset
            if end <= floor:
                continue
            batches = (FetchedBatch(h, d, remote=False) for h, d in self._segment_batches(seg, max(floor, seg.base_offset)))
            found = self._scan_for_timestamp(batches, timestamp, floor)
            if found is not None:
                return found
        return None

    def _remote_batches_from_time(self, span: Span, timestamp: int, floor: int) -> Iterator[FetchedBatch]:
        """A span's batches from where its time could reach ``timestamp``: through the remote log
        index's time index when it covers the span's segment, else from the span's start."""
        md = span.segment
        start = max(floor, span.start_offset)
        bases = ri.file_set_offsets(self.index_dir) if self.index_dir is not None else []
        k = bisect.bisect_right(bases, md.start_offset) - 1
        if k >= 0:
            try:
                fs = self._loaded_file_set(bases[k])
            except (OSError, ri.RemoteIndexFormatError) as e:
                log.warning("remote log index not used: %s", e)
            else:
                # The first entry whose running largest timestamp reaches T; if it is in an earlier
                # segment, this one is read from its start.
                i = ri.entry_for_timestamp(fs, timestamp)
                ours = [e for _p, e in fs.entries[i or 0:] if e.segment_id == md.segment_id.id] if i is not None else []
                if ours:
                    start = max(start, ours[0].first_offset)
        offset = start
        while offset <= span.end_offset:
            chunk = self._remote_chunk(offset, DEFAULT_MAX_BYTES)
            yield from chunk.batches
            offset = chunk.batches[-1].header.next_offset  # past ``offset``: the chunk holds it (_remote_chunk)

    def _span_max_timestamp(self, span: Span) -> int:
        largest, offset = -1, max(span.start_offset, self.log_start_offset)
        while offset <= span.end_offset:
            chunk = self._remote_chunk(offset, DEFAULT_MAX_BYTES)
            largest = max([largest, *(b.header.max_timestamp for b in chunk.batches if not b.header.is_control)])
            offset = chunk.batches[-1].header.next_offset
        return largest

    def _max_timestamp(self, limit: int) -> OffsetAnswer:
        """The first record holding the largest timestamp in the log (both tiers), below ``limit``."""
        best: OffsetAnswer | None = None
        candidates: list[tuple[int, str, object]] = []
        for span in self.spans:
            if self.local_log_start_offset < 0 or span.start_offset < self.local_log_start_offset:
                md = span.segment
                # A span serving only part of its segment: the segment's largest timestamp may lie
                # outside it, so the span's own is read.
                whole = span.start_offset == md.start_offset and span.end_offset == md.end_offset
                candidates.append((md.max_timestamp_ms if whole else self._span_max_timestamp(span), "remote", span))
        if not candidates and not self.segments:
            return NO_OFFSET
        # Local segments: their largest timestamp needs a read of each (the time index's last entry is a hint only).
        for seg in self.segments:
            for h, d in self._segment_batches(seg, max(self.log_start_offset, seg.base_offset)):
                if h.base_offset >= limit:
                    break
                if h.is_control:
                    continue
                if best is None or h.max_timestamp > best.timestamp:
                    for r in decode_batch(d, h):
                        if r.offset < limit and (best is None or r.timestamp > best.timestamp):
                            best = OffsetAnswer(r.offset, h.partition_leader_epoch, r.timestamp)
        for ts, _kind, span in sorted(candidates, key=lambda c: c[0], reverse=True):
            if best is not None and ts <= best.timestamp:
                # An earlier record with the same largest timestamp wins, as the first seen does in Kafka.
                if ts < best.timestamp:
                    break
            found = self._scan_for_timestamp(self._remote_batches_from_time(span, ts, self.log_start_offset), ts, self.log_start_offset)
            if found is not None and (best is None or found.timestamp > best.timestamp
                                      or (found.timestamp == best.timestamp and found.offset < best.offset)):
                best = found
        return best if best is not None else NO_OFFSET


# --- the reader over every partition -------------------------------------------------------------


class TieredLogReader:
    """Reads any partition of the configured log dirs and remote tier (see the module docstring)."""

    def __init__(
        self,
        *,
        log_dirs: Sequence[Path],
        store: "RemoteLogMetadataStore | None",
        rsm: "RemoteStorageManager | None",
        home: Path | None = None,
        fetch_quota: "FetchQuotaManager | None" = None,
        chunk_cache: "ChunkCache | None" = None,
        owned: Sequence = (),
    ) -> None:
        """``owned``: what :meth:`close` closes (the store and tier a factory opened for it)."""
        keep_large_buffers_in_the_heap()  # chunks of MiBs, a few alive at once (prefetch, FetchedBatch)
        self.log_dirs = list(log_dirs)
        self.store, self.rsm = store, rsm
        self.home = home
        self.fetch_quota = fetch_quota
        self.chunk_cache = chunk_cache
        self._owned = list(owned)

    @classmethod
    def from_environment(cls, store: "RemoteLogMetadataStore | None" = None) -> "TieredLogReader":
        """A reader on ``KTS_LOG_DIRS``, ``KTS_REMOTE_URI``, the chunk cache under ``KTS_HOME`` and
        the metadata store of ``KTS_DATABASE_URL`` (or the embedded server; ``store`` if given),
        with the fetch quota the store holds. The reader closes the store and the tier.
        ValueError (QuotaConfigError for a bad stored quota) for a bad setting, the store closed."""
        from kts_resources import settings
        from kts_resources.reading.chunk_cache import ChunkCache
        from kts_resources.metadata.store import RemoteLogMetadataStore
        from kts_resources.tiering.quotas import fetch_quota_manager
        from kts_resources.remote_storage.factory import remote_storage_from_uri

        store = store if store is not None else RemoteLogMetadataStore.from_env()
        try:
            quota = fetch_quota_manager(store.quota_config(), store.engine)
            rsm = remote_storage_from_uri(settings.remote_uri())
        except BaseException:
            store.close()
            raise
        home = settings.kts_home()
        return cls(log_dirs=settings.log_dirs(), store=store, rsm=rsm, home=home, fetch_quota=quota,
                   chunk_cache=ChunkCache(home / "chunk-cache"), owned=[store, rsm])

    def close(self) -> None:
        for thing in self._owned:
            thing.close()
        self._owned = []

    def __enter__(self) -> "TieredLogReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partition(self, topic: str, partition: int, *, previous: PartitionReader | None = None) -> PartitionReader:
        """A reader of one partition as of now. ``previous``: this partition's reader from an
        earlier call, returned again when nothing it read has changed since it was opened (its
        ``signature``) — a look at a few files' sizes and times and one store query, where opening
        a reader reads both tiers and scans the local log for the last stable offset."""
        from kts_resources.kafka.partition import topic_name_problem

        problem = topic_name_problem(topic)
        if problem is not None:
            raise ReadError(f"topic {topic!r}: {problem}")
        if partition < 0:
            raise ReadError(f"partition {partition} is negative")
        key = TopicPartition(topic, partition).dir_name
        located, _missing = locate_partitions(self.log_dirs, [key])
        signature = None
        if previous is not None and previous.tip is not None and (previous.topic, previous.partition) == (topic, partition):
            # Taken before the reader's own reads: a change after it shows as a changed signature next time.
            signature = self._signature(located.get(key), previous.tip)
            if signature is not None and signature == previous.signature:
                return previous
        reader = PartitionReader(topic, partition, located=located.get(key), store=self.store, rsm=self.rsm,
                                 index_dir=None, fetch_quota=self.fetch_quota, chunk_cache=self.chunk_cache)
        if signature is not None and reader.tip == previous.tip:
            reader.signature = signature
        if reader.tip is not None and self.home is not None:
            # Refreshed from the tier when a read finds it lacking (PartitionReader._refresh_index).
            reader.index_dir = index_cache.cache_directory(self.home, reader.tip)
        return reader

    def _signature(self, located: LocatedPartition | None, tip) -> tuple | None:
        """Everything a reader of the partition reads, as cheaply as it can be compared: its
        directory's files (names, sizes, times: segments, indexes, snapshots, the leader-epoch
        checkpoint, partition.metadata), its checkpoint entries, the store's rows of it (one
        digest) and its remote index cache. None when any of it cannot be read (a full open says why)."""
        try:
            local = None
            if located is not None:
                tp, log_dir = located.partition.topic_partition, located.log_dir
                local = (str(located.partition.path), file_tree(located.partition.path), log_dir.high_watermark(tp),
                         log_dir.recovery_point(tp), log_dir.log_start_offset(tp))
            mark = self.store.partition_change_mark(tip) if self.store is not None else None
            index = file_tree(index_cache.cache_directory(self.home, tip)) if self.home is not None else None
        except (OSError, KafkaFormatError):
            return None
        return local, mark, index

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = DEFAULT_MAX_BYTES,
              isolation: str = READ_UNCOMMITTED) -> FetchResult:
        return self.partition(topic, partition).fetch(offset, max_bytes, isolation)

    def offsets(self, topic: str, partition: int, spec: str | int, isolation: str = READ_UNCOMMITTED) -> OffsetAnswer:
        return self.partition(topic, partition).offsets(spec, isolation)


def parse_offset_spec(text: str) -> str | int:
    """A CLI/API offset spec: one of OFFSET_SPECS, or a timestamp in ms."""
    if text in OFFSET_SPECS:
        return text
    try:
        return int(text)
    except ValueError:
        raise ReadError(f"offset spec {text!r} is not one of {', '.join(OFFSET_SPECS)} or a timestamp in ms") from None
