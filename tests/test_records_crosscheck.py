"""kts's record code agrees with independent Kafka implementations, in both directions.

kafka-python (3.0.12) is the independent implementation:
- magic-2 batches its ``DefaultRecordBatchBuilder`` writes (every codec; headers with null values,
  null keys, tombstones, empty and large values, out-of-order timestamps, idempotent and
  transactional producer state, and as a broker stamps them with LogAppendTime) scan and decode
  in kts to the header fields and records kafka-python's own reader sees;
- batches kts's ``build_batch`` / ``build_control_batch`` write (every codec, CreateTime and
  LogAppendTime) are read by kafka-python's ``DefaultRecordBatch`` with a valid CRC and the same
  records, and an uncompressed batch is byte-for-byte what kafka-python writes;
- legacy magic 0 and 1 message sets from ``LegacyRecordBatchBuilder`` (plain messages and
  compressed wrappers, Kafka 0.8's LZ4 framing included) scan and decode with the right absolute
  offsets, timestamps, keys and values.
The segment files other Kafka implementations wrote (shared fixtures/third_party) decode fully.
"""

from __future__ import annotations

import struct
import types
import zlib

import kafka.codec
import lz4.frame
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import decode_varint as kp_decode_varint
from kafka.record.util import encode_varint as kp_encode_varint

from kts_resources.kafka.records import (
    BatchHeader,
    NewRecord,
    build_batch,
    build_control_batch,
    decode_batch,
    encode_varint,
    parse_control_record,
    read_records,
    scan_batches,
)

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
LEGACY_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3}  # zstd needs magic 2
T0 = 1_700_000_000_000
BIG = 1 << 30  # a batch size kafka-python's builders never reach

# --- the two readers, reduced to comparable values -----------------------------------------------


def kp_batch_fields(batch: DefaultRecordBatch) -> dict:
    return {
        "base_offset": batch.base_offset,
        "last_offset": batch.last_offset,
        "leader_epoch": batch.leader_epoch,
        "size": batch.size_in_bytes,
        "record_count": batch.records_count,
        "attributes": batch.attributes,
        "codec": batch.compression_type,
        "timestamp_type": batch.timestamp_type,
        "base_timestamp": batch.first_timestamp,
        "max_timestamp": batch.max_timestamp,
        "producer": (batch.producer_id, batch.producer_epoch, batch.base_sequence),
        "is_transactional": batch.is_transactional,
        "is_control": batch.is_control_batch,
        "crc": batch.crc,
    }


def our_batch_fields(header: BatchHeader) -> dict:
    return {
        "base_offset": header.base_offset,
        "last_offset": header.last_offset,
        "leader_epoch": header.partition_leader_epoch,
        "size": header.size,
        "record_count": header.record_count,
        "attributes": header.attributes,
        "codec": header.codec,
        "timestamp_type": header.timestamp_type,
        "base_timestamp": header.base_timestamp,
        "max_timestamp": header.max_timestamp,
        "producer": (header.producer_id, header.producer_epoch, header.base_sequence),
        "is_transactional": header.is_transactional,
        "is_control": header.is_control,
        "crc": header.crc,
    }


def kp_records(batch) -> list[tuple]:
    """kafka-python's records as (offset, timestamp, key, value, headers); magic 0 has no timestamp (-1)."""
    return [
        (r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value, tuple(map(tuple, r.headers)))
        for r in batch
    ]


def our_records(data: bytes, header: BatchHeader) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_batch(data, header)]


def kp_read_segment(segment: bytes) -> list[tuple[int, bool, list[tuple]]]:
    """Every batch kafka-python finds in a segment: (size, CRC valid, records)."""
    out = []
    for batch in MemoryRecords(segment):
        crc_ok = batch.validate_crc()  # must come before iteration decompresses
        out.append((batch.size_in_bytes, crc_ok, kp_records(batch)))
    return out


def only_batch(data: bytes) -> BatchHeader:
    scan = scan_batches(data)
    assert scan.invalid is None and len(scan.batches) == 1, scan
    return scan.batches[0]


# --- magic 2 written by kafka-python ------------------------------------------------------------


