"""The seeds' remote log index (kts_resources/reading/remote_index.py): files kts writes parse with a
separate, minimal reader of the seeds' layout written here from the seed's text (not kts's code),
every entry's CRC holds, the indexes point at entries, rotation keeps whole segments, an
incremental build after retention rewrites only the file that held the deleted segments, and
damaged files are clear errors naming file and position."""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from crc32c import crc32c

from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.kafka.records import NewRecord, build_batch, scan_batches

KEY = "tiered/orders-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"


# --- a minimal reader of the seeds' layout, independent of kts ----------------------------------


@dataclass
class SeedEntry:
    position: int
    first_offset: int
    last_offset: int
    first_timestamp: int
    last_timestamp: int
    data_length: int
    rdi: bytes


def seed_entries(data: bytes) -> list[SeedEntry]:
    """magic int16 | length int16 | crc int32 (over firstOffset..end) | firstOffset int64 |
    lastOffset int64 | firstTimestamp int64 | lastTimestamp int64 | dataLength int32 |
    rdiLength int16 | rdi — read field by field."""
    out, pos = [], 0
    while pos < len(data):
        magic = int.from_bytes(data[pos:pos + 2], "big", signed=True)
        length = int.from_bytes(data[pos + 2:pos + 4], "big", signed=True)
        crc = int.from_bytes(data[pos + 4:pos + 8], "big", signed=False)
        body = data[pos + 8:pos + length]
        assert magic == 0 and len(body) == length - 8
        assert crc32c(body) == crc, f"entry at {pos}: CRC"
        first, last, first_ts, last_ts = (int.from_bytes(body[i:i + 8], "big", signed=True) for i in range(0, 32, 8))
        data_length = int.from_bytes(body[32:36], "big", signed=True)
        rdi_length = int.from_bytes(body[36:38], "big", signed=True)
        rdi = body[38:38 + rdi_length]
        assert len(rdi) == rdi_length == length - 46
        out.append(SeedEntry(pos, first, last, first_ts, last_ts, data_length, rdi))
        pos += length
    return out


def seed_pairs(data: bytes, fmt: str) -> list[tuple[int, int]]:
    size = struct.calcsize(fmt)
    assert len(data) % size == 0
    return [struct.unpack_from(fmt, data, i) for i in range(0, len(data), size)]


# --- segments to index ----------------------------------------------------------------------------


def segment_bytes(base_offset: int, batches: int, records_per_batch: int = 4, value_size: int = 300, t0: int = 1_000) -> bytes:
    out = bytearray()
    offset = base_offset
    for b in range(batches):
        records = [NewRecord(t0 + offset + i, b"k", bytes([b % 251]) * value_size) for i in range(records_per_batch)]
        out += build_batch(records, base_offset=offset)
        offset += records_per_batch
    return bytes(out)


def entries_of(data: bytes, chunk_bytes: int, segment_id: uuid.UUID | None = None) -> list[ri.RemoteLogIndexEntry]:
    return ri.segment_entries(scan_batches(data).batches, segment_id=segment_id or uuid.uuid4(), key=KEY, chunk_bytes=chunk_bytes)


def test_entries_cover_whole_batches_cut_at_the_chunk_size():
    data = segment_bytes(100, 20)
    batches = scan_batches(data).batches
    entries = entries_of(data, chunk_bytes=4096)
    assert entries[0].first_offset == 100 and entries[-1].last_offset == batches[-1].last_offset
    assert sum(e.data_length for e in entries) == len(data)
    for a, b in zip(entries, entries[1:]):
        assert b.first_offset == a.last_offset + 1
        assert b.rdi.position == a.rdi.position + a.data_length
    assert all(e.data_length <= 4096 for e in entries)
    # A batch larger than the chunk size is an entry of its own.
    big = entries_of(segment_bytes(0, 3, value_size=5000), chunk_bytes=4096)
    assert len(big) == 3


