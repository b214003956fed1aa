"""Offset and time indexes (.index / .timeindex): the file formats, the broker's indexing rule,
rebuilding them from a segment, verifying them against it, and looking entries up.

Segments are written with ``records.build_batch``; a small ``index.interval.bytes`` (200: an entry
every two or three batches) gives many index entries from a few KB of batches.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kts_resources.kafka.errors import CorruptRecordError, IndexFormatError
from kts_resources.kafka.indexes import (
    DEFAULT_SEGMENT_INDEX_BYTES,
    OFFSET_ENTRY_SIZE,
    TIME_ENTRY_SIZE,
    IndexFinding,
    OffsetPosition,
    SegmentIndexer,
    TimestampOffset,
    decode_offset_index,
    decode_time_index,
    encode_offset_index,
    encode_time_index,
    lookup_offset,
    lookup_timestamp,
    max_entries,
    preallocated_size,
    last_offset_index_entry,
    last_time_index_entry,
    read_offset_index,
    read_time_index,
    rebuild_indexes,
    rebuild_segment_indexes,
    segment_largest_timestamp,
    verify_segment_indexes,
)
from kts_resources.kafka.records import NewRecord, build_batch, read_records, scan_batches

INTERVAL = 200
INT32_MAX = 2**31 - 1


def segment_bytes(base_offset: int, batches: int = 60, seed: int = 7) -> bytes:
    """A segment of ``batches`` batches (1–4 records each) with timestamps that sometimes go back."""
    rng = random.Random(seed)
    out = bytearray()
    offset = base_offset
    ts = 1_700_000_000_000
    for _ in range(batches):
        n = rng.randint(1, 4)
        records = []
        for _ in range(n):
            ts += rng.randint(-400, 1000)  # producers' clocks disagree: out-of-order timestamps
            records.append(NewRecord(ts, b"k%d" % offset, rng.randbytes(rng.randint(0, 40))))
        out += build_batch(records, base_offset=offset)
        offset += n
    return bytes(out)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


@pytest.fixture
def closed_segment(tmp_path: Path) -> Path:
    """A rolled segment (a newer one follows it) with freshly rebuilt, trimmed indexes."""
    log = tmp_path / segment_name(100)
    log.write_bytes(segment_bytes(100))
    (tmp_path / segment_name(100_000)).write_bytes(b"")
    rebuild_segment_indexes(log, index_interval_bytes=INTERVAL)
    return log


def findings_text(findings: list[IndexFinding]) -> str:
    return "\n".join(str(f) for f in findings)


# --- file formats -------------------------------------------------------------------------------


@st.composite
def offset_entries(draw) -> tuple[int, list[OffsetPosition]]:
    base = draw(st.integers(0, 2**40))
    rel = sorted(draw(st.sets(st.integers(1, INT32_MAX), max_size=50)))
    positions = sorted(draw(st.lists(st.integers(0, INT32_MAX), min_size=len(rel), max_size=len(rel))))
    return base, [OffsetPosition(base + r, p) for r, p in zip(rel, positions)]


@st.composite
def time_entries(draw) -> tuple[int, list[TimestampOffset]]:
    base = draw(st.integers(0, 2**40))
    rel = sorted(draw(st.sets(st.integers(0, INT32_MAX), max_size=50)))
    stamps = sorted(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=len(rel), max_size=len(rel))))
    return base, [TimestampOffset(t, base + r) for t, r in zip(stamps, rel)]


@given(offset_entries())
def test_offset_index_round_trips_through_encode_and_decode(case):
    base, entries = case
    data = encode_offset_index(entries, base)
    assert len(data) == OFFSET_ENTRY_SIZE * len(entries)
    assert decode_offset_index(data, base) == entries


@given(time_entries())
def test_time_index_round_trips_through_encode_and_decode(case):
    base, entries = case
    data = encode_time_index(entries, base)
    assert len(data) == TIME_ENTRY_SIZE * len(entries)
    assert decode_time_index(data, base) == entries


@settings(max_examples=30)
@given(offset_entries(), time_entries())
def test_zero_filled_preallocated_tails_are_ignored(offsets, times):
    size = 64 * 1024
    base, entries = offsets
    data = encode_offset_index(entries, base)
    assert decode_offset_index(data.ljust(preallocated_size(size, OFFSET_ENTRY_SIZE), b"\0"), base) == entries
    base, stamps = times
    data = encode_time_index(stamps, base)
    assert decode_time_index(data.ljust(preallocated_size(size, TIME_ENTRY_SIZE), b"\0"), base) == stamps


def test_a_preallocated_index_with_no_entries_reads_as_empty():
    assert decode_offset_index(bytes(preallocated_size(DEFAULT_SEGMENT_INDEX_BYTES, OFFSET_ENTRY_SIZE)), 0) == []
    assert decode_time_index(bytes(preallocated_size(DEFAULT_SEGMENT_INDEX_BYTES, TIME_ENTRY_SIZE)), 5) == []


@settings(max_examples=60)
@given(offset_entries(), st.integers(0, 5000), st.booleans())
# Eight zero bytes: one entry at the base offset, or one preallocated slot? The whole read keeps it
# as an entry (only a zero run of several entries is preallocation); the bisection must agree.
@example(case=(0, []), zeros=1, first_at_base=False)
@example(case=(7, [OffsetPosition(9, 100)]), zeros=0, first_at_base=True)
def test_the_last_offset_index_entry_found_by_bisection_is_the_last_one_a_whole_read_finds(case, zeros, first_at_base):
    """An active segment's index is preallocated (10 MiB of zeros past its entries): the log end
    offset needs only its last entry, found in a few reads, the same one reading it all finds."""
    import tempfile

    base, entries = case
    if first_at_base and entries:  # a first entry at the base offset itself (relative offset 0)
        entries = [OffsetPosition(base, 0 if len(entries) == 1 else entries[0].position), *entries[1:]]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{base:020d}.index"
        path.write_bytes(encode_offset_index(entries, base) + bytes(OFFSET_ENTRY_SIZE * zeros))
        whole = read_offset_index(path)
        assert last_offset_index_entry(path) == (whole[-1] if whole else None)
        path.write_bytes(encode_offset_index(entries, base) + b"\0" * 3)  # not whole entries: no hint
        assert last_offset_index_entry(path) is None


@settings(max_examples=60)
@given(time_entries(), st.integers(0, 5000), st.integers(0, TIME_ENTRY_SIZE - 1))
def test_the_last_time_index_entry_found_by_bisection_is_the_last_one_a_whole_read_finds(case, zeros, partial):
    """A closed segment's largest timestamp is its time index's last entry: found in a few reads
    past any zero-filled tail, the same one reading it all finds; a last entry a crash cut short
    is not one."""
    import tempfile

    base, entries = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{base:020d}.timeindex"
        path.write_bytes(encode_time_index(entries, base) + bytes(TIME_ENTRY_SIZE * zeros))
        whole = read_time_index(path)
        assert last_time_index_entry(path) == (whole[-1] if whole else None)
        path.write_bytes(encode_time_index(entries, base) + bytes(TIME_ENTRY_SIZE * zeros) + b"\7" * partial)
        assert last_time_index_entry(path) == (whole[-1] if whole else None)


def test_a_trimmed_time_index_keeps_a_single_entry_at_timestamp_zero_and_the_base_offset():
    assert decode_time_index(bytes(TIME_ENTRY_SIZE), 42) == [TimestampOffset(0, 42)]


def test_reading_stops_at_the_first_later_entry_with_relative_offset_zero():
    data = struct.pack(">ii", 3, 100) + struct.pack(">ii", 0, 0) + struct.pack(">ii", 9, 400)
    assert decode_offset_index(data, 10) == [OffsetPosition(13, 100)]


@pytest.mark.parametrize(("decode", "entry_size"), [(decode_offset_index, 8), (decode_time_index, 12)])
def test_a_partial_entry_raises_naming_the_file_and_byte_position(decode, entry_size):
    data = bytes(range(1, entry_size * 3 + 1)) + b"\x01\x02\x03"
    with pytest.raises(IndexFormatError) as e:
        decode(data, 0, path="/logs/t-0/00000000000000000000.index")
    assert e.value.position == entry_size * 3
    assert e.value.path == "/logs/t-0/00000000000000000000.index"
    assert f"byte {entry_size * 3}" in str(e.value)


def test_encoding_refuses_an_offset_that_does_not_fit_a_relative_int32():
    with pytest.raises(ValueError):
        encode_offset_index([OffsetPosition(5, 0)], 10)
    with pytest.raises(ValueError):
        encode_time_index([TimestampOffset(1, 10 + INT32_MAX + 1)], 10)


def test_preallocated_size_rounds_down_to_whole_entries_as_abstract_index_does():
    assert preallocated_size(DEFAULT_SEGMENT_INDEX_BYTES, OFFSET_ENTRY_SIZE) == 10 * 1024 * 1024
    assert preallocated_size(DEFAULT_SEGMENT_INDEX_BYTES, TIME_ENTRY_SIZE) == 10 * 1024 * 1024 - 4
    assert preallocated_size(67, 8) == 64
    assert max_entries(100, TIME_ENTRY_SIZE) == 8
    with pytest.raises(ValueError):
        preallocated_size(7, 8)


# --- the broker's rule --------------------------------------------------------------------------


def test_broker_rule_indexes_exactly_the_expected_entries():
    indexer = SegmentIndexer(base_offset=0, index_interval_bytes=100)
    # (position, size, last offset, max timestamp) -> (offset entry, time entry) added
    steps = [
        ((0, 150, 2, 1000), (None, None)),  # the first batch is never indexed
        ((150, 80, 5, 900), (OffsetPosition(5, 150), TimestampOffset(1000, 2))),  # 150 > 100: index
        ((230, 60, 7, 1200), (None, None)),  # 80 since the last entry
        ((290, 50, 9, 1100), (OffsetPosition(9, 290), TimestampOffset(1200, 7))),  # max ts came at offset 7
        ((340, 200, 12, 1150), (None, None)),
        ((540, 10, 13, 1190), (OffsetPosition(13, 540), None)),  # max ts still 1200: not strictly greater
        ((550, 120, 20, 1300), (None, None)),
    ]
    for args, expected in steps:
        assert indexer.append_batch(*args) == expected, args
    assert indexer.max_timestamp_so_far == 1300
    assert indexer.offset_of_max_timestamp_so_far == 20
    assert indexer.close() == TimestampOffset(1300, 20)  # the roll adds the segment's largest timestamp
    assert indexer.close() is None  # and only once
    assert indexer.offset_entries == [OffsetPosition(5, 150), OffsetPosition(9, 290), OffsetPosition(13, 540)]
    assert indexer.time_entries == [TimestampOffset(1000, 2), TimestampOffset(1200, 7), TimestampOffset(1300, 20)]


def test_broker_rule_needs_strictly_more_than_the_interval_since_the_last_entry():
    indexer = SegmentIndexer(base_offset=0, index_interval_bytes=100)
    assert indexer.append_batch(0, 100, 0, 10) == (None, None)
    assert indexer.append_batch(100, 100, 1, 20) == (None, None)  # exactly 100 bytes: not yet
    # The batch's own timestamp counts before it is indexed (LogSegment.append updates the max first).
    assert indexer.append_batch(200, 100, 2, 30) == (OffsetPosition(2, 200), TimestampOffset(30, 2))


def test_close_adds_nothing_when_the_last_time_entry_already_holds_the_largest_timestamp():
    indexer = SegmentIndexer(base_offset=0, index_interval_bytes=0)
    indexer.append_batch(0, 70, 0, 500)
    assert indexer.append_batch(70, 70, 1, 400) == (OffsetPosition(1, 70), TimestampOffset(500, 0))
    assert indexer.close() is None


def test_a_segment_without_timestamps_has_an_empty_time_index():
    indexer = SegmentIndexer(base_offset=0, index_interval_bytes=0)
    for i in range(5):
        indexer.append_batch(i * 50, 50, i, -1)  # magic 0: NO_TIMESTAMP
    assert indexer.close() is None
    assert indexer.time_entries == []
    assert len(indexer.offset_entries) == 4


def test_indexer_refuses_an_offset_outside_the_segments_relative_range():
    indexer = SegmentIndexer(base_offset=1000)
    with pytest.raises(ValueError):
        indexer.append_batch(0, 80, 999, 1)
    with pytest.raises(ValueError):
        indexer.append_batch(0, 80, 1000 + INT32_MAX + 1, 1)


def test_the_time_index_is_full_one_entry_before_the_offset_index():
    indexer = SegmentIndexer(base_offset=0, index_interval_bytes=0)
    segment_index_bytes = 48  # 6 offset entries, 4 time entries
    indexer.append_batch(0, 10, 0, 1)
    for i in range(1, 4):
        assert not indexer.is_full(segment_index_bytes)
        indexer.append_batch(i * 10, 10, i, i + 1)
    assert len(indexer.time_entries) == 3
    assert indexer.is_full(segment_index_bytes)  # the last time slot is kept for the roll's entry


# --- rebuild ------------------------------------------------------------------------------------


def test_rebuilt_indexes_of_a_closed_segment_pass_verification(closed_segment: Path):
    assert verify_segment_indexes(closed_segment) == []
    offsets = read_offset_index(closed_segment.with_suffix(".index"))
    times = read_time_index(closed_segment.with_suffix(".timeindex"))
    assert len(offsets) > 20 and len(times) > 5
    batches = scan_batches(closed_segment.read_bytes()).batches
    assert times[-1].timestamp == max(b.max_timestamp for b in batches)


def test_rebuild_matches_feeding_every_batch_to_the_broker_rule_and_rolling():
    data = segment_bytes(0)
    indexer = SegmentIndexer(0, INTERVAL)
    for b in scan_batches(data).batches:
        indexer.append_batch(b.position, b.size, b.last_offset, b.max_timestamp)
    indexer.close()
    rebuilt = rebuild_indexes(data, 0, closed=True, index_interval_bytes=INTERVAL)
    assert rebuilt.offset_index == indexer.offset_index_bytes()
    assert rebuilt.time_index == indexer.time_index_bytes()
    assert rebuilt.scan.invalid is None


def test_rebuild_of_the_active_segment_appends_the_closing_time_entry_as_recovery_does(tmp_path: Path):
    """LogSegment.recover ends with timeIndex.maybeAppend(maxTimestampSoFar, ..., true) for every
    segment it recovers, the active one included: a rebuild writes what recovery writes."""
    (tmp_path / segment_name(0)).write_bytes(segment_bytes(0, seed=1))
    active = tmp_path / segment_name(1000)
    body = segment_bytes(1000, batches=40, seed=2)
    end = scan_batches(body).batches[-1].next_offset
    # A big batch, then a small indexed one, then the newest timestamp in a batch too close to be indexed.
    tail = build_batch([NewRecord(5, b"big", bytes(INTERVAL))], base_offset=end)
    tail += build_batch([NewRecord(6, b"k", b"v")], base_offset=end + 1)
    tail += build_batch([NewRecord(2_000_000_000_000, b"k", b"v")], base_offset=end + 2)
    active.write_bytes(body + tail)
    rebuilt = rebuild_segment_indexes(active, index_interval_bytes=INTERVAL)
    assert not rebuilt.closed
    closed = rebuild_indexes(active.read_bytes(), 1000, closed=True, index_interval_bytes=INTERVAL)
    assert rebuilt.offset_index == closed.offset_index
    assert rebuilt.time_index == closed.time_index
    assert rebuilt.time_entries[-1] == TimestampOffset(2_000_000_000_000, end + 2)
    assert verify_segment_indexes(active) == []


def test_verify_accepts_an_active_segments_preallocated_indexes(tmp_path: Path):
    active = tmp_path / segment_name(0)
    active.write_bytes(segment_bytes(0))
    rebuilt = rebuild_segment_indexes(active, index_interval_bytes=INTERVAL)
    Path(rebuilt.offset_index_path).write_bytes(rebuilt.offset_index.ljust(preallocated_size(4096, OFFSET_ENTRY_SIZE), b"\0"))
    Path(rebuilt.time_index_path).write_bytes(rebuilt.time_index.ljust(preallocated_size(4096, TIME_ENTRY_SIZE), b"\0"))
    assert verify_segment_indexes(active) == []
    assert read_offset_index(rebuilt.offset_index_path) == list(rebuilt.offset_entries)
    findings = verify_segment_indexes(active, closed=True)
    assert any("zero-filled" in f.message and f.position == len(rebuilt.offset_index) for f in findings)
    assert any("zero-filled" in f.message and f.position == len(rebuilt.time_index) for f in findings)


def test_rebuild_writes_into_out_dir_without_leaving_temporary_files(tmp_path: Path):
    log = tmp_path / "t-0" / segment_name(0)
    log.parent.mkdir()
    log.write_bytes(segment_bytes(0))
    out = tmp_path / "out"
    rebuilt = rebuild_segment_indexes(log, out_dir=out, closed=True, index_interval_bytes=INTERVAL)
    assert sorted(p.name for p in out.iterdir()) == ["00000000000000000000.index", "00000000000000000000.timeindex"]
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name]
    assert (out / "00000000000000000000.index").read_bytes() == rebuilt.offset_index
    # Rebuilding again replaces the files with the same bytes.
    rebuild_segment_indexes(log, out_dir=out, closed=True, index_interval_bytes=INTERVAL)
    assert (out / "00000000000000000000.timeindex").read_bytes() == rebuilt.time_index
    assert len(list(out.iterdir())) == 2


def test_rebuild_refuses_a_segment_with_a_batch_failing_its_crc(tmp_path: Path):
    data = bytearray(segment_bytes(0))
    victim = scan_batches(bytes(data)).batches[17]
    data[victim.position + victim.size - 1] ^= 0xFF  # flip a bit in the last record's value
    log = tmp_path / segment_name(0)
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as e:
        rebuild_segment_indexes(log, index_interval_bytes=INTERVAL)
    assert e.value.position == victim.position
    assert e.value.path == str(log)
    assert f"byte {victim.position}" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [log.name]  # nothing written


def test_rebuild_indexes_the_valid_prefix_before_invalid_trailing_bytes():
    valid = segment_bytes(0)
    torn = build_batch([NewRecord(1, b"k", b"v" * 100)], base_offset=10_000)[:50]  # a crash mid-write
    rebuilt = rebuild_indexes(valid + torn, 0, closed=True, index_interval_bytes=INTERVAL, path="x.log")
    expected = rebuild_indexes(valid, 0, closed=True, index_interval_bytes=INTERVAL)
    assert rebuilt.offset_index == expected.offset_index
    assert rebuilt.time_index == expected.time_index
    assert rebuilt.scan.invalid is not None
    assert rebuilt.scan.invalid.position == len(valid)
    assert rebuilt.scan.invalid.length == len(torn)


def test_an_empty_segment_has_empty_indexes(tmp_path: Path):
    log = tmp_path / segment_name(0)
    log.write_bytes(b"")
    rebuilt = rebuild_segment_indexes(log)
    assert rebuilt.offset_index == rebuilt.time_index == b""
    assert verify_segment_indexes(log) == []
    assert verify_segment_indexes(log, closed=True) == []


# --- verify -------------------------------------------------------------------------------------


def rewrite(path: Path, fmt: str, entry: int, *values: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, entry * struct.calcsize(fmt), *values)
    path.write_bytes(bytes(data))


def test_verify_catches_an_offset_entry_pointing_mid_batch(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    entry = read_offset_index(index)[5]
    rewrite(index, ">ii", 5, entry.offset - 100, entry.position + 7)
    findings = verify_segment_indexes(closed_segment)
    assert [(f.path, f.position) for f in findings] == [(str(index), 5 * OFFSET_ENTRY_SIZE)]
    assert "no batch starts" in findings[0].message


def test_verify_catches_an_offset_entry_naming_the_wrong_offset(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    entries = read_offset_index(index)
    rewrite(index, ">ii", 8, entries[8].offset - 100 - 1, entries[8].position)
    findings = verify_segment_indexes(closed_segment)
    assert [f.position for f in findings] == [8 * OFFSET_ENTRY_SIZE], findings_text(findings)
    assert "is not the last offset of that batch or of a later one" in findings[0].message


def test_verify_accepts_an_entry_left_by_a_multi_batch_append_before_kafka_806(closed_segment: Path):
    """Before KAFKA-806 (Kafka 4.1; 3.9.1/4.0.1 backports) LogSegment.append indexed a multi-batch
    append (a follower's fetch, the cleaner) as (the append's largest offset, its first batch's position)."""
    index = closed_segment.with_suffix(".index")
    entries = read_offset_index(index)
    batches = scan_batches(closed_segment.read_bytes()).batches
    later = next(b for b in batches if entries[8].offset < b.last_offset < entries[9].offset)
    rewrite(index, ">ii", 8, later.last_offset - 100, entries[8].position)
    assert verify_segment_indexes(closed_segment) == []


def test_verify_catches_offsets_going_backwards(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    entries = read_offset_index(index)
    rewrite(index, ">ii", 3, entries[4].offset - 100, entries[4].position)
    rewrite(index, ">ii", 4, entries[3].offset - 100, entries[3].position)
    text = findings_text(verify_segment_indexes(closed_segment))
    assert f"byte {4 * OFFSET_ENTRY_SIZE}: offset {entries[3].offset} does not increase" in text
    assert f"position {entries[3].position} does not increase" in text


def test_verify_catches_time_index_timestamps_going_backwards(closed_segment: Path):
    timeindex = closed_segment.with_suffix(".timeindex")
    entries = read_time_index(timeindex)
    rewrite(timeindex, ">qi", 2, entries[1].timestamp - 1, entries[2].offset - 100)
    findings = verify_segment_indexes(closed_segment)
    assert any(f.position == 2 * TIME_ENTRY_SIZE and "goes backwards" in f.message for f in findings), findings_text(findings)
    assert any(f.position == 2 * TIME_ENTRY_SIZE and "the batch holding that offset" in f.message for f in findings)


def test_verify_catches_a_time_entry_inside_a_batch_without_its_timestamp(closed_segment: Path):
    timeindex = closed_segment.with_suffix(".timeindex")
    entries = read_time_index(timeindex)
    batches = scan_batches(closed_segment.read_bytes()).batches
    inside = next(b for b in batches if b.base_offset < b.last_offset and entries[1].offset < b.base_offset < entries[2].offset)
    rewrite(timeindex, ">qi", 1, entries[1].timestamp, inside.base_offset - 100)
    findings = verify_segment_indexes(closed_segment)
    assert any(f.position == TIME_ENTRY_SIZE and "the batch holding that offset" in f.message for f in findings), findings_text(findings)


def test_verify_catches_a_closed_segment_without_the_rolls_final_time_entry(closed_segment: Path):
    timeindex = closed_segment.with_suffix(".timeindex")
    timeindex.write_bytes(timeindex.read_bytes()[:-TIME_ENTRY_SIZE])
    findings = verify_segment_indexes(closed_segment)
    assert len(findings) == 1 and "not the segment's largest" in findings[0].message


def test_verify_catches_a_truncated_index_file(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    data = index.read_bytes()
    index.write_bytes(data[:-3])
    findings = verify_segment_indexes(closed_segment)
    assert findings[0].path == str(index)
    assert findings[0].position == len(data) - OFFSET_ENTRY_SIZE
    assert "truncated" in findings[0].message


def test_verify_catches_missing_index_files(closed_segment: Path):
    closed_segment.with_suffix(".index").unlink()
    closed_segment.with_suffix(".timeindex").unlink()
    findings = verify_segment_indexes(closed_segment)
    assert [(Path(f.path).suffix, f.position) for f in findings] == [(".index", None), (".timeindex", None)]
    assert all("missing" in f.message for f in findings)


def test_verify_catches_entries_hidden_behind_a_zero_relative_offset(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    rewrite(index, ">ii", 6, 0, 0)
    findings = verify_segment_indexes(closed_segment, closed=False)
    assert [f.position for f in findings] == [6 * OFFSET_ENTRY_SIZE]
    assert "invisible" in findings[0].message


def test_verify_catches_offsets_outside_the_segment(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    entries = read_offset_index(index)
    rewrite(index, ">ii", len(entries) - 1, 1_000_000, entries[-1].position + 1)
    findings = verify_segment_indexes(closed_segment)
    assert any("outside the segment's offsets" in f.message for f in findings), findings_text(findings)


def test_index_findings_read_as_one_line_naming_file_and_byte():
    assert str(IndexFinding("/d/0.index", 16, "bad")) == "/d/0.index: byte 16: bad"
    assert str(IndexFinding("/d/0.index", None, "missing")) == "/d/0.index: missing"


# --- lookup -------------------------------------------------------------------------------------


def test_lookup_offset_finds_the_largest_entry_at_or_below_the_target():
    entries = [OffsetPosition(105, 300), OffsetPosition(110, 700), OffsetPosition(120, 1500)]
    assert lookup_offset(entries, 100, 100) == OffsetPosition(100, 0)
    assert lookup_offset(entries, 104, 100) == OffsetPosition(100, 0)
    assert lookup_offset(entries, 105, 100) == OffsetPosition(105, 300)
    assert lookup_offset(entries, 119, 100) == OffsetPosition(110, 700)
    assert lookup_offset(entries, 10**9, 100) == OffsetPosition(120, 1500)
    assert lookup_offset([], 5, 0) == OffsetPosition(0, 0)


def test_lookup_timestamp_finds_the_largest_entry_at_or_below_the_target():
    entries = [TimestampOffset(1000, 7), TimestampOffset(2000, 15), TimestampOffset(2500, 30)]
    assert lookup_timestamp(entries, 999, 0) == TimestampOffset(-1, 0)
    assert lookup_timestamp(entries, 1000, 0) == TimestampOffset(1000, 7)
    assert lookup_timestamp(entries, 2499, 0) == TimestampOffset(2000, 15)
    assert lookup_timestamp(entries, 9999, 0) == TimestampOffset(2500, 30)
    assert lookup_timestamp([], 9999, 3) == TimestampOffset(-1, 3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_lookups_on_rebuilt_indexes_never_skip_a_wanted_record(seed, data):
    base = 500
    log = segment_bytes(base, batches=30, seed=seed)
    rebuilt = rebuild_indexes(log, base, closed=True, index_interval_bytes=INTERVAL)
    batches = rebuilt.scan.batches
    start_of = {b.position: b for b in batches}
    records = [(h, r) for h, rs in read_records(log) for r in rs]

    target = data.draw(st.integers(base, batches[-1].last_offset))
    found = lookup_offset(rebuilt.offset_entries, target, base)
    assert found.offset <= target
    assert start_of[found.position].base_offset <= target  # scanning forward from here reaches it

    ts = data.draw(st.integers(min(r.timestamp for _, r in records) - 10, max(r.timestamp for _, r in records) + 10))
    hit = lookup_timestamp(rebuilt.time_entries, ts, base)
    scan_from = lookup_offset(rebuilt.offset_entries, hit.offset, base).position
    # KIP-33: every record with timestamp >= ts lies in a batch at or after the scan's start.
    assert all(h.position >= scan_from for h, r in records if r.timestamp >= ts)


def test_a_segment_without_timestamps_ages_by_its_file_modification_time(tmp_path):
    """KIP-33: no timestamps (an empty time index, or only a zero-filled preallocated tail) → the
    .log's mtime is the segment's largest timestamp, as Kafka's LogSegment.largestTimestamp says."""
    import os
    import struct

    from kts_resources.kafka.logdir import SegmentFiles

    log, index, timeindex = (tmp_path / f"{0:020d}{s}" for s in (".log", ".index", ".timeindex"))
    log.write_bytes(b"x" * 10)
    timeindex.write_bytes(b"\0" * 24)
    os.utime(log, ns=(1_600_000_000_123_000_000, 1_600_000_000_123_000_000))
    segment = SegmentFiles(0, log, index, timeindex, None, active=False, next_base_offset=10)
    assert segment_largest_timestamp(segment) == 1_600_000_000_123
    timeindex.write_bytes(struct.pack(">qi", 1_700_000_000_000, 4) + struct.pack(">qi", 1_700_000_000_500, 9) + b"\0" * 12)
    assert segment_largest_timestamp(segment) == 1_700_000_000_500