def kp_build(
    records: list[tuple],
    codec: int,
    *,
    base_offset: int = 0,
    leader_epoch: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
) -> bytes:
    """A batch as kafka-python's producer writes it, then placed as a broker would (offset, epoch)."""
    pid, pepoch, seq = producer
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=transactional,
        producer_id=pid, producer_epoch=pepoch, base_sequence=seq, batch_size=BIG,
    )
    for i, (timestamp, key, value, headers) in enumerate(records):
        assert builder.append(i, timestamp, key, value, headers) is not None
    data = bytearray(builder.build())
    # The broker assigns these two; the CRC does not cover them.
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, leader_epoch)
    # kafka-python sends uncompressed when compression does not pay: make sure the codec is exercised.
    assert data[22] & 0x07 == codec, "kafka-python fell back to no compression; make the records compressible"
    return bytes(data)


def _large_value(n: int) -> bytes:
    # Compressible but not trivially so, and bigger than one snappy (32 KiB) or LZ4 (64 KiB) block.
    return b"".join(b"%08d:" % i + bytes(range(i % 200, i % 200 + 40)) for i in range(n // 49 + 1))[:n]


SCENARIOS = {
    "keys_values_and_headers": [
        (T0 + i, b"key-%03d" % i, b"value %03d " % i * 20, [("trace-id", b"abc-%d" % i), ("source", b"unit-test")])
        for i in range(6)
    ],
    "null_header_values": [
        (T0 + i, b"key-%03d" % i, b"payload " * 30, [("present", b"yes"), ("absent", None), ("", b"")])
        for i in range(4)
    ],
    "null_keys": [(T0 + i, None, b"keyless value " * 20, []) for i in range(5)],
    "tombstones": [(T0 + i, b"compacted-key-%06d" % i, None, []) for i in range(20)],
    "empty_keys_and_values": [(T0, b"", b"", [])] * 30,
    "large_values": [(T0, b"big-1", _large_value(300_000), []), (T0 + 1, b"big-2", _large_value(70_000), [("h", b"v")])],
    "out_of_order_timestamps": [
        (ts, b"k", b"timestamps need not rise " * 8, []) for ts in (T0 + 50, T0, T0 + 200, T0 - 7, T0 + 3)
    ],
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("codec_name", sorted(CODECS))
def test_batch_built_by_kafka_python_decodes_to_the_same_header_and_records(codec_name, scenario):
    data = kp_build(SCENARIOS[scenario], CODECS[codec_name], base_offset=1234, leader_epoch=7)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()

    header = only_batch(data)
    assert header.crc_ok is True
    assert our_batch_fields(header) == kp_batch_fields(theirs)
    assert header.codec_name == codec_name
    assert our_records(data, header) == kp_records(theirs)
    # And both agree with what was written.
    assert [(r[0], r[1], r[2], r[3]) for r in our_records(data, header)] == [
        (1234 + i, ts, key, value) for i, (ts, key, value, _) in enumerate(SCENARIOS[scenario])
    ]


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
@pytest.mark.parametrize("codec_name", sorted(CODECS))
def test_producer_state_written_by_kafka_python_is_read_back(codec_name, transactional):
    producer = (123_456_789_012, 17, 2_147_483_000)
    data = kp_build(SCENARIOS["keys_values_and_headers"], CODECS[codec_name], base_offset=99, producer=producer, transactional=transactional)
    theirs = DefaultRecordBatch(data)
    header = only_batch(data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer
    assert header.is_transactional is transactional
    assert header.crc_ok is True
    assert our_batch_fields(header) == kp_batch_fields(theirs)
    assert our_records(data, header) == kp_records(theirs)


def test_a_segment_of_kafka_python_batches_scans_to_the_same_batches_and_records():
    parts, offset = [], 500
    for i, (codec_name, scenario) in enumerate(zip(sorted(CODECS), sorted(SCENARIOS))):
        records = SCENARIOS[scenario]
        parts.append(kp_build(records, CODECS[codec_name], base_offset=offset, leader_epoch=i))
        offset += len(records)
    segment = b"".join(parts)

    scan = scan_batches(segment)
    assert scan.invalid is None and scan.valid_bytes == len(segment)
    theirs = kp_read_segment(segment)
    assert [(b.size, b.crc_ok) for b in scan.batches] == [(size, crc_ok) for size, crc_ok, _ in theirs]
    assert [b.position for b in scan.batches] == [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    assert [our_records(segment, b) for b in scan.batches] == [records for _, _, records in theirs]
    assert [r.offset for _, records in read_records(segment) for r in records] == list(range(500, offset))


@pytest.mark.parametrize("codec_name", sorted(CODECS))
def test_a_producer_batch_the_broker_stamped_with_log_append_time_reads_every_record_at_that_time(codec_name):
    # In place, as Kafka's LogValidator does it: the timestamp-type bit and maxTimestamp change,
    # the producer's base timestamp and record deltas stay, and the CRC is recomputed.
    data = bytearray(kp_build(SCENARIOS["out_of_order_timestamps"], CODECS[codec_name], base_offset=3))
    struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x08)
    struct.pack_into(">q", data, 35, T0 + 86_400_000)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    data = bytes(data)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc() and theirs.timestamp_type == 1
    header = only_batch(data)
    assert header.crc_ok is True
    assert our_batch_fields(header) == kp_batch_fields(theirs)
    assert header.base_timestamp == T0 + 50
    assert our_records(data, header) == kp_records(theirs)
    assert {r.timestamp for r in decode_batch(data, header)} == {T0 + 86_400_000}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(
        st.tuples(
            st.integers(0, 2**42),
            st.none() | st.binary(max_size=30),
            st.none() | st.binary(max_size=100) | st.binary(min_size=1, max_size=4).map(lambda b: b * 64),
            st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3),
        ),
        min_size=1,
        max_size=10,
    ),
    codec=st.sampled_from(sorted(CODECS.values())),
)
def test_random_batches_built_by_kafka_python_decode_like_kafka_python_reads_them(records, codec):
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, BIG)
    for i, (timestamp, key, value, headers) in enumerate(records):
        builder.append(i, timestamp, key, value, headers)
    data = bytes(builder.build())  # may fall back to no compression: still a valid batch
    theirs = DefaultRecordBatch(data)
    header = only_batch(data)
    assert header.crc_ok is True
    assert our_batch_fields(header) == kp_batch_fields(theirs)
    assert our_records(data, header) == kp_records(theirs)


# --- magic 2 written by kts ---------------------------------------------------------------------

OUR_RECORDS = [
    NewRecord(T0, b"key-0", b"first value " * 20, (("trace", b"t-0"), ("nothing", None))),
    NewRecord(T0 + 9, None, b"keyless " * 20),
    NewRecord(T0 - 4, b"tombstone-key", None, (("deleted-by", b"compaction"),)),
    NewRecord(T0 + 3, b"", b""),
    NewRecord(T0 + 5, b"large", _large_value(150_000)),
]


@pytest.mark.parametrize("log_append_time", [None, T0 + 60_000], ids=["CreateTime", "LogAppendTime"])
@pytest.mark.parametrize("codec_name", sorted(CODECS))
def test_batch_built_by_kts_is_read_by_kafka_python(codec_name, log_append_time):
    producer = (4242, 3, 100)
    data = build_batch(
        OUR_RECORDS, base_offset=777, codec=CODECS[codec_name], partition_leader_epoch=5,
        producer_id=producer[0], producer_epoch=producer[1], base_sequence=producer[2],
        is_transactional=True, log_append_time=log_append_time,
    )
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert theirs.compression_type == CODECS[codec_name]
    assert (theirs.base_offset, theirs.last_offset, theirs.leader_epoch, theirs.records_count) == (777, 781, 5, 5)
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == producer
    assert theirs.is_transactional and not theirs.is_control_batch
    assert theirs.size_in_bytes == len(data)

    header = only_batch(data)
    assert our_batch_fields(header) == kp_batch_fields(theirs)
    expected = [
        (777 + i, r.timestamp if log_append_time is None else log_append_time, r.key, r.value, tuple(r.headers))
        for i, r in enumerate(OUR_RECORDS)
    ]
    assert theirs.timestamp_type == (0 if log_append_time is None else 1)
    assert theirs.max_timestamp == (max(r.timestamp for r in OUR_RECORDS) if log_append_time is None else log_append_time)
    assert kp_records(theirs) == expected
    assert our_records(data, header) == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(
        st.builds(
            NewRecord,
            timestamp=st.integers(-1, 2**42),
            key=st.none() | st.binary(max_size=30),
            value=st.none() | st.binary(max_size=100) | st.binary(min_size=1, max_size=4).map(lambda b: b * 64),
            headers=st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3).map(tuple),
        ),
        min_size=1,
        max_size=10,
    ),
    codec=st.sampled_from(sorted(CODECS.values())),
    base_offset=st.integers(0, 2**62),
    log_append_time=st.none() | st.integers(0, 2**42),
)
def test_random_batches_built_by_kts_are_read_by_kafka_python(records, codec, base_offset, log_append_time):
    data = build_batch(records, base_offset=base_offset, codec=codec, log_append_time=log_append_time)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert kp_batch_fields(theirs) == our_batch_fields(only_batch(data))
    assert kp_records(theirs) == [
        (base_offset + i, r.timestamp if log_append_time is None else log_append_time, r.key, r.value, tuple(r.headers))
        for i, r in enumerate(records)
    ]


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.integers(0, 2**42),
            st.none() | st.binary(max_size=30),
            st.none() | st.binary(max_size=60),
            st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3),
        ),
        min_size=1,
        max_size=8,
    ),
    producer=st.sampled_from([(-1, -1, -1, False), (77, 2, 10, False), (78, 0, 0, True)]),
)
def test_an_uncompressed_batch_is_byte_for_byte_what_kafka_python_writes(records, producer):
    pid, pepoch, seq, transactional = producer
    builder = DefaultRecordBatchBuilder(2, 0, transactional, pid, pepoch, seq, BIG)
    for i, (timestamp, key, value, headers) in enumerate(records):
        builder.append(i, timestamp, key, value, headers)
    ours = build_batch(
        [NewRecord(ts, key, value, tuple(headers)) for ts, key, value, headers in records],
        base_offset=0, partition_leader_epoch=0, producer_id=pid, producer_epoch=pepoch,
        base_sequence=seq, is_transactional=transactional,
    )
    assert ours == bytes(builder.build())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_control_batch_built_by_kts_is_a_transaction_marker_to_kafka_python(commit):
    data = build_control_batch(base_offset=64, commit=commit, producer_id=555, producer_epoch=6, coordinator_epoch=31, timestamp=T0, partition_leader_epoch=4)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    assert (theirs.producer_id, theirs.producer_epoch) == (555, 6)
    [marker] = list(theirs)
    assert (marker.offset, marker.version, marker.commit, marker.abort) == (64, 0, commit, not commit)
    assert struct.unpack(">hi", marker.value) == (0, 31)  # value: version + coordinatorEpoch

    [record] = decode_batch(data, only_batch(data))
    ours = parse_control_record(record)
    assert (ours.type_name, ours.coordinator_epoch) == ("COMMIT" if commit else "ABORT", 31)


