"""``verify_segment``, the copy's one-pass check, agrees with the header scan on every segment;
``verify_segment_file``, the same check of a file read in windows, gives the very same verdict.

The header scan (``scan_batches``) is the reference: it is tested against kafka-python and against
truncation and damage at every byte (test_records_corruption.py). The copy uses a leaner loop for
speed, so it must find the same first problem at the same byte, and on a clean segment the same
offsets, timestamps and leader epochs, plus the whole file's CRC-32C.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.reading import remote_index as ri
from kts_resources.kafka.errors import FileChangedError
from kts_resources.kafka.records import SegmentVerification, scan_batches, verify_segment
from kts_resources.kafka.segment import verify_segment_file

from .conftest import shared_dir
from .test_records_corruption import BOUNDARIES, PARTS, SEGMENT


def first_problem_position(data: bytes) -> int | None:
    """Where the reference scan sees the first batch failing its CRC, or else the first invalid bytes."""
    scan = scan_batches(data)
    if scan.crc_failures:
        return scan.crc_failures[0].position
    return scan.invalid.position if scan.invalid is not None else None


_FILE = os.path.join(tempfile.mkdtemp(prefix="kts-verify-"), "00000000000000000000.log")


def verified_as_a_file(data: bytes, chunk_bytes: int | None = None) -> SegmentVerification:
    """``verify_segment_file`` of ``data`` written to a file, read in windows that cut batches
    (and headers) everywhere and in one read; every answer must be the same."""
    with open(_FILE, "wb") as f:
        f.write(data)
    found = [verify_segment_file(_FILE, chunk_bytes=chunk_bytes, read_bytes=n) for n in (29, 1 << 20)]
    assert all(f == found[0] for f in found[1:]), found
    return found[0]


def assert_agrees_with_the_scan(data: bytes) -> SegmentVerification:
    found = verify_segment(data)
    assert verified_as_a_file(data) == found
    assert found.size == len(data) and found.crc32c == crc32c(data)
    expected = first_problem_position(data)
    assert (found.problem[0] if found.problem else None) == expected
    if expected is None:
        scan = scan_batches(data)
        assert found.batches == len(scan.batches)
        assert found.last_offset == (scan.batches[-1].last_offset if scan.batches else None)
        assert found.last_position == (scan.batches[-1].position if scan.batches else None)
        assert found.max_timestamp == max((b.max_timestamp for b in scan.batches), default=-1)
        first_by_epoch: dict[int, int] = {}
        for b in scan.batches:
            if b.magic == 2 and b.partition_leader_epoch >= 0:
                first_by_epoch.setdefault(b.partition_leader_epoch, b.base_offset)
        assert found.epochs == first_by_epoch
    return found


def test_a_clean_segment_of_every_format_gives_its_offsets_timestamps_epochs_and_checksum():
    found = assert_agrees_with_the_scan(SEGMENT)
    assert found.problem is None and found.batches == len(PARTS)
    assert found.last_offset == 10 and found.epochs == {1: 0, 2: 7}


def test_an_empty_segment_has_no_batches_and_no_problem():
    found = assert_agrees_with_the_scan(b"")
    assert (found.batches, found.last_offset, found.problem) == (0, None, None)


def test_a_segment_cut_at_every_byte_is_a_problem_at_the_first_partial_batch():
    for cut in range(len(SEGMENT) + 1):
        found = assert_agrees_with_the_scan(SEGMENT[:cut])
        if cut not in BOUNDARIES:
            assert "partial" in found.problem[1], cut


def test_a_zero_filled_tail_is_a_problem_where_the_zeros_start():
    for zeros in (1, 16, 61, 4096):
        found = assert_agrees_with_the_scan(SEGMENT + bytes(zeros))
        assert found.problem[0] == len(SEGMENT)


def test_every_single_bit_flip_is_found_where_the_scan_finds_it():
    for byte in range(len(SEGMENT)):
        for bit in range(8):
            data = bytearray(SEGMENT)
            data[byte] ^= 1 << bit
            assert_agrees_with_the_scan(bytes(data))


def test_a_crc_failure_names_its_batch():
    data = bytearray(SEGMENT)
    data[BOUNDARIES[1] + 40] ^= 0xFF  # inside the second batch's CRC-covered header
    found = assert_agrees_with_the_scan(bytes(data))
    assert found.problem == (BOUNDARIES[1], "batch fails its CRC")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEGMENT) - 1), st.integers(1, 255)), min_size=1, max_size=8),
       st.integers(0, len(SEGMENT)))
def test_random_damage_and_cuts_agree_with_the_scan(damage, cut):
    data = bytearray(SEGMENT)
    for position, mask in damage:
        data[position] ^= mask
    assert_agrees_with_the_scan(bytes(data[:cut]))


# --- the remote log index's chunks, from the same pass (the copy hands them to the index cache) ---


def _index_chunks(data: bytes, chunk_bytes: int) -> list[tuple]:
    """The reference: remote_index.segment_entries over the header scan's batches."""
    entries = ri.segment_entries(scan_batches(data).batches, segment_id=uuid.UUID(int=1), key="k", chunk_bytes=chunk_bytes)
    return [(e.first_offset, e.last_offset, e.first_timestamp, e.last_timestamp, e.rdi.position, e.data_length) for e in entries]


