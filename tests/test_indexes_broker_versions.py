"""Index files as real brokers write them, version by version: ``kts index verify`` accepts every one
and still catches corruption; ``kts index rebuild`` writes what ``LogSegment.recover`` writes.

:class:`BrokerSegment` follows Kafka's own code path (LogSegment.append / close /
onBecomeInactiveSegment, TimeIndex.maybeAppend, LogValidator's offset of the largest timestamp),
with the rule switches that changed between versions:

- ``per_batch``: KAFKA-806 (Kafka 4.1, backported to 3.9.1 and 4.0.1) indexes each batch of an
  append; every earlier version adds at most one entry per append, (the append's largest offset,
  its first batch's position).
- the offset an append reports for its largest timestamp: a leader's uncompressed CreateTime
  magic-2 batch gave the RECORD's offset in Kafka 0.11.0 to 3.6.x; 3.7.0 onwards (#14697, then
  KAFKA-16310 in 3.8.0) the batch's last offset, as followers and the cleaner always did.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kts_resources.kafka.indexes import (
    TIME_ENTRY_SIZE,
    OffsetPosition,
    TimestampOffset,
    encode_offset_index,
    encode_time_index,
    read_offset_index,
    read_time_index,
    rebuild_indexes,
    verify_segment_indexes,
)
from kts_resources.kafka.records import NO_TIMESTAMP, NewRecord, build_batch, scan_batches

INTERVAL = 150
T0 = 1_700_000_000_000


@dataclass
class BrokerSegment:
    """One log segment as a broker writes it: the log, its offset index and its time index."""

    base_offset: int
    per_batch: bool = False
    interval: int = INTERVAL
    log: bytearray = field(default_factory=bytearray)
    offsets: list[OffsetPosition] = field(default_factory=list)
    times: list[TimestampOffset] = field(default_factory=list)
    max_timestamp: int = NO_TIMESTAMP
    offset_of_max_timestamp: int = -1
    bytes_since_last_entry: int = 0

    def __post_init__(self) -> None:
        self.offset_of_max_timestamp = self.base_offset

    def _maybe_append_time(self) -> None:
        # TimeIndex.maybeAppend: only a timestamp greater than the last entry's (empty: -1).
        last = self.times[-1].timestamp if self.times else NO_TIMESTAMP
        if self.max_timestamp > last:
            self.times.append(TimestampOffset(self.max_timestamp, self.offset_of_max_timestamp))

    def append(self, batches: list[bytes], offset_of_max_timestamp: int | None = None) -> None:
        """LogSegment.append of one MemoryRecords holding ``batches``.

        ``offset_of_max_timestamp`` is what the caller passed as shallowOffsetOfMaxTimestamp
        (default: the last offset of the batch with the largest timestamp, the follower's rule).
        """
        data = b"".join(batches)
        headers = scan_batches(data).batches
        position = len(self.log)
        self.log += data
        if self.per_batch:  # KAFKA-806
            for h in headers:
                if h.max_timestamp > self.max_timestamp:
                    self.max_timestamp, self.offset_of_max_timestamp = h.max_timestamp, h.last_offset
                if self.bytes_since_last_entry > self.interval:
                    self.offsets.append(OffsetPosition(h.last_offset, position + h.position))
                    self._maybe_append_time()
                    self.bytes_since_last_entry = 0
                self.bytes_since_last_entry += h.size
            return
        largest = max(headers, key=lambda h: h.max_timestamp)
        if offset_of_max_timestamp is None:
            offset_of_max_timestamp = next(h for h in headers if h.max_timestamp == largest.max_timestamp).last_offset
        if largest.max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = largest.max_timestamp, offset_of_max_timestamp
        if self.bytes_since_last_entry > self.interval:
            self.offsets.append(OffsetPosition(headers[-1].last_offset, position))
            self._maybe_append_time()
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += len(data)

    def close(self) -> None:
        """LogSegment.close (clean shutdown) and onBecomeInactiveSegment (roll): the closing entry."""
        self._maybe_append_time()

    def reopen(self) -> None:
        """A broker restart after a clean shutdown: a new LogSegment over the same files, its max
        timestamp so far loaded from the time index's last entry, no bytes since the last entry."""
        last = self.times[-1] if self.times else TimestampOffset(NO_TIMESTAMP, self.base_offset)
        self.max_timestamp, self.offset_of_max_timestamp = last.timestamp, last.offset
        self.bytes_since_last_entry = 0

    def write(self, directory: Path) -> Path:
        log = directory / f"{self.base_offset:020d}.log"
        log.write_bytes(bytes(self.log))
        log.with_suffix(".index").write_bytes(encode_offset_index(self.offsets, self.base_offset))
        log.with_suffix(".timeindex").write_bytes(encode_time_index(self.times, self.base_offset))
        return log


def leader_batch(offset: int, timestamps: list[int], rng: random.Random) -> bytes:
    return build_batch([NewRecord(ts, b"k", rng.randbytes(rng.randint(5, 40))) for ts in timestamps], base_offset=offset)


def produce(segment: BrokerSegment, batches: int, *, record_offset_rule: bool, seed: int = 1, start: int | None = None) -> int:
    """Leader appends (one batch each, as magic 2 requires of a produce request), the largest
    timestamp usually NOT the batch's last record. Returns the next offset."""
    rng = random.Random(seed)
    offset = segment.base_offset if start is None else start
    ts = T0 if segment.max_timestamp < 0 else segment.max_timestamp
    for _ in range(batches):
        n = rng.randint(2, 4)
        stamps = [ts + rng.randint(1, 500) for _ in range(n)]
        stamps[0] = max(stamps) + 7  # the first record carries the largest timestamp
        ts = max(stamps)
        batch = leader_batch(offset, stamps, rng)
        # LogValidator.assignOffsetsNonCompressed: Kafka 0.11.0-3.6.x gave the record's offset.
        segment.append([batch], offset if record_offset_rule else offset + n - 1)
        offset += n
    return offset


def follower_fetches(segment: BrokerSegment, fetches: int, *, seed: int = 2, gaps: bool = False) -> int:
    """Follower (or cleaner) appends of several batches at once; ``gaps`` drops offsets between
    batches as compaction does. Returns the next offset."""
    rng = random.Random(seed)
    offset = segment.base_offset
    ts = T0
    for _ in range(fetches):
        batches = []
        for _ in range(rng.randint(2, 5)):
            n = rng.randint(1, 3)
            stamps = [ts + rng.randint(-50, 400) for _ in range(n)]
            ts = max(ts, *stamps)
            batches.append(leader_batch(offset, stamps, rng))
            offset += n + (rng.randint(1, 5) if gaps else 0)
        segment.append(batches)
    return offset


def assert_clean(log: Path, *, closed: bool) -> None:
    findings = verify_segment_indexes(log, closed=closed)
    assert findings == [], "\n".join(map(str, findings))


def rewrite(path: Path, fmt: str, entry: int, *values: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, entry * struct.calcsize(fmt), *values)
    path.write_bytes(bytes(data))


# --- each version's rule verifies clean ----------------------------------------------------------


def test_time_entries_at_the_record_with_the_largest_timestamp_from_kafka_0_11_to_3_6_verify(tmp_path: Path):
    segment = BrokerSegment(0)
    produce(segment, 60, record_offset_rule=True)
    segment.close()
    log = segment.write(tmp_path)
    batches = scan_batches(log.read_bytes()).batches
    lasts = {b.last_offset for b in batches}
    # The rule really shows: time entries that are not a batch's last offset.
    assert any(e.offset not in lasts for e in read_time_index(log.with_suffix(".timeindex")))
    assert_clean(log, closed=True)


def test_time_entries_at_the_batchs_last_offset_from_kafka_3_7_verify(tmp_path: Path):
    segment = BrokerSegment(0)
    produce(segment, 60, record_offset_rule=False)
    segment.close()
    assert_clean(segment.write(tmp_path), closed=True)


def test_one_entry_per_multi_batch_append_before_kafka_806_verifies(tmp_path: Path):
    segment = BrokerSegment(0)
    follower_fetches(segment, 40)
    segment.close()
    log = segment.write(tmp_path)
    by_position = {b.position: b for b in scan_batches(log.read_bytes()).batches}
    # The rule really shows: entries whose offset ends a later batch than the one they point at.
    assert any(by_position[e.position].last_offset < e.offset for e in read_offset_index(log.with_suffix(".index")))
    assert_clean(log, closed=True)


def test_per_batch_entries_since_kafka_806_verify(tmp_path: Path):
    segment = BrokerSegment(0, per_batch=True)
    follower_fetches(segment, 40)
    segment.close()
    assert_clean(segment.write(tmp_path), closed=True)


def test_a_cleaner_written_segment_with_offset_gaps_verifies(tmp_path: Path):
    """LogCleaner.cleanInto appends the retained batches of each read buffer in one append, then
    onBecomeInactiveSegment closes the cleaned segment."""
    segment = BrokerSegment(0)
    follower_fetches(segment, 30, gaps=True)
    segment.close()
    assert_clean(segment.write(tmp_path), closed=True)


def test_a_closing_entry_at_each_clean_shutdown_of_the_active_segment_verifies(tmp_path: Path):
    segment = BrokerSegment(0)
    next_offset = produce(segment, 20, record_offset_rule=True, seed=3)
    for restart in range(3):
        segment.close()  # clean shutdown: the closing entry lands mid-index
        segment.reopen()
        next_offset = produce(segment, 3 + restart, record_offset_rule=False, seed=10 + restart, start=next_offset)
    log = segment.write(tmp_path)
    assert_clean(log, closed=False)
    segment.close()  # the roll
    assert_clean(segment.write(tmp_path), closed=True)


def test_rebuild_writes_what_recovery_writes(tmp_path: Path):
    """LogSegment.recover: per batch, time entries at batch last offsets, the closing entry appended."""
    segment = BrokerSegment(0, per_batch=True)
    produce(segment, 50, record_offset_rule=False)
    segment.close()
    rebuilt = rebuild_indexes(bytes(segment.log), 0, closed=False, index_interval_bytes=INTERVAL)
    assert rebuilt.offset_index == encode_offset_index(segment.offsets, 0)
    assert rebuilt.time_index == encode_time_index(segment.times, 0)


# --- corruption is still caught on those indexes --------------------------------------------------


@pytest.fixture
def old_leader_segment(tmp_path: Path) -> Path:
    """A closed segment written by a Kafka 3.6 leader: record-offset time entries."""
    segment = BrokerSegment(0)
    produce(segment, 60, record_offset_rule=True)
    segment.close()
    log = segment.write(tmp_path)
    assert_clean(log, closed=True)
    return log


def test_an_offset_entry_past_the_log_is_caught(old_leader_segment: Path):
    index = old_leader_segment.with_suffix(".index")
    entries = read_offset_index(index)
    rewrite(index, ">ii", len(entries) - 1, entries[-1].offset + 10_000, entries[-1].position)
    text = "\n".join(map(str, verify_segment_indexes(old_leader_segment, closed=True)))
    assert "outside the segment's offsets" in text


def test_an_offset_entry_at_a_wrong_position_is_caught(old_leader_segment: Path):
    index = old_leader_segment.with_suffix(".index")
    entries = read_offset_index(index)
    rewrite(index, ">ii", 3, entries[3].offset, entries[3].position + 1)
    text = "\n".join(map(str, verify_segment_indexes(old_leader_segment, closed=True)))
    assert "where no batch starts" in text


def test_decreasing_time_entries_are_caught(old_leader_segment: Path):
    timeindex = old_leader_segment.with_suffix(".timeindex")
    entries = read_time_index(timeindex)
    rewrite(timeindex, ">qi", 4, entries[2].timestamp, entries[2].offset)
    text = "\n".join(map(str, verify_segment_indexes(old_leader_segment, closed=True)))
    assert f"byte {4 * TIME_ENTRY_SIZE}: offset {entries[2].offset} does not increase" in text
    assert "goes backwards" in text


def test_a_timestamp_above_the_segments_largest_is_caught(old_leader_segment: Path):
    timeindex = old_leader_segment.with_suffix(".timeindex")
    entries = read_time_index(timeindex)
    rewrite(timeindex, ">qi", len(entries) - 1, entries[-1].timestamp + 1, entries[-1].offset)
    text = "\n".join(map(str, verify_segment_indexes(old_leader_segment, closed=True)))
    assert "above the segment's largest timestamp" in text


def test_a_time_entry_at_a_record_without_that_timestamp_is_caught(old_leader_segment: Path):
    timeindex = old_leader_segment.with_suffix(".timeindex")
    entries = read_time_index(timeindex)
    rewrite(timeindex, ">qi", 2, entries[2].timestamp, entries[3].offset)
    text = "\n".join(map(str, verify_segment_indexes(old_leader_segment, closed=True)))
    assert "the batch holding that offset" in text


def test_a_fresh_active_segment_with_preallocated_empty_indexes_verifies(tmp_path: Path):
    """Right after a roll the new active segment is empty and its indexes are segment.index.bytes of zeros."""
    log = tmp_path / f"{500:020d}.log"
    log.write_bytes(b"")
    log.with_suffix(".index").write_bytes(bytes(10 * 1024 * 1024))
    log.with_suffix(".timeindex").write_bytes(bytes(10 * 1024 * 1024 - 10 * 1024 * 1024 % TIME_ENTRY_SIZE))
    assert_clean(log, closed=False)


def test_an_active_segment_with_one_batch_and_preallocated_indexes_verifies(tmp_path: Path):
    segment = BrokerSegment(0)
    produce(segment, 1, record_offset_rule=True)
    log = segment.write(tmp_path)
    for suffix in (".index", ".timeindex"):
        path = log.with_suffix(suffix)
        path.write_bytes(path.read_bytes().ljust(12 * 1024, b"\0"))
    assert_clean(log, closed=False)