@given(st.integers(-(2**63), 2**63 - 1))
def test_varints_match_kafka_pythons_encoding(value):
    theirs = bytearray()
    kp_encode_varint(value, theirs.append)
    assert encode_varint(value) == bytes(theirs)
    assert kp_decode_varint(encode_varint(value), 0) == (value, len(theirs))


# --- legacy message sets (magic 0 and 1) written by kafka-python --------------------------------

LEGACY_MESSAGES = [
    (T0 + 10, b"key-a", b"legacy value " * 10),
    (T0 + 30, None, b"no key here " * 10),
    (T0 + 20, b"key-c", None),
    (T0 + 25, b"", b""),
]


def kp_legacy_plain(magic: int, messages: list[tuple], first_offset: int) -> bytes:
    """Uncompressed: each message is a top-level entry with its own absolute offset."""
    builder = LegacyRecordBatchBuilder(magic, 0, BIG)
    for i, (timestamp, key, value) in enumerate(messages):
        builder.append(first_offset + i, timestamp, key, value)
    return bytes(builder.build())


def kp_legacy_wrapper(magic: int, codec: int, messages: list[tuple], first_offset: int, *, log_append_time: int | None = None) -> bytes:
    """A compressed wrapper as a 0.10 broker stores it: the wrapper carries the LAST absolute offset;
    magic-1 inner offsets are relative (0..n-1), magic-0 inner offsets absolute."""
    builder = LegacyRecordBatchBuilder(magic, codec, BIG)
    for i, (timestamp, key, value) in enumerate(messages):
        builder.append(i if magic == 1 else first_offset + i, timestamp, key, value)
    wrapper = bytearray(builder.build())
    assert wrapper[17] & 0x07 == codec
    struct.pack_into(">q", wrapper, 0, first_offset + len(messages) - 1)  # not covered by the CRC
    if log_append_time is not None:
        wrapper[17] |= 0x08
        struct.pack_into(">q", wrapper, 18, log_append_time)
        struct.pack_into(">I", wrapper, 12, zlib.crc32(wrapper[16:]))  # CRC-32 of magic..end
    return bytes(wrapper)