MAGIC_2_ONLY = b"".join(p for p in PARTS if p[16] == 2)


@pytest.mark.parametrize("chunk_bytes", [1, 100, 1000, 4096, 64 * 1024, 1 << 20])
def test_the_chunks_are_the_remote_log_index_entries_of_kafka_python_and_real_broker_segments(chunk_bytes):
    segments = [MAGIC_2_ONLY] + [p.read_bytes() for p in sorted((shared_dir() / "fixtures" / "real_broker").rglob("*.log"))]
    assert any(len(s) > 4096 for s in segments)
    for data in segments:
        assert verify_segment(data, chunk_bytes=chunk_bytes).chunks == _index_chunks(data, chunk_bytes)
        assert verified_as_a_file(data, chunk_bytes).chunks == _index_chunks(data, chunk_bytes)


def test_no_chunks_unless_asked_for_or_when_the_segment_is_not_all_whole_magic_2_batches():
    assert verify_segment(MAGIC_2_ONLY).chunks is None
    assert verify_segment(b"", chunk_bytes=4096).chunks == []
    assert verify_segment(SEGMENT, chunk_bytes=4096).chunks is None  # magic 0/1 inside: the index reads it
    assert verify_segment(MAGIC_2_ONLY[:-1], chunk_bytes=4096).chunks is None  # a partial batch
    damaged = bytearray(MAGIC_2_ONLY)
    damaged[-5] ^= 0xFF
    assert verify_segment(bytes(damaged), chunk_bytes=4096).chunks is None  # a CRC failure
    for data in (b"", SEGMENT, MAGIC_2_ONLY[:-1], bytes(damaged)):
        assert verified_as_a_file(data, 4096).chunks == verify_segment(data, chunk_bytes=4096).chunks


def test_a_file_truncated_while_it_is_verified_is_one_error_naming_it_and_both_sizes(tmp_path, monkeypatch):
    """The broker truncates the segment between the verification's reads: never a crash (SIGBUS)."""
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(MAGIC_2_ONLY)
    real_preadv = os.preadv
    reads = []

    def truncating_after_the_first_read(fd, buffers, offset, *rest):
        if reads:
            os.truncate(path, 100)
        reads.append(offset)
        return real_preadv(fd, buffers, offset, *rest)

    monkeypatch.setattr(os, "preadv", truncating_after_the_first_read)
    with pytest.raises(FileChangedError) as e:
        verify_segment_file(path, read_bytes=200)
    assert str(e.value) == f"{path}: truncated while it was verified: {len(MAGIC_2_ONLY)} bytes expected, 100 found"
