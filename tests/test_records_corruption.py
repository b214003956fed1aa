"""Damaged segments are reported, never crash the reader.

Covers: a segment cut at every byte (the whole batches before the cut come back, the rest is
``invalid`` at the right position), every single-bit flip (detected by the CRC or the framing,
except in the base offset and leader epoch, which the CRC deliberately does not cover), random
multi-byte damage and garbage records sealed under a valid CRC (``decode_batch`` raises only
``CorruptRecordError``, never IndexError/struct.error/UnicodeDecodeError/zlib.error/...), a CRC
mismatch reported with the batch's byte position, and a zero-filled tail reported as invalid bytes.
"""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kts_resources.kafka.errors import CorruptRecordError, FileChangedError, KafkaFormatError
from kts_resources.kafka.records import (
    NewRecord,
    SegmentScan,
    build_batch,
    build_control_batch,
    decode_batch,
    scan_batches,
)
from kts_resources.kafka.segment import scan_segment_file

T0 = 1_700_000_000_000
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)


def legacy(magic: int, codec: int, messages: list[tuple], first_offset: int) -> bytes:
    """Messages as kafka-python writes them; a compressed wrapper's magic-1 inner offsets are relative."""
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (timestamp, key, value) in enumerate(messages):
        builder.append(i if codec and magic == 1 else first_offset + i, timestamp, key, value)
    data = bytearray(builder.build())
    if codec:
        struct.pack_into(">q", data, 0, first_offset + len(messages) - 1)  # the wrapper carries the last offset
    return bytes(data)


def _segment_parts() -> list[bytes]:
    return [
        build_batch([NewRecord(T0, b"k0", b"v0", (("h", None), ("ü", b"x"))), NewRecord(T0 + 1, None, b"v1")], base_offset=0, partition_leader_epoch=1),
        build_batch([NewRecord(T0 + 2, b"k2", b"lz4 " * 12), NewRecord(T0 + 3, b"k3", None)], base_offset=2, codec=LZ4, partition_leader_epoch=1),
        legacy(1, GZIP, [(T0 + 4, b"old", b"gzip wrapper " * 3), (T0 + 5, None, b"x")], first_offset=4),
        legacy(0, NONE, [(None, b"v0-key", b"v0-value")], first_offset=6),
        build_batch([NewRecord(T0 + 7, b"k7", b"zstd " * 10)], base_offset=7, codec=ZSTD, partition_leader_epoch=2, producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True),
        build_control_batch(base_offset=8, commit=True, producer_id=9, producer_epoch=0, coordinator_epoch=3, timestamp=T0 + 8, partition_leader_epoch=2),
        build_batch([NewRecord(T0 + 9, b"k9", b"snappy " * 10)], base_offset=9, codec=SNAPPY, partition_leader_epoch=2),
        build_batch([NewRecord(T0 + 10, b"k10", b"gzip " * 10)], base_offset=10, codec=GZIP, partition_leader_epoch=2),
    ]


PARTS = _segment_parts()
SEGMENT = b"".join(PARTS)
BOUNDARIES = [sum(len(p) for p in PARTS[:i]) for i in range(len(PARTS) + 1)]  # batch starts, then the end
CLEAN = scan_batches(SEGMENT)


def test_the_test_segment_is_whole_and_valid():
    assert CLEAN.invalid is None and not CLEAN.crc_failures
    assert [b.position for b in CLEAN.batches] == BOUNDARIES[:-1]
    assert [b.magic for b in CLEAN.batches] == [2, 2, 1, 0, 2, 2, 2, 2]
    assert [r.offset for b in CLEAN.batches for r in decode_batch(SEGMENT, b)] == list(range(11))


def decode_or_corrupt(data: bytes, scan: SegmentScan, *, verify_crc: bool) -> None:
    """Decode every batch; the only failure allowed is CorruptRecordError located at the batch."""
    for header in scan.batches:
        try:
            decode_batch(data, header, verify_crc=verify_crc)
        except CorruptRecordError as e:
            assert isinstance(e, KafkaFormatError)
            assert e.position == header.position


# --- truncation ---------------------------------------------------------------------------------