def assert_legacy_segment_matches_kafka_python(segment: bytes) -> list[BatchHeader]:
    scan = scan_batches(segment)
    assert scan.invalid is None and scan.valid_bytes == len(segment)
    theirs = kp_read_segment(segment)
    assert [(b.size, b.crc_ok) for b in scan.batches] == [(size, crc_ok) for size, crc_ok, _ in theirs]
    assert all(crc_ok for _, crc_ok, _ in theirs)
    assert [our_records(segment, b) for b in scan.batches] == [records for _, _, records in theirs]
    return scan.batches


@pytest.mark.parametrize("magic", [0, 1])
def test_uncompressed_legacy_messages_each_scan_as_one_entry(magic):
    segment = kp_legacy_plain(magic, LEGACY_MESSAGES, first_offset=40)
    batches = assert_legacy_segment_matches_kafka_python(segment)
    assert [(b.magic, b.base_offset, b.last_offset, b.record_count, b.codec) for b in batches] == [(magic, 40 + i, 40 + i, 1, 0) for i in range(4)]
    records = [r for b in batches for r in decode_batch(segment, b)]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (40 + i, ts if magic == 1 else -1, key, value, ()) for i, (ts, key, value) in enumerate(LEGACY_MESSAGES)
    ]
    assert [b.max_timestamp for b in batches] == [ts if magic == 1 else -1 for ts, _, _ in LEGACY_MESSAGES]


