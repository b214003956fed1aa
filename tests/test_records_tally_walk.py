"""The inventory's batch walk in C (``_batch_tally``) and in Python give the same results.

``tally_batches`` walks whole magic-2 batches with ``records.walk_v2_batches``: the C extension
where the install built it, else ``walk_v2_batches_python``. Both are run here over the same bytes —
kafka-python-written segments, a real broker's segments (shared fixtures/real_broker), batches
failing their CRC, tails cut at every byte, legacy messages among magic-2 batches, and random
damage — and must agree exactly, as must the tallies and scans ``tally_batches`` builds from each.
"""

from __future__ import annotations

import os
import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.kafka import records
from kts_resources.kafka.records import BatchTally, NewRecord, build_batch, tally_batches, walk_v2_batches_python

from .conftest import shared_dir
from .test_records_corruption import BOUNDARIES, PARTS, SEGMENT
from .test_records_crosscheck import T0, kp_build

_batch_tally = pytest.importorskip("kts_resources.kafka._batch_tally", reason="the C extension was not built")
walk_v2_batches_c = _batch_tally.walk_v2_batches


def kafka_python_segment() -> bytes:
    """Batches kafka-python's producer writes (uncompressed and gzip), placed as a broker would:
    contiguous offsets, the leader epoch changing and changing back, a -1 epoch (pre-0.11 upgrade)."""
    batches, offset = [], 0
    for i, (codec, epoch) in enumerate([(0, 0), (1, 0), (0, 3), (0, -1), (1, 3), (0, 5), (0, 3)]):
        rows = [(T0 + 7 * i - j, f"key-{i}-{j}".encode(), b"value " * (10 + j), []) for j in range(1 + i % 4)]
        batches.append(kp_build(rows, codec, base_offset=offset, leader_epoch=epoch))
        offset += len(rows)
    return b"".join(batches)


def real_broker_segments() -> list[bytes]:
    return [p.read_bytes() for p in sorted((shared_dir() / "fixtures" / "real_broker").rglob("*.log"))]


def with_crc_broken(data: bytes, position: int) -> bytes:
    """The batch at ``position`` with its stored CRC-32C off by one bit: its body still reads."""
    damaged = bytearray(data)
    damaged[position + 17] ^= 0x01
    return bytes(damaged)


def batch_starts(data: bytes) -> list[int]:
    return [b.position for b in records.scan_batches(data, verify_crc=False).batches]


def assert_walks_agree(data: bytes) -> tuple:
    found = walk_v2_batches_c(data)
    assert found == walk_v2_batches_python(data)
    # Any buffer, not only bytes: the file windows hand the walk memoryviews of a bytearray.
    assert walk_v2_batches_c(memoryview(bytearray(data))) == found
    return found


def tallied(data: bytes, walk, *, base: int = 0, before: bytes | None = None) -> tuple[BatchTally, records.SegmentScan]:
    """``tally_batches`` with ``walk`` as its magic-2 walk (after tallying ``before`` into the same
    tally, as consecutive file windows do)."""
    saved = records.walk_v2_batches
    records.walk_v2_batches = walk
    try:
        tally = BatchTally()
        if before is not None:
            tally_batches(before, tally)
        scan = tally_batches(data, tally, base=base)
    finally:
        records.walk_v2_batches = saved
    return tally, scan


def assert_tallies_agree(data: bytes, *, base: int = 0, before: bytes | None = None) -> BatchTally:
    tally_c, scan_c = tallied(data, walk_v2_batches_c, base=base, before=before)
    tally_py, scan_py = tallied(data, walk_v2_batches_python, base=base, before=before)
    assert tally_c == tally_py
    assert (scan_c.valid_bytes, scan_c.invalid, scan_c.batches) == (scan_py.valid_bytes, scan_py.invalid, scan_py.batches)
    return tally_c


def test_this_install_built_the_extension_and_tally_batches_uses_it():
    # `make setup` (.ci/setup) installs a compiler, so CI runs the C walk and the fallback is tested here.
    assert records.walk_v2_batches is walk_v2_batches_c


@pytest.mark.parametrize("routine", ["crc32c", "crc32c_table"])
def test_the_extensions_crc32c_is_the_castagnoli_checksum_at_every_length_and_alignment(routine):
    checksum = getattr(_batch_tally, routine)
    data = os.urandom(2000)
    # Every alignment of the 8-byte steps, and every length around the SSE4.2 routine's three
    # 256-byte lanes (768 bytes a round) and two rounds of them.
    lengths = [*range(140), *range(760, 780), *range(1530, 1550)]
    for start in range(9):
        for length in lengths:
            assert checksum(data[start : start + length]) == crc32c(data[start : start + length]), (start, length)
    big = os.urandom(1 << 20)
    assert checksum(big) == crc32c(big)