def test_a_segment_cut_at_every_byte_keeps_the_whole_batches_and_reports_the_rest_as_invalid():
    for cut in range(len(SEGMENT) + 1):
        data = SEGMENT[:cut]
        scan = scan_batches(data)
        whole = max(i for i, start in enumerate(BOUNDARIES) if start <= cut)
        assert scan.batches == CLEAN.batches[:whole], cut
        assert scan.valid_bytes == BOUNDARIES[whole], cut
        if cut == BOUNDARIES[whole]:
            assert scan.invalid is None, cut
        else:
            assert (scan.invalid.position, scan.invalid.length) == (BOUNDARIES[whole], cut - BOUNDARIES[whole]), cut
            assert scan.invalid.reason.startswith("partial"), (cut, scan.invalid.reason)
        decode_or_corrupt(data, scan, verify_crc=True)
        assert all(decode_batch(data, b) for b in scan.batches)


def test_a_zero_filled_tail_is_reported_as_invalid_bytes():
    # Preallocated or crash-zeroed space after the last batch: never a batch, always "invalid".
    for zeros in (1, 12, 16, 17, 61, 4096):
        scan = scan_batches(SEGMENT + bytes(zeros))
        assert scan.batches == CLEAN.batches
        assert scan.valid_bytes == len(SEGMENT)
        assert (scan.invalid.position, scan.invalid.length) == (len(SEGMENT), zeros)


def test_an_unknown_magic_stops_the_scan_there():
    bad = bytearray(PARTS[1])
    bad[16] = 7
    scan = scan_batches(PARTS[0] + bytes(bad) + PARTS[2])
    assert len(scan.batches) == 1
    assert (scan.invalid.position, scan.invalid.length) == (len(PARTS[0]), len(bad) + len(PARTS[2]))
    assert "magic 7" in scan.invalid.reason


@pytest.mark.parametrize("batch_length", [-1, 0, 48, -(2**31)])
def test_a_batch_length_below_the_header_size_is_invalid(batch_length):
    bad = bytearray(PARTS[1])
    struct.pack_into(">i", bad, 8, batch_length)
    scan = scan_batches(PARTS[0] + bytes(bad))
    assert len(scan.batches) == 1
    assert scan.invalid.position == len(PARTS[0])


# --- bit flips ----------------------------------------------------------------------------------


def _unprotected_bytes() -> set[int]:
    """Bytes a broker rewrites without re-checksumming: base offset (all formats), leader epoch (v2)."""
    out = set()
    for header in CLEAN.batches:
        out.update(range(header.position, header.position + 8))
        if header.magic == 2:
            out.update(range(header.position + 12, header.position + 16))
    return out


UNPROTECTED = _unprotected_bytes()


def test_every_single_bit_flip_outside_offset_and_epoch_is_detected():
    for byte in range(len(SEGMENT)):
        if byte in UNPROTECTED:
            continue
        for bit in range(8):
            data = bytearray(SEGMENT)
            data[byte] ^= 1 << bit
            data = bytes(data)
            scan = scan_batches(data)
            assert scan.invalid is not None or scan.crc_failures, (byte, bit)
            decode_or_corrupt(data, scan, verify_crc=True)
            decode_or_corrupt(data, scan, verify_crc=False)
            for header in scan.batches:
                if header.crc_ok:
                    decode_batch(data, header)  # a batch that passes its CRC decodes


def test_base_offset_and_leader_epoch_are_outside_the_crc():
    # Kafka leaves them out so a broker can assign them on append: a flip there passes the CRC.
    for byte in sorted(UNPROTECTED):
        data = bytearray(SEGMENT)
        data[byte] ^= 0x01
        scan = scan_batches(bytes(data))
        assert scan.invalid is None and not scan.crc_failures, byte
        assert len(scan.batches) == len(CLEAN.batches)
        changed = [(a.base_offset, a.partition_leader_epoch) != (b.base_offset, b.partition_leader_epoch) for a, b in zip(scan.batches, CLEAN.batches)]
        assert changed.count(True) == 1, byte


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEGMENT) - 1), st.integers(1, 255)), min_size=1, max_size=8))
def test_random_damage_never_crashes_the_scan_or_the_decoder(damage):
    data = bytearray(SEGMENT)
    for position, mask in damage:
        data[position] ^= mask
    data = bytes(data)
    scan = scan_batches(data)
    changed = {i for i, (a, b) in enumerate(zip(data, SEGMENT)) if a != b}
    if changed - UNPROTECTED:  # two flips of one bit cancel out, so look at what really changed
        assert scan.invalid is not None or scan.crc_failures
    decode_or_corrupt(data, scan, verify_crc=True)
    decode_or_corrupt(data, scan, verify_crc=False)


# --- damage the CRC does not catch: garbage sealed under a valid checksum ------------------------