@pytest.fixture
def kafka_python_lz4_for_magic_0(monkeypatch):
    """kafka-python writes and reads Kafka 0.8's LZ4 framing (whose header checksum hashes the wrong
    bytes) only through the optional xxhash package; without it, lend it an XXH32 that is first
    checked against the header checksum liblz4 itself writes."""
    if kafka.codec.xxhash is not None:
        return
    from kts_resources.kafka.codecs import _xxh32_short

    frame = lz4.frame.compress(b"liblz4 writes the right checksum", store_size=False)
    assert (_xxh32_short(frame[4:6]) >> 8) & 0xFF == frame[6]  # HC = second byte of XXH32(FLG, BD)

    class XXH32:
        def __init__(self, data):
            self._digest = _xxh32_short(bytes(data)).to_bytes(4, "big")

        def digest(self):
            return self._digest

    monkeypatch.setattr(kafka.codec, "xxhash", types.SimpleNamespace(xxh32=XXH32))


@pytest.mark.parametrize("codec_name", ["gzip", "snappy", "lz4"])
@pytest.mark.parametrize("magic", [0, 1])
def test_compressed_legacy_wrapper_decodes_to_absolute_inner_offsets(magic, codec_name, kafka_python_lz4_for_magic_0):
    wrapper = kp_legacy_wrapper(magic, LEGACY_CODECS[codec_name], LEGACY_MESSAGES, first_offset=1000)
    [header] = assert_legacy_segment_matches_kafka_python(wrapper)
    assert (header.magic, header.codec_name, header.crc_ok) == (magic, codec_name, True)
    assert (header.base_offset, header.last_offset, header.record_count) == (1000, 1003, 4)
    assert header.max_timestamp == (max(ts for ts, _, _ in LEGACY_MESSAGES) if magic == 1 else -1)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_batch(wrapper, header)] == [
        (1000 + i, ts if magic == 1 else -1, key, value) for i, (ts, key, value) in enumerate(LEGACY_MESSAGES)
    ]


