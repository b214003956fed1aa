"""Magic-2 record batches round-trip through kts's own writer and reader.

Covers: zigzag varints/varlongs (known encodings, int32/int64 extremes, the 5- and 10-byte limits,
values kept inside the type's range as Kafka's reader keeps them), single records written by
``encode_record`` and read back by ``decode_batch``, whole batches with random records, headers,
codecs and flags through ``build_batch`` → ``scan_batches`` → ``decode_batch``, control batches
(transaction markers), and the JSON field names the CLI contract relies on.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kts_resources.kafka.errors import CorruptRecordError, KafkaFormatError
from kts_resources.kafka.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CREATE_TIME,
    LOG_APPEND_TIME,
    BatchHeader,
    NewRecord,
    Record,
    build_batch,
    build_control_batch,
    decode_batch,
    decode_varint,
    encode_record,
    encode_varint,
    parse_control_record,
    read_records,
    read_v2_header,
    scan_batches,
    verified_batch_positions,
    with_base_offset_and_epoch,
)

# Kafka's codec ids (attributes bits 0-2).
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ---------------------------------------------------------------------------------

optional_bytes = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=4).map(tuple)
timestamps = st.integers(-1, 2**42)
new_records = st.builds(
    NewRecord,
    timestamp=timestamps,
    key=optional_bytes,
    # Repetitive values as well as random ones, so the codecs have something to compress.
    value=st.none() | st.binary(max_size=200) | st.binary(min_size=1, max_size=8).map(lambda b: b * 50),
    headers=headers,
)
producer_states = st.none() | st.tuples(
    st.integers(0, INT64_MAX),  # producer id
    st.integers(0, 2**15 - 1),  # producer epoch
    st.integers(0, INT32_MAX),  # base sequence
    st.booleans(),  # transactional
)


def frame_v2(body: bytes, *, count: int, base_offset: int, last_offset_delta: int, base_timestamp: int, max_timestamp: int) -> bytes:
    """An uncompressed magic-2 batch around already-encoded records, framed by hand (not build_batch)."""
    after_crc = struct.pack(">hiqqqhii", 0, last_offset_delta, base_timestamp, max_timestamp, -1, -1, -1, count) + body
    # batchLength counts partitionLeaderEpoch (4) + magic (1) + crc (4) + everything after the CRC.
    return struct.pack(">qiibI", base_offset, 9 + len(after_crc), -1, 2, crc32c(after_crc)) + after_crc


def only_batch(data: bytes) -> BatchHeader:
    scan = scan_batches(data)
    assert scan.invalid is None
    assert len(scan.batches) == 1
    return scan.batches[0]


# --- varints ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (-65, b"\x81\x01"),
        (300, b"\xd8\x04"),
        (INT32_MAX, b"\xfe\xff\xff\xff\x0f"),
        (INT32_MIN, b"\xff\xff\xff\xff\x0f"),
        (INT64_MAX, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (INT64_MIN, b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_has_kafkas_zigzag_base128_encoding(value, encoded):
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))


@given(st.integers(INT64_MIN, INT64_MAX))
def test_every_varlong_round_trips_in_at_most_ten_bytes(value):
    encoded = encode_varint(value)
    assert len(encoded) <= 10
    assert decode_varint(encoded, 0, 10) == (value, len(encoded))


@given(st.integers(INT32_MIN, INT32_MAX))
@example(INT32_MIN)
@example(INT32_MAX)
def test_every_varint_round_trips_in_at_most_five_bytes(value):
    encoded = encode_varint(value)
    assert len(encoded) <= 5
    assert decode_varint(encoded, 0, 5) == (value, len(encoded))


@given(st.binary(max_size=4), st.integers(INT64_MIN, INT64_MAX), st.binary(max_size=4))
def test_varint_decodes_at_its_position_and_returns_the_position_after_it(before, value, after):
    data = before + encode_varint(value) + after
    assert decode_varint(data, len(before)) == (value, len(data) - len(after))


def test_a_varint_longer_than_five_bytes_is_rejected():
    with pytest.raises(CorruptRecordError, match="longer than 5 bytes"):
        decode_varint(b"\x80\x80\x80\x80\x80\x00", 0, 5)


def test_a_varlong_longer_than_ten_bytes_is_rejected():
    with pytest.raises(CorruptRecordError, match="longer than 10 bytes"):
        decode_varint(b"\x80" * 10 + b"\x00", 0, 10)


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff\xff\xff"])
def test_a_varint_cut_short_is_rejected(data):
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varint(data, 0)


@given(st.binary(min_size=1, max_size=12))
def test_any_bytes_decode_to_an_int32_or_a_corrupt_record_error(data):
    # Kafka's ByteUtils.readVarint keeps 32 bits of a 5-byte varint: a value never leaves int32.
    try:
        value, _ = decode_varint(data, 0, 5)
    except CorruptRecordError:
        return
    assert INT32_MIN <= value <= INT32_MAX


@given(st.binary(min_size=1, max_size=12))
def test_any_bytes_decode_to_an_int64_or_a_corrupt_record_error(data):
    try:
        value, _ = decode_varint(data, 0, 10)
    except CorruptRecordError:
        return
    assert INT64_MIN <= value <= INT64_MAX


def test_overlong_high_bits_of_a_five_byte_varint_are_dropped_as_kafka_does():
    # 0x7f in the fifth byte sets bits 28..34; Kafka's int arithmetic keeps bits 28..31 only.
    assert decode_varint(b"\xff\xff\xff\xff\x7f", 0, 5) == (INT32_MIN, 5)


# --- records ------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(
    records=st.lists(
        st.tuples(st.integers(0, INT32_MAX), st.integers(-(2**40), 2**40), optional_bytes, optional_bytes, headers),
        min_size=1,
        max_size=6,
    ),
    base_offset=st.integers(0, 2**62),
    base_timestamp=st.integers(0, 2**42),
)
def test_records_written_by_encode_record_decode_to_the_same_fields(records, base_offset, base_timestamp):
    body = b"".join(encode_record(delta, ts_delta, key, value, hdrs) for delta, ts_delta, key, value, hdrs in records)
    batch = frame_v2(
        body,
        count=len(records),
        base_offset=base_offset,
        last_offset_delta=max(r[0] for r in records),
        base_timestamp=base_timestamp,
        max_timestamp=base_timestamp + max(r[1] for r in records),
    )
    decoded = decode_batch(batch, only_batch(batch))
    assert decoded == [
        Record(base_offset + delta, base_timestamp + ts_delta, key, value, tuple(hdrs))
        for delta, ts_delta, key, value, hdrs in records
    ]


def test_a_record_with_null_key_value_and_header_value_keeps_the_nulls_apart_from_empty_bytes():
    records = [
        NewRecord(5, None, None, (("h", None), ("", b""))),
        NewRecord(6, b"", b"", ()),
    ]
    batch = build_batch(records, base_offset=0)
    decoded = decode_batch(batch, only_batch(batch))
    assert [(r.key, r.value, r.headers) for r in decoded] == [(None, None, (("h", None), ("", b""))), (b"", b"", ())]


def test_header_keys_are_utf8_text():
    batch = build_batch([NewRecord(1, b"k", b"v", (("schlüssel-ключ-鍵", b"\xff"),))], base_offset=0)
    assert decode_batch(batch, only_batch(batch))[0].headers == (("schlüssel-ключ-鍵", b"\xff"),)


def raw_record(*fields: bytes) -> bytes:
    """A record body from already-encoded fields, behind its length prefix."""
    body = b"".join(fields)
    return encode_varint(len(body)) + body


def test_a_header_key_that_is_not_utf8_reads_with_replacement_characters_as_in_java():
    # Kafka keeps header keys as bytes; Java's String decoding replaces what is not UTF-8.
    record = raw_record(b"\x00", encode_varint(0), encode_varint(0), encode_varint(-1), encode_varint(1), b"v",
                        encode_varint(1), encode_varint(3), b"k\xff\xfe", encode_varint(-1))
    batch = frame_v2(record, count=1, base_offset=0, last_offset_delta=0, base_timestamp=5, max_timestamp=5)
    [decoded] = decode_batch(batch, only_batch(batch))
    assert decoded.headers == (("k\ufffd\ufffd", None),)


@pytest.mark.parametrize("length", [-1, -2, INT32_MIN])
def test_any_negative_key_or_value_length_means_null_as_in_kafka(length):
    record = raw_record(b"\x00", encode_varint(0), encode_varint(0), encode_varint(length), encode_varint(length),
                        encode_varint(1), encode_varint(1), b"h", encode_varint(length))
    batch = frame_v2(record, count=1, base_offset=0, last_offset_delta=0, base_timestamp=5, max_timestamp=5)
    [decoded] = decode_batch(batch, only_batch(batch))
    assert (decoded.key, decoded.value, decoded.headers) == (None, None, (("h", None),))


def test_a_header_with_a_negative_key_length_is_corrupt():
    record = raw_record(b"\x00", encode_varint(0), encode_varint(0), encode_varint(-1), encode_varint(-1),
                        encode_varint(1), encode_varint(-1), encode_varint(-1))
    batch = frame_v2(record, count=1, base_offset=0, last_offset_delta=0, base_timestamp=5, max_timestamp=5)
    with pytest.raises(CorruptRecordError, match="null header key"):
        decode_batch(batch, only_batch(batch))


def test_a_record_longer_than_its_fields_is_corrupt():
    fields = b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1) + encode_varint(-1) + encode_varint(0)
    record = encode_varint(len(fields) + 1) + fields + b"\x00"
    batch = frame_v2(record, count=1, base_offset=0, last_offset_delta=0, base_timestamp=5, max_timestamp=5)
    with pytest.raises(CorruptRecordError, match="declares"):
        decode_batch(batch, only_batch(batch))


def test_bytes_after_the_last_record_are_corrupt():
    batch = frame_v2(encode_record(0, 0, b"k", b"v") + b"\x00", count=1, base_offset=0, last_offset_delta=0, base_timestamp=5, max_timestamp=5)
    with pytest.raises(CorruptRecordError, match="after the batch"):
        decode_batch(batch, only_batch(batch))


def test_an_empty_batch_left_by_the_log_cleaner_scans_and_decodes_to_no_records():
    # Compaction keeps an emptied batch's header (no records) to remember the producer's last sequence.
    batch = frame_v2(b"", count=0, base_offset=100, last_offset_delta=4, base_timestamp=5, max_timestamp=9)
    header = only_batch(batch)
    assert (header.base_offset, header.last_offset, header.record_count, header.crc_ok) == (100, 104, 0, True)
    assert decode_batch(batch, header) == []


# --- whole batches ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(
    records=st.lists(new_records, min_size=1, max_size=12),
    codec=st.sampled_from(sorted(CODECS.values())),
    base_offset=st.integers(0, 2**62),
    leader_epoch=st.integers(-1, INT32_MAX),
    producer=producer_states,
    log_append_time=st.none() | timestamps,
)
def test_batches_round_trip_through_build_scan_and_decode(records, codec, base_offset, leader_epoch, producer, log_append_time):
    pid, pepoch, seq, transactional = producer if producer is not None else (-1, -1, -1, False)
    data = build_batch(
        records,
        base_offset=base_offset,
        codec=codec,
        partition_leader_epoch=leader_epoch,
        producer_id=pid,
        producer_epoch=pepoch,
        base_sequence=seq,
        is_transactional=transactional,
        log_append_time=log_append_time,
    )
    header = only_batch(data)

    stamps = [r.timestamp for r in records] if log_append_time is None else [log_append_time] * len(records)
    assert (header.position, header.size, header.magic) == (0, len(data), 2)
    assert (header.base_offset, header.last_offset, header.next_offset) == (base_offset, base_offset + len(records) - 1, base_offset + len(records))
    assert header.record_count == len(records)
    assert header.partition_leader_epoch == leader_epoch
    assert header.crc_ok is True
    assert header.codec == codec
    assert header.timestamp_type == (CREATE_TIME if log_append_time is None else LOG_APPEND_TIME)
    assert (header.base_timestamp, header.max_timestamp) == (stamps[0], max(stamps))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (pid, pepoch, seq)
    assert header.is_transactional is transactional
    assert header.is_control is False

    assert decode_batch(data, header) == [
        Record(base_offset + i, stamps[i], r.key, r.value, tuple(r.headers)) for i, r in enumerate(records)
    ]


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.tuples(st.lists(new_records, min_size=1, max_size=4), st.sampled_from(sorted(CODECS.values()))), min_size=1, max_size=5),
    first_offset=st.integers(0, 2**40),
)
def test_a_segment_of_back_to_back_batches_scans_to_contiguous_positions_and_offsets(batches, first_offset):
    parts, offset = [], first_offset
    for records, codec in batches:
        parts.append(build_batch(records, base_offset=offset, codec=codec, partition_leader_epoch=3))
        offset += len(records)
    segment = b"".join(parts)

    scan = scan_batches(segment)
    assert scan.invalid is None
    assert scan.valid_bytes == len(segment)
    assert [b.size for b in scan.batches] == [len(p) for p in parts]
    assert [b.position for b in scan.batches] == [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    assert scan.batches[0].base_offset == first_offset
    assert all(a.next_offset == b.base_offset for a, b in zip(scan.batches, scan.batches[1:]))
    assert scan.crc_failures == []

    decoded = [r for _, records in read_records(segment) for r in records]
    assert [r.offset for r in decoded] == list(range(first_offset, offset))
    assert [r.value for r in decoded] == [r.value for records, _ in batches for r in records]


def test_a_header_only_scan_leaves_crc_unchecked_when_asked():
    data = build_batch([NewRecord(1, b"k", b"v")], base_offset=0)
    assert scan_batches(data, verify_crc=False).batches[0].crc_ok is None


def test_scanning_from_a_start_position_skips_the_bytes_before_it():
    first = build_batch([NewRecord(1, b"a", b"1")], base_offset=0)
    second = build_batch([NewRecord(2, b"b", b"2")], base_offset=1)
    scan = scan_batches(first + second, start=len(first))
    assert [(b.position, b.base_offset) for b in scan.batches] == [(len(first), 1)]
    assert scan.valid_bytes == len(first) + len(second)


def test_rewriting_base_offset_and_leader_epoch_keeps_the_crc_valid():
    data = with_base_offset_and_epoch(build_batch([NewRecord(7, b"k", b"v"), NewRecord(8, None, b"w")], base_offset=0), 1000, 12)
    header = only_batch(data)
    assert (header.base_offset, header.last_offset, header.partition_leader_epoch, header.crc_ok) == (1000, 1001, 12, True)
    assert [r.offset for r in decode_batch(data, header)] == [1000, 1001]


def test_an_empty_batch_cannot_be_built():
    with pytest.raises(ValueError):
        build_batch([], base_offset=0)


# --- control batches ----------------------------------------------------------------------------


@pytest.mark.parametrize(("commit", "type_", "name"), [(True, CONTROL_COMMIT, "COMMIT"), (False, CONTROL_ABORT, "ABORT")])
def test_a_transaction_marker_reads_back_as_commit_or_abort_with_its_coordinator_epoch(commit, type_, name):
    data = build_control_batch(base_offset=41, commit=commit, producer_id=9001, producer_epoch=4, coordinator_epoch=17, timestamp=1_700_000_000_000, partition_leader_epoch=2)
    header = only_batch(data)
    assert header.is_control and header.is_transactional
    assert (header.base_offset, header.last_offset, header.record_count) == (41, 41, 1)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9001, 4, -1)
    assert header.codec == 0
    [record] = decode_batch(data, header)
    assert (record.offset, record.timestamp) == (41, 1_700_000_000_000)
    marker = parse_control_record(record)
    assert (marker.version, marker.type, marker.type_name, marker.coordinator_epoch) == (0, type_, name, 17)


def test_a_control_record_without_a_coordinator_epoch_reads_as_none():
    marker = parse_control_record(Record(0, 0, struct.pack(">hh", 0, CONTROL_COMMIT), b"\x00\x00"))
    assert (marker.type_name, marker.coordinator_epoch) == ("COMMIT", None)


@pytest.mark.parametrize(
    ("type_", "name"),
    [(2, "LEADER_CHANGE"), (3, "SNAPSHOT_HEADER"), (4, "SNAPSHOT_FOOTER"), (5, "KRAFT_VERSION"), (6, "KRAFT_VOTERS"), (7, "UNKNOWN(7)")],
)
def test_kraft_control_records_are_named_and_carry_no_coordinator_epoch(type_, name):
    # A KRaft LeaderChangeMessage value is version int16 + leaderId int32 + ...: not a coordinator epoch.
    leader_change_value = struct.pack(">hii", 0, 3, 0)
    marker = parse_control_record(Record(0, 0, struct.pack(">hh", 0, type_), leader_change_value))
    assert (marker.type, marker.type_name, marker.coordinator_epoch) == (type_, name, None)


@pytest.mark.parametrize("key", [None, b"", b"\x00\x00\x00"])
def test_a_control_record_with_a_short_key_is_corrupt(key):
    with pytest.raises(CorruptRecordError) as info:
        parse_control_record(Record(12, 0, key, None))
    assert isinstance(info.value, KafkaFormatError)
    assert "offset 12" in str(info.value)


# --- JSON contract ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec_name", sorted(CODECS))
def test_batch_json_carries_the_contract_fields(codec_name):
    data = build_batch([NewRecord(5, b"k", b"v" * 100), NewRecord(9, b"k", b"v" * 100)], base_offset=10, codec=CODECS[codec_name], partition_leader_epoch=3)
    fields = only_batch(data).to_json()
    assert {
        "position": 0,
        "size": len(data),
        "base_offset": 10,
        "last_offset": 11,
        "leader_epoch": 3,
        "codec": codec_name,
        "crc_ok": True,
        "is_control": False,
        "is_transactional": False,
        "max_timestamp": 9,
        "record_count": 2,
    }.items() <= fields.items()


def test_the_read_paths_batch_check_finds_what_the_scan_finds_and_stops_where_it_would_complain():
    batches = [build_batch([NewRecord(1_700_000_000_000 + i, b"k%d" % i, b"v" * (i * 40))], base_offset=i * 3, partition_leader_epoch=2)
               for i in range(5)]
    data = b"".join(batches)
    positions, end = verified_batch_positions(data)
    scan = scan_batches(data)
    assert positions == [h.position for h in scan.batches] and end == len(data)
    assert [read_v2_header(data, p, crc_ok=True) for p in positions] == scan.batches

    third = positions[2]
    damaged = bytearray(data)
    damaged[third + 70] ^= 0x01  # inside the third batch's records: its CRC fails
    assert verified_batch_positions(bytes(damaged)) == (positions[:2], third)
    assert verified_batch_positions(data[:-3]) == (positions[:4], positions[4])  # the last one cut off
    assert verified_batch_positions(b"") == ([], 0)