def reseal(data: bytearray, position: int, size: int) -> None:
    """Recompute the checksum of the batch at ``position`` so the decoder, not the CRC, meets the damage."""
    magic = data[position + 16]
    if magic == 2:
        struct.pack_into(">I", data, position + 17, crc32c(bytes(data[position + 21 : position + size])))
    else:
        struct.pack_into(">I", data, position + 12, zlib.crc32(bytes(data[position + 16 : position + size])))


def test_seeded_random_flips_under_a_valid_crc_raise_only_corrupt_record_error():
    rng = random.Random(20240611)
    outcomes = {"decoded": 0, "corrupt": 0}
    for _ in range(600):
        index = rng.randrange(len(PARTS))
        header = CLEAN.batches[index]
        first_body_byte = 21 if header.magic == 2 else 17  # attributes to the end: all that the CRC covers
        data = bytearray(SEGMENT)
        for _ in range(rng.randint(1, 4)):
            data[header.position + rng.randrange(first_body_byte, header.size)] ^= 1 << rng.randrange(8)
        reseal(data, header.position, header.size)
        data = bytes(data)
        scan = scan_batches(data)
        assert scan.invalid is None and len(scan.batches) == len(CLEAN.batches)
        damaged = scan.batches[index]
        try:
            decode_batch(data, damaged)
            outcomes["decoded"] += 1
        except CorruptRecordError as e:
            assert e.position == damaged.position
            outcomes["corrupt"] += 1
    assert outcomes["corrupt"] > 0  # the decoder's own checks do fire


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=120),
    codec=st.integers(0, 7),
    record_count=st.integers(-2, 2**31 - 1) | st.integers(0, 4),
    attributes_extra=st.sampled_from([0, 0x08, 0x10, 0x20]),
)
def test_garbage_records_under_a_valid_crc_raise_only_corrupt_record_error(body, codec, record_count, attributes_extra):
    after_crc = struct.pack(">hiqqqhii", codec | attributes_extra, 0, T0, T0, -1, -1, -1, record_count) + body
    batch = struct.pack(">qiibI", 0, 9 + len(after_crc), 0, 2, crc32c(after_crc)) + after_crc
    scan = scan_batches(batch)
    assert scan.invalid is None and scan.batches[0].crc_ok is True
    decode_or_corrupt(batch, scan, verify_crc=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_scan(data):
    scan = scan_batches(data)
    assert scan.valid_bytes + (scan.invalid.length if scan.invalid else 0) == len(data)
    decode_or_corrupt(data, scan, verify_crc=False)


# --- how a CRC failure is reported --------------------------------------------------------------


def test_a_crc_mismatch_names_the_batch_position():
    target = CLEAN.batches[4]  # a zstd batch in the middle of the segment
    data = bytearray(SEGMENT)
    data[target.position + target.size - 1] ^= 0x40
    data = bytes(data)
    scan = scan_batches(data)
    assert [b.position for b in scan.crc_failures] == [target.position]
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(data, scan.batches[4])
    assert info.value.position == target.position
    assert f"byte {target.position}" in str(info.value)
    assert "CRC" in str(info.value)


def test_a_legacy_crc_mismatch_names_the_message_position():
    target = CLEAN.batches[3]  # the magic-0 message
    data = bytearray(SEGMENT)
    data[target.position + target.size - 1] ^= 0x01
    data = bytes(data)
    scan = scan_batches(data)
    assert [b.position for b in scan.crc_failures] == [target.position]
    with pytest.raises(CorruptRecordError, match=f"byte {target.position}"):
        decode_batch(data, scan.batches[3])


# --- the same scan read from a file in chunks (kts_resources.kafka.segment.scan_segment_file) ----


def _scan_key(scan: SegmentScan) -> tuple:
    return [(b.position, b.base_offset, b.last_offset, b.crc_ok) for b in scan.batches], scan.valid_bytes, scan.invalid


# The test segment with some bytes flipped, cut anywhere and garbage after, read in chunks of every size.
damaged_segments_in_chunks = given(
    damage=st.lists(st.tuples(st.integers(0, len(SEGMENT) - 1), st.integers(1, 255)), max_size=4),
    cut=st.integers(0, len(SEGMENT)), tail=st.binary(max_size=80), chunk=st.sampled_from([1, 5, 17, 61, 64, 200, 1 << 20]))


def _damaged_file(tmp_path, damage, cut, tail):
    """(path, bytes) of the test segment with ``damage`` (position, xor mask) applied, cut at ``cut``, ``tail`` after."""
    data = bytearray(SEGMENT)
    for position, mask in damage:
        data[position] ^= mask
    data = bytes(data[:cut]) + tail
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    return path, data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@damaged_segments_in_chunks
def test_a_file_scanned_in_chunks_gives_the_scan_of_its_whole_bytes(tmp_path, damage, cut, tail, chunk):
    path, data = _damaged_file(tmp_path, damage, cut, tail)
    size, scan = scan_segment_file(path, chunk_bytes=chunk)
    assert size == len(data)
    assert _scan_key(scan) == _scan_key(scan_batches(data))


def test_a_length_claiming_more_than_the_file_is_reported_without_reading_it(tmp_path):
    # Garbage that looks like a magic-2 header claiming a GiB, far past the file's end.
    bogus = bytearray(SEGMENT[: BOUNDARIES[1]])
    struct.pack_into(">i", bogus, 8, 1 << 30)
    data = SEGMENT + bytes(bogus) + b"\0" * 4096
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    _, scan = scan_segment_file(path, chunk_bytes=512)
    assert _scan_key(scan) == _scan_key(scan_batches(data))
    assert scan.invalid.position == len(SEGMENT) and scan.invalid.length == len(data) - len(SEGMENT)


def test_a_file_truncated_while_it_is_scanned_is_one_clear_error_not_a_signal(tmp_path, monkeypatch):
    import os

    from kts_resources.kafka import segment as segment_module

    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(SEGMENT)
    real_preadv = os.preadv
    calls = []

    def preadv_then_truncate(fd, buffers, offset):
        calls.append(offset)
        got = real_preadv(fd, buffers, offset)
        if len(calls) == 1:
            os.truncate(path, BOUNDARIES[2])  # the broker truncates its log after the first read
        return got

    monkeypatch.setattr(segment_module.os, "preadv", preadv_then_truncate)
    with pytest.raises(FileChangedError, match=rf"{path.name}: byte \d+: .*truncated underneath"):
        scan_segment_file(path, chunk_bytes=100)


# --- the inventory's tally (summarize_segment): the summary of the listed scan, always ------------


def _listed_summary(path, data: bytes):
    """The summary of the listed scan's batches, added one header at a time: the oracle."""
    from kts_resources.kafka.records import BatchTally
    from kts_resources.kafka.segment import summarize_tally

    scan = scan_batches(data)
    tally = BatchTally()
    for batch in scan.batches:
        tally.add(batch, batch.position)
    return summarize_tally(str(path), 0, False, len(data), tally, scan.invalid)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@damaged_segments_in_chunks
def test_a_tallied_segment_summary_is_the_summary_of_its_listed_batches(tmp_path, damage, cut, tail, chunk):
    """Mixed magic 0/1/2 batches, bits flipped (CRC failures, broken framing), cut anywhere, garbage
    after, read in chunks of every size: the tally's summary is the listed scan's, field for field."""
    from kts_resources.kafka.segment import summarize_segment

    path, data = _damaged_file(tmp_path, damage, cut, tail)
    assert summarize_segment(path, 0, active=False, chunk_bytes=chunk) == _listed_summary(path, data)


def test_a_tally_of_segments_other_writers_wrote_matches_their_listed_scan(third_party_dir):
    """A real Kafka 3.7.1 broker's segments and two other implementations' files."""
    from kts_resources.kafka.segment import summarize_segment

    real_broker = third_party_dir.parent / "real_broker"
    paths = sorted(third_party_dir.glob("*.log")) + sorted(real_broker.rglob("*.log"))
    assert len(paths) > 2
    batches = 0
    for path in paths:
        data = path.read_bytes()
        listed = _listed_summary(path, data)
        assert summarize_segment(path, 0, active=False, chunk_bytes=64) == listed, path
        assert summarize_segment(path, 0, active=False) == listed, path
        batches += listed.batch_count
    assert batches > 0


def test_a_tally_counts_crc_failures_and_goes_on_like_the_listed_scan(tmp_path):
    from kts_resources.kafka.segment import summarize_segment

    data = bytearray(SEGMENT)
    data[BOUNDARIES[1] + 30] ^= 0xFF  # inside the second batch's CRC-covered bytes (v2, lz4)
    data[BOUNDARIES[-2] + 40] ^= 0x01  # and the last batch's
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    summary = summarize_segment(path, 0, active=False, chunk_bytes=100)
    assert summary.crc_failures == (BOUNDARIES[1], BOUNDARIES[-2]) and summary.health == "corrupt"
    assert summary.batch_count == len(BOUNDARIES) - 1 and summary.last_offset == 10
    assert summary == _listed_summary(path, bytes(data))