def test_a_magic_0_lz4_wrapper_with_kafka_08s_wrong_header_checksum_is_read(kafka_python_lz4_for_magic_0):
    wrapper = kp_legacy_wrapper(0, LEGACY_CODECS["lz4"], LEGACY_MESSAGES, first_offset=20)
    value = wrapper[26 + 4 :]  # magic-0 wrapper: header (18), null key (4), value length (4)
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(value)  # the standard frame reader rejects the checksum...
    [header] = assert_legacy_segment_matches_kafka_python(wrapper)  # ...Kafka's reader does not
    assert (header.base_offset, header.last_offset, header.record_count, header.crc_ok) == (20, 23, 4, True)


@pytest.mark.parametrize("codec_name", ["gzip", "snappy", "lz4"])
def test_a_log_append_time_legacy_wrapper_stamps_every_inner_message_with_its_time(codec_name):
    wrapper = kp_legacy_wrapper(1, LEGACY_CODECS[codec_name], LEGACY_MESSAGES, first_offset=7, log_append_time=T0 + 99_999)
    [header] = assert_legacy_segment_matches_kafka_python(wrapper)
    assert header.timestamp_type == 1
    assert header.max_timestamp == T0 + 99_999
    assert {r.timestamp for r in decode_batch(wrapper, header)} == {T0 + 99_999}


def test_a_topic_upgraded_from_magic_0_to_2_reads_through_every_format():
    segment = b"".join(
        [
            kp_legacy_plain(0, LEGACY_MESSAGES[:2], first_offset=0),
            kp_legacy_wrapper(0, LEGACY_CODECS["gzip"], LEGACY_MESSAGES, first_offset=2),
            kp_legacy_plain(1, LEGACY_MESSAGES[:1], first_offset=6),
            kp_legacy_wrapper(1, LEGACY_CODECS["snappy"], LEGACY_MESSAGES, first_offset=7),
            kp_build(SCENARIOS["keys_values_and_headers"], CODECS["zstd"], base_offset=11),
        ]
    )
    scan = scan_batches(segment)
    assert scan.invalid is None and not scan.crc_failures
    assert [b.magic for b in scan.batches] == [0, 0, 0, 1, 1, 2]
    assert [r.offset for _, records in read_records(segment) for r in records] == list(range(0, 17))
    assert [our_records(segment, b) for b in scan.batches] == [records for _, _, records in kp_read_segment(segment)]


# --- segments other Kafka implementations wrote -------------------------------------------------

THIRD_PARTY = {
    # file: (size, [(base offset, last offset)], [[metadata record type of each record]])
    "kafka-gleam-00000000000000000000.log": (331, [(0, 0), (1, 3)], [[12], [2, 3, 3]]),
    "codecrafters-kafka-go-00000000000000000000.log": (258, [(1, 1), (2, 3)], [[12], [2, 3]]),
}


@pytest.mark.parametrize("name", sorted(THIRD_PARTY))
def test_third_party_segment_decodes_fully_with_valid_crcs(third_party_dir, name):
    size, offsets, record_types = THIRD_PARTY[name]
    data = (third_party_dir / name).read_bytes()
    assert len(data) == size

    scan = scan_batches(data)
    assert scan.invalid is None and scan.valid_bytes == size
    assert [(b.base_offset, b.last_offset) for b in scan.batches] == offsets
    assert all(b.crc_ok for b in scan.batches)
    assert {b.partition_leader_epoch for b in scan.batches} == {1}
    assert all(b.magic == 2 and b.codec == 0 and not b.is_control for b in scan.batches)

    decoded = [decode_batch(data, b) for b in scan.batches]
    assert [[r.offset for r in records] for records in decoded] == [list(range(first, last + 1)) for first, last in offsets]
    # KRaft metadata records: frame version 1, then the record type (12 feature level, 2 topic, 3 partition).
    assert [[r.value[1] for r in records] for records in decoded] == record_types
    assert all(r.key is None and r.value[0] == 1 for records in decoded for r in records)
    assert b"metadata.version" in decoded[0][0].value
    assert [our_records(data, b) for b in scan.batches] == [records for _, _, records in kp_read_segment(data)]