def test_files_kts_writes_parse_with_a_separate_reader_of_the_seed_layout(tmp_path):
    sid = uuid.uuid4()
    data = segment_bytes(0, 30)
    entries = entries_of(data, chunk_bytes=2048, segment_id=sid)
    [fs] = ri.layout([entries])
    ri.write_file_sets(tmp_path, [fs])
    log_index = (tmp_path / f"{0:020d}.remoteLogIndex").read_bytes()
    parsed = seed_entries(log_index)
    assert [(p.first_offset, p.last_offset, p.data_length) for p in parsed] == \
        [(e.first_offset, e.last_offset, e.data_length) for e in entries]
    # The RDI (documented in the module): version 0, the segment id, the position, the key.
    assert all(p.rdi[0] == 0 and p.rdi[1:17] == sid.bytes and p.rdi[21:].decode() == KEY for p in parsed)
    assert [int.from_bytes(p.rdi[17:21], "big") for p in parsed] == [e.rdi.position for e in entries]
    # Each entry's bytes are exactly whole batches of the segment.
    for p in parsed:
        position = int.from_bytes(p.rdi[17:21], "big")
        chunk = scan_batches(data[position:position + p.data_length])
        assert chunk.invalid is None and chunk.batches[0].base_offset == p.first_offset
    offsets = seed_pairs((tmp_path / f"{0:020d}.remoteOffsetIndex").read_bytes(), ">ii")
    assert offsets == [(p.first_offset - 0, p.position) for p in parsed]
    times = seed_pairs((tmp_path / f"{0:020d}.remoteTimeIndex").read_bytes(), ">qi")
    assert [t for t, _ in times] == sorted({p.last_timestamp for p in parsed})
    assert {pos for _, pos in times} <= {p.position for p in parsed}


def test_a_lookup_by_time_finds_the_first_entry_that_can_hold_the_timestamp(tmp_path):
    entries = entries_of(segment_bytes(0, 30), chunk_bytes=2048)
    ri.write_file_sets(tmp_path, ri.layout([entries]))
    fs = ri.load_file_set(tmp_path, 0)
    for target in (0, 1_000, 1_050, 1_119, 10_000):
        i = ri.entry_for_timestamp(fs, target)
        holding = [k for k, (_p, e) in enumerate(fs.entries) if e.last_timestamp >= target]
        assert i == (holding[0] if holding else None)


def test_files_rotate_at_segment_borders_and_retention_rewrites_only_the_oldest_file(tmp_path):
    segments = [entries_of(segment_bytes(base, 10), chunk_bytes=2048) for base in range(0, 400, 40)]
    fresh = ri.layout(segments, rotate_bytes=600)
    assert len(fresh) > 2
    for fs in fresh:  # a file starts where a segment starts
        assert fs.base_offset in {s[0].first_offset for s in segments}
    ri.write_file_sets(tmp_path, fresh)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # The oldest segment is deleted by retention.
    kept = ri.layout(segments[1:], rotate_bytes=600, kept_boundaries=[fs.base_offset for fs in fresh],
                     kept_end_offset=fresh[-1].last_offset)
    written, removed = ri.write_file_sets(tmp_path, kept)
    assert removed == sorted(f"{0:020d}{s}" for s in ri.SUFFIXES)
    assert all(n.startswith(f"{kept[0].base_offset:020d}") for n in written)
    for fs in kept[1:]:
        for name, content in fs.files().items():
            assert before[name] == content


class _Md:
    """What the build reads of a finished segment's metadata."""

    def __init__(self, base):
        self.start_offset = base
        self.segment_id = type("Id", (), {"id": uuid.uuid4()})()
        self.data = segment_bytes(base, 10)  # offsets base .. base + 39
        self.end_offset = base + 39
        self.segment_size_in_bytes = len(self.data)


def test_an_incremental_build_reads_only_new_segments(tmp_path):
    segments = [_Md(base) for base in range(0, 200, 40)]
    reads = []

    def entries_for(md):
        reads.append(md.start_offset)
        return entries_of(md.data, 2048, md.segment_id.id)

    first = index_cache.build_partition_index(tmp_path, segments[:3], entries_for)
    assert first.new_segments == 3 and reads == [0, 40, 80]
    second = index_cache.build_partition_index(tmp_path, segments, entries_for)
    assert second.new_segments == 2 and reads[3:] == [120, 160]
    assert second.entries == sum(len(entries_of(md.data, 2048)) for md in segments)
    loaded = [ri.load_file_set(tmp_path, b) for b in ri.file_set_offsets(tmp_path)]
    assert [e.first_offset for e in ri.iter_entries(loaded)] == [e.first_offset for md in segments for e in entries_of(md.data, 2048)]


