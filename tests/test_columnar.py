"""The columnar decoder (what ``read_tiered``'s executors use) gives exactly what the record
decoder gives — the same records, or the same located CorruptRecordError — on batches kts wrote,
batches kafka-python wrote (an independent writer), a real broker's segments, every codec, and
damaged record bodies."""

from __future__ import annotations

import random
import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kts_resources.kafka.columnar import decode_columns
from kts_resources.kafka.errors import CorruptRecordError
from kts_resources.kafka.records import NewRecord, build_batch, decode_batch, scan_batches
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from tests.conftest import shared_dir

T0 = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def as_rows(columns) -> list[tuple]:
    return list(zip(columns.offset.tolist(), columns.timestamp.tolist(), columns.timestamp_type.tolist(),
                    columns.leader_epoch.tolist(), columns.key.to_pylist(), columns.value.to_pylist(),
                    [[(h["key"], h["value"]) for h in hs] for hs in columns.headers.to_pylist()]))


def reference_rows(batches) -> list[tuple]:
    return [(r.offset, r.timestamp, h.timestamp_type, h.partition_leader_epoch, r.key, r.value, list(r.headers))
            for h, data in batches for r in decode_batch(data, h, verify_crc=False)]


def outcome(fn, batches):
    try:
        return fn(batches)
    except CorruptRecordError as e:
        return ("corrupt", str(e), e.position)


def assert_same(batches):
    assert outcome(lambda b: as_rows(decode_columns(b)), batches) == outcome(reference_rows, batches)


def whole_log(data: bytes) -> list:
    return [(h, data) for h in scan_batches(data).batches]


def test_a_simulated_log_with_every_codec_and_transactions_decodes_to_the_same_records(tmp_path):
    simulate(tmp_path, SimulationConfig(seed=11, topics=("t",), partitions=1, total_bytes=3 << 20, segment_bytes=1 << 20,
                                        batch_size=32 * 1024, record_size=700, transactional_producers=1,
                                        codecs=tuple(CODECS)))
    segments = sorted(tmp_path.rglob("*.log"))
    assert len(segments) >= 3
    for segment in segments:
        batches = whole_log(segment.read_bytes())
        assert len(decode_columns(batches)) == sum(h.record_count for h, _ in batches)
        assert_same(batches)


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("log_append_time", [False, True], ids=["CreateTime", "LogAppendTime"])
def test_batches_kafka_python_wrote_decode_to_the_same_records(codec, log_append_time):
    records = [
        (T0 + 5, b"key-0", b"value " * 30, [("trace-id", b"abc"), ("empty", b""), ("gone", None)]),
        (T0 - 3, None, b"keyless " * 20, []),
        (T0 + 1, b"tombstone", None, [("deleted-by", b"compaction")]),
        (T0 + 9, b"", b"", []),
        (T0 + 2, b"large", bytes(range(256)) * 120, [("h", b"x" * 300)]),  # a 3-byte record length
    ]
    builder = DefaultRecordBatchBuilder(2, CODECS[codec], False, -1, -1, -1, 1 << 30)
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, ts, key, value, headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, 1000)
    struct.pack_into(">i", data, 12, 7)
    if log_append_time:  # as a broker stamps it: the batch's max timestamp for every record
        struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x08)
        struct.pack_into(">q", data, 35, T0 + 60_000)
        struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    batches = whole_log(bytes(data))
    assert_same(batches)
    rows = as_rows(decode_columns(batches))
    assert [r[0] for r in rows] == [1000, 1001, 1002, 1003, 1004]
    assert rows[2][5] is None and rows[1][4] is None and rows[0][6][2] == ("gone", None)


def test_segments_a_real_broker_and_other_implementations_wrote_decode_to_the_same_records(third_party_dir):
    segments = sorted((shared_dir() / "fixtures" / "real_broker").rglob("*.log")) + sorted(third_party_dir.glob("*.log"))
    assert len(segments) >= 11
    for segment in segments:
        assert_same(whole_log(segment.read_bytes()))


def test_header_keys_that_are_not_utf8_are_replaced_as_kafkas_client_does():
    data = build_batch([NewRecord(T0, b"k", b"v", (("ok", b"1"),)), NewRecord(T0 + 1, b"k", b"v", ((b"\xff\xfe".decode("latin-1"), b"2"),))],
                       base_offset=0)
    raw = bytearray(data)
    at = raw.index("ÿþ".encode())  # the UTF-8 of the latin-1 key: made invalid UTF-8 below
    raw[at:at + 4] = b"\xff\xfe\xff\xfe"
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    batches = whole_log(bytes(raw))
    assert_same(batches)
    assert "\ufffd" in as_rows(decode_columns(batches))[1][6][0][0]


def test_legacy_messages_go_through_the_record_decoder():
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=T0 + i, key=b"k%d" % i, value=b"v%d" % i)
    batches = whole_log(bytes(builder.build()))
    assert_same(batches)
    assert len(decode_columns(batches)) == 3


def test_no_batches_give_no_records():
    columns = decode_columns([])
    assert len(columns) == 0 and columns.headers.to_pylist() == []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 4))
@example(seed=2003, flips=2)  # a bad record in the first batch, an unknown codec in the second: the first's error
def test_damaged_record_bodies_give_the_record_decoders_records_or_its_error(seed, flips):
    """Bytes flipped inside the records (the CRC is not what is tested here: the reader checks it
    before decoding): both decoders agree, whether on records or on the located error."""
    rng = random.Random(seed)
    records = [NewRecord(T0 + rng.randint(-5, 5), rng.choice([None, b"key-%d" % i]), rng.randbytes(rng.choice([0, 10, 100, 300])),
                         tuple((f"h{j}", rng.choice([None, b"v"])) for j in range(rng.randint(0, 2))))
               for i in range(rng.randint(1, 8))]
    raw = bytearray(build_batch(records, base_offset=50) + build_batch(records[:2], base_offset=50 + len(records)))
    for _ in range(flips):
        at = rng.randrange(61, len(raw))
        raw[at] = rng.randrange(256)
    data = bytes(raw)
    assert_same([(h, data) for h in scan_batches(data, verify_crc=False).batches])


def test_a_batch_that_fails_to_decompress_after_a_damaged_one_gives_the_first_batchs_error():
    good = build_batch([NewRecord(T0, b"k", b"v" * 50)], base_offset=0)
    damaged = bytearray(good)
    damaged[61] = 0x7F  # the first record's length: far past the batch
    compressed = bytearray(build_batch([NewRecord(T0, b"k", b"lz4 " * 40)], base_offset=1, codec=CODECS["lz4"]))
    compressed[70:74] = b"\xff\xff\xff\xff"  # the LZ4 frame no longer decompresses
    data = bytes(damaged) + bytes(compressed)
    batches = [(h, data) for h in scan_batches(data, verify_crc=False).batches]
    assert len(batches) == 2
    assert_same(batches)
    with pytest.raises(CorruptRecordError) as raised:
        decode_columns(batches)
    assert raised.value.position == 0


def test_a_forged_record_count_with_a_negative_length_is_an_error_at_once():
    raw = bytearray(build_batch([NewRecord(T0, b"k", b"v")], base_offset=0))
    struct.pack_into(">i", raw, 57, 2_000_000_000)  # recordCount
    raw[61] = 0x01  # the first record's length: zigzag -1
    batches = [(h, bytes(raw)) for h in scan_batches(bytes(raw), verify_crc=False).batches]
    assert_same(batches)