@pytest.mark.parametrize("routine", ["crc32c", "crc32c_table"])
def test_the_extensions_crc32c_goes_on_from_a_value_as_the_librarys_does(routine):
    # kafka/crc.py hands it to every checksum kts computes, streamed ones (a segment's chunks, an
    # upload's parts) included, and bytes, bytearrays and memoryviews alike.
    checksum = getattr(_batch_tally, routine)
    data = os.urandom(300_000)  # over the size summed without the GIL
    for cut in (0, 1, 767, 70_000, len(data)):
        assert checksum(data[cut:], checksum(data[:cut])) == crc32c(data), cut
        assert checksum(memoryview(data)[cut:], crc32c(bytearray(data[:cut]))) == crc32c(data), cut
    assert checksum(b"", 0x1234) == crc32c(b"", 0x1234)
    with pytest.raises(TypeError):
        checksum("text")


def test_kts_checksums_use_the_extensions_crc32c_when_it_is_built():
    from kts_resources.kafka import crc

    assert crc.crc32c is _batch_tally.crc32c


def test_kafka_python_segments_walk_the_same_and_tally_every_batch():
    segment = kafka_python_segment()
    end, count, record_count, max_ts, epoch_changes, failures, last = assert_walks_agree(segment)
    assert (end, count, failures, last) == (len(segment), 7, [], batch_starts(segment)[-1])
    assert epoch_changes == [0, 3, 3, 5, 3]  # the -1 between the 3s is a change, not listed
    tally = assert_tallies_agree(segment)
    assert tally.leader_epochs == {0, 3, 5}
    assert tally.record_count == record_count == sum(1 + i % 4 for i in range(7))
    assert tally.max_timestamp == max_ts == T0 + 42


def test_real_broker_segments_walk_the_same():
    segments = real_broker_segments()
    assert any(segments), "shared fixtures/real_broker has no non-empty segment"
    for data in segments:
        assert assert_walks_agree(data)[0] == len(data)
        assert_tallies_agree(data)


def test_batches_failing_their_crc_are_listed_by_position_and_the_walk_goes_on():
    segment = kafka_python_segment()
    starts = batch_starts(segment)
    damaged = with_crc_broken(with_crc_broken(segment, starts[1]), starts[4])
    _, count, _, _, _, failures, _ = assert_walks_agree(damaged)
    assert (count, failures) == (7, [starts[1], starts[4]])
    # A body byte rather than the stored CRC: the same verdict.
    body_damaged = bytearray(segment)
    body_damaged[starts[2] + 70] ^= 0x40
    assert assert_walks_agree(bytes(body_damaged))[5] == [starts[2]]
    tally = assert_tallies_agree(damaged, base=1000)
    assert tally.crc_failures == [1000 + starts[1], 1000 + starts[4]]


def test_a_tail_cut_at_every_byte_stops_both_walks_at_the_last_whole_batch():
    segment = kafka_python_segment()
    starts = batch_starts(segment) + [len(segment)]
    for cut in range(len(segment) + 1):
        end = assert_walks_agree(segment[:cut])[0]
        assert end == max(s for s in starts if s <= cut)
        assert_tallies_agree(segment[:cut])


def test_legacy_messages_among_magic_2_batches_stop_the_walk_and_go_through_the_scan():
    # PARTS: two magic-2 batches, a magic-1 gzip wrapper, a magic-0 message, four magic-2 batches.
    assert assert_walks_agree(SEGMENT)[:2] == (BOUNDARIES[2], 2)
    assert assert_walks_agree(SEGMENT[BOUNDARIES[4]:])[:2] == (len(SEGMENT) - BOUNDARIES[4], 4)
    for cut in range(len(SEGMENT) + 1):
        assert_walks_agree(SEGMENT[:cut])
        assert_tallies_agree(SEGMENT[:cut])
    tally = assert_tallies_agree(SEGMENT, before=PARTS[0], base=len(PARTS[0]))
    assert tally.batch_count == 1 + len(PARTS)


@pytest.mark.parametrize("batch_length", [-1, 0, 48, 2**31 - 1])
def test_a_batch_length_no_batch_can_have_stops_both_walks(batch_length):
    segment = kafka_python_segment()
    second = batch_starts(segment)[1]
    bad = bytearray(segment)
    struct.pack_into(">i", bad, second + 8, batch_length)
    assert assert_walks_agree(bytes(bad))[:2] == (second, 1)
    assert_tallies_agree(bytes(bad))


@st.composite
def damaged_segments(draw):
    batches, offset = [], 0
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 4))
        rows = [NewRecord(draw(st.integers(-1, 2**45)), None, draw(st.binary(max_size=40))) for _ in range(n)]
        batches.append(build_batch(rows, base_offset=offset, partition_leader_epoch=draw(st.integers(-1, 3)),
                                   codec=draw(st.sampled_from([0, 1]))))
        offset += n
    data = bytearray(b"".join(batches))
    for _ in range(draw(st.integers(0, 3))):  # flips anywhere: CRCs, lengths, magics, epochs
        position = draw(st.integers(0, len(data) - 1))
        data[position] ^= draw(st.integers(1, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) + draw(st.binary(max_size=80))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_segments(), st.integers(0, 2**40))
def test_any_damage_gives_the_same_walk_and_tally_in_c_and_python(data, base):
    assert_walks_agree(data)
    assert_tallies_agree(data, base=base)


def test_the_walk_takes_only_a_buffer():
    with pytest.raises(TypeError):
        walk_v2_batches_c("not bytes")