@pytest.mark.parametrize("cut", [lambda b: b"", lambda b: b[: len(b) // 2]], ids=["emptied", "cut-between-entries"])
def test_a_cached_segment_cut_short_is_read_again_not_indexed_short(tmp_path, cut):
    """A segment's cached entries cut short between entries still pass every entry's CRC: the
    build checks they cover the segment (the rule of the coverage check) and reads it again where
    they do not, rather than lay out an index with a hole."""
    segments = [_Md(base) for base in (0, 40)]
    reads = []

    def entries_for(md):
        reads.append(md.start_offset)
        return entries_of(md.data, 2048, md.segment_id.id)

    index_cache.build_partition_index(tmp_path, segments, entries_for)
    cached = tmp_path / index_cache.SEGMENTS_DIR / f"{segments[1].segment_id.id}{index_cache.ENTRIES_SUFFIX}"
    whole = cached.read_bytes()
    entries = ri.decode_entries(whole)
    assert len(entries) > 2
    short = cut(whole)
    if short:  # a whole number of entries, the rest gone
        short = whole[: entries[len(entries) // 2][0]]
    cached.write_bytes(short)
    again = index_cache.build_partition_index(tmp_path, segments, entries_for)
    assert reads == [0, 40, 40] and again.new_segments == 1
    assert again.entries == sum(len(entries_of(md.data, 2048)) for md in segments)
    assert cached.read_bytes() == whole


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-3], r"byte \d+: truncated remoteLogIndex entry"),
    (lambda b: b"\x00\x07" + b[2:], r"byte 0: remoteLogIndex entry magic is 7"),
    (lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:], r"byte 0: remoteLogIndex entry CRC is"),
    (lambda b: b[:2] + b"\x00\x05" + b[4:], r"byte 0: remoteLogIndex entry length 5"),
    (lambda b: b + b"\x00" * 5, r"truncated remoteLogIndex entry"),
])
def test_a_damaged_log_index_is_an_error_naming_file_and_position(tmp_path, damage, message):
    ri.write_file_sets(tmp_path, ri.layout([entries_of(segment_bytes(0, 12), 2048)]))
    path = tmp_path / f"{0:020d}.remoteLogIndex"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ri.RemoteIndexFormatError, match=message) as e:
        ri.load_file_set(tmp_path, 0)
    assert str(e.value).startswith(str(path))


def test_a_damaged_offset_or_time_index_is_an_error_naming_file_and_position(tmp_path):
    ri.write_file_sets(tmp_path, ri.layout([entries_of(segment_bytes(0, 12), 1024)]))
    offset_index = tmp_path / f"{0:020d}.remoteOffsetIndex"
    good = offset_index.read_bytes()
    offset_index.write_bytes(good[:-2])
    with pytest.raises(ri.RemoteIndexFormatError, match=r"remoteOffsetIndex: byte \d+: truncated remoteOffsetIndex entry"):
        ri.load_file_set(tmp_path, 0)
    offset_index.write_bytes(good[8:16] + good[:8] + good[16:])
    with pytest.raises(ri.RemoteIndexFormatError, match=r"byte 8: remoteOffsetIndex entry 1"):
        ri.load_file_set(tmp_path, 0)
    offset_index.write_bytes(good)
    time_index = tmp_path / f"{0:020d}.remoteTimeIndex"
    time_index.write_bytes(struct.pack(">qi", 5_000, 7))
    with pytest.raises(ri.RemoteIndexFormatError, match=r"byte 0: remoteTimeIndex entry 0 points at position 7"):
        ri.load_file_set(tmp_path, 0)
    (tmp_path / f"{0:020d}.remoteTimeIndex").unlink()
    with pytest.raises(ri.RemoteIndexFormatError, match="missing"):
        ri.load_file_set(tmp_path, 0)


def test_the_rdi_round_trips_and_rejects_other_versions():
    rdi = ri.RemoteDataId(uuid.uuid4(), 123456, KEY)
    assert ri.RemoteDataId.decode(rdi.encode()) == rdi
    with pytest.raises(ValueError, match="RDI version 1"):
        ri.RemoteDataId.decode(b"\x01" + rdi.encode()[1:])
    assert Path(KEY).suffix == ".log"
