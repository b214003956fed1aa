"""Kafka compression codecs (kts_resources.kafka.codecs).

Covers: codec ids and names; round trips for every codec (empty, small, block-boundary, ≥1 MiB
compressible and incompressible inputs, memoryview input and output of slices); the exact framing
our writer produces (gzip member, xerial snappy with 32 KiB blocks, Kafka's LZ4 frame, zstd);
compression levels as Kafka bounds them; cross-checks with kafka-python in both directions,
including its old-Kafka (0.8/0.9) LZ4 frames with the broken header checksum; raw unframed and
concatenated snappy; gzip members and zstd frames back to back; and that corrupt, truncated,
empty, oversized-claim or unknown-codec input raises CodecError and nothing else.

Snappy and Kafka's LZ4 frames carry no checksum of their content (the batch CRC covers that), so
the corruption tests damage structure: lengths, headers, back-references, trailers.
"""

from __future__ import annotations

import gzip
import io
import random
import struct
from concurrent.futures import ThreadPoolExecutor

import cramjam
import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from kts_resources.kafka import codecs
from kts_resources.kafka.codecs import CODEC_NAMES, GZIP, LZ4, NONE, SNAPPY, ZSTD, codec_id, compress, decompress
from kts_resources.kafka.errors import CodecError

COMPRESSED = (GZIP, SNAPPY, LZ4, ZSTD)
ALL = (NONE, *COMPRESSED)


def _records(n: int) -> bytes:
    """Something shaped like a batch body: many similar, not identical, small records."""
    rng = random.Random(n)
    return b"".join(
        b'{"order": %d, "customer": "c-%05d", "amount": %d.%02d, "status": "%s"}'
        % (i, rng.randrange(10_000), rng.randrange(1000), rng.randrange(100), rng.choice([b"new", b"paid", b"shipped"]))
        for i in range(n)
    )


SMALL = b"hello, kafka"
RECORDS = _records(1500)  # ~100 KB: several xerial and LZ4 blocks
LARGE = _records(24_000)  # ≥ 1 MiB
RANDOM = random.Random(7).randbytes((1 << 20) + 7)  # incompressible: stored LZ4 blocks, snappy literals
assert len(LARGE) >= 1 << 20

PAYLOADS = {
    "empty": b"",
    "one-byte": b"x",
    "small": SMALL,
    "xerial-block": b"k" * 32 * 1024,
    "xerial-block+1": b"k" * (32 * 1024 + 1),
    "lz4-block+1": RANDOM[: 64 * 1024 + 1],
    "records": RECORDS,
    "large-records": LARGE,
    "large-random": RANDOM,
}
CROSS_PAYLOADS = {k: PAYLOADS[k] for k in ("empty", "small", "xerial-block+1", "records", "large-records", "large-random")}


def name(codec: int) -> str:
    return CODEC_NAMES[codec]


# --- ids and names ----------------------------------------------------------------------------


def test_codec_ids_are_the_attribute_values_kafka_defines():
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)
    assert CODEC_NAMES == ("none", "gzip", "snappy", "lz4", "zstd")


@pytest.mark.parametrize("codec", ALL, ids=name)
def test_codec_id_maps_each_name_to_its_index(codec):
    assert codec_id(CODEC_NAMES[codec]) == codec


@pytest.mark.parametrize("bad", ["brotli", "", "GZIP", "lz4 "])
def test_codec_id_rejects_names_outside_the_contract(bad):
    with pytest.raises(ValueError, match="unknown compression codec"):
        codec_id(bad)


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
@pytest.mark.parametrize("codec", ALL, ids=name)
def test_round_trip_restores_the_input(codec, payload):
    compressed = compress(codec, payload)
    assert type(compressed) is bytes
    restored = decompress(codec, compressed)
    assert type(restored) is bytes
    assert restored == payload


@pytest.mark.parametrize("codec", ALL, ids=name)
def test_compressible_data_gets_smaller(codec):
    if codec == NONE:
        assert compress(codec, LARGE) == LARGE
    else:
        assert len(compress(codec, LARGE)) < len(LARGE) // 3


@pytest.mark.parametrize("codec", ALL, ids=name)
def test_decompress_reads_a_memoryview_slice_of_a_larger_buffer(codec):
    compressed = compress(codec, RECORDS)
    segment = b"\xaa" * 61 + compressed + b"\xbb" * 5  # as a batch body sits inside a .log file
    view = memoryview(segment)[61 : 61 + len(compressed)]
    assert decompress(codec, view) == RECORDS
    assert decompress(codec, memoryview(bytearray(segment))[61 : 61 + len(compressed)]) == RECORDS


@pytest.mark.parametrize("codec", ALL, ids=name)
def test_compress_reads_a_memoryview_slice(codec):
    buffer = b"\x00" * 10 + RECORDS + b"\x00" * 10
    assert decompress(codec, compress(codec, memoryview(buffer)[10:-10])) == RECORDS


LEVELS = [(GZIP, -1), (GZIP, 1), (GZIP, 9), (LZ4, 1), (LZ4, 9), (LZ4, 12), (LZ4, 17), (ZSTD, -5), (ZSTD, 1), (ZSTD, 3), (ZSTD, 19)]


@pytest.mark.parametrize("codec,level", LEVELS, ids=[f"{name(c)}-{lv}" for c, lv in LEVELS])
def test_round_trip_at_every_level_kafka_allows(codec, level):
    assert decompress(codec, compress(codec, RECORDS, level=level)) == RECORDS


def test_higher_levels_compress_at_least_as_well():
    assert len(compress(GZIP, RECORDS, level=9)) <= len(compress(GZIP, RECORDS, level=1))
    assert len(compress(LZ4, RECORDS, level=12)) < len(compress(LZ4, RECORDS))  # HC beats the fast compressor
    assert len(compress(ZSTD, RECORDS, level=19)) < len(compress(ZSTD, RECORDS, level=1))


BAD_LEVELS = [(GZIP, 0), (GZIP, 10), (LZ4, 0), (LZ4, 18), (ZSTD, 23), (ZSTD, -131073), (SNAPPY, 1), (NONE, 1)]


@pytest.mark.parametrize("codec,level", BAD_LEVELS, ids=[f"{name(c)}-{lv}" for c, lv in BAD_LEVELS])
def test_compress_rejects_levels_kafka_rejects(codec, level):
    with pytest.raises(ValueError):
        compress(codec, RECORDS, level=level)


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_compress_rejects_unknown_codec_ids(codec):
    with pytest.raises(ValueError, match="unknown compression codec"):
        compress(codec, RECORDS)


def test_decompress_is_safe_from_several_threads():
    jobs = [(codec, compress(codec, _records(200 + i)), _records(200 + i)) for i in range(8) for codec in COMPRESSED]

    def check(job):
        codec, compressed, expected = job
        return all(decompress(codec, compressed) == expected for _ in range(20))

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(check, jobs))


# --- what the writer produces -----------------------------------------------------------------


def test_gzip_output_is_one_gzip_member_with_no_timestamp():
    out = compress(GZIP, RECORDS)
    assert out[:3] == b"\x1f\x8b\x08"
    assert out[4:8] == b"\x00\x00\x00\x00"  # mtime 0: the same input always gives the same bytes
    assert gzip.decompress(out) == RECORDS
    assert compress(GZIP, RECORDS) == out


def _xerial_blocks(stream: bytes) -> list[bytes]:
    pos, blocks = 16, []
    while pos < len(stream):
        (length,) = struct.unpack_from(">i", stream, pos)
        blocks.append(stream[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == len(stream)
    return blocks


@pytest.mark.parametrize("payload", [b"", SMALL, b"k" * 32768, RECORDS, RANDOM], ids=["empty", "small", "one-block", "records", "random"])
def test_snappy_output_is_xerial_framing_with_32_KiB_blocks(payload):
    out = compress(SNAPPY, payload)
    assert out[:16] == b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01"
    blocks = [bytes(cramjam.snappy.decompress_raw(b)) for b in _xerial_blocks(out)]
    assert len(blocks) == -(-len(payload) // 32768)
    assert all(len(b) == 32768 for b in blocks[:-1])
    assert b"".join(blocks) == payload


def test_lz4_output_is_the_frame_kafka_writes():
    out = compress(LZ4, RECORDS)
    assert out[:4] == b"\x04\x22\x4d\x18"
    # FLG: version 1, independent blocks, no block checksum, no content size, no content checksum.
    assert out[4] == 0x60
    assert out[5] == 0x40  # BD: 64 KiB blocks
    assert out[6] == (codecs._xxh32_short(out[4:6]) >> 8) & 0xFF  # HC over the descriptor only
    assert out[-4:] == b"\x00\x00\x00\x00"  # end mark, no content checksum after it
    assert lz4.frame.decompress(out) == RECORDS


def test_lz4_stores_incompressible_blocks_uncompressed():
    out = compress(LZ4, RANDOM[:1000])
    (block,) = struct.unpack_from("<I", out, 7)
    assert block == 0x80000000 | 1000


def test_zstd_output_is_a_standard_frame_that_records_its_size():
    out = compress(ZSTD, RECORDS)
    assert out[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.frame_content_size(out) == len(RECORDS)
    assert zstandard.ZstdDecompressor().decompress(out) == RECORDS


# --- cross-checks with kafka-python -----------------------------------------------------------


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
def test_gzip_agrees_with_kafka_python(payload):
    assert decompress(GZIP, kafka_codec.gzip_encode(payload)) == payload
    assert decompress(GZIP, kafka_codec.gzip_encode(payload, compresslevel=1)) == payload
    assert kafka_codec.gzip_decode(compress(GZIP, payload)) == payload


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
def test_xerial_snappy_agrees_with_kafka_python(payload):
    theirs = kafka_codec.snappy_encode(payload, xerial_compatible=True)
    assert decompress(SNAPPY, theirs) == payload
    ours = compress(SNAPPY, payload)
    assert ours == theirs  # same framing, same block size, same raw snappy encoder underneath
    if payload:  # kafka-python sees only len > 16 as xerial, so it cannot read a header-only stream
        assert kafka_codec.snappy_decode(ours) == payload


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
def test_raw_snappy_from_kafka_python_decodes(payload):
    assert decompress(SNAPPY, kafka_codec.snappy_encode(payload, xerial_compatible=False)) == payload


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
def test_lz4_agrees_with_kafka_python(payload):
    theirs = kafka_codec.lz4_encode(payload)  # unlike Kafka, kafka-python stores the content size
    assert theirs[4] & 0x08 or not payload  # (liblz4 leaves out a size of 0)
    assert decompress(LZ4, theirs) == payload
    assert decompress(LZ4, theirs, magic=1) == payload
    assert kafka_codec.lz4_decode(compress(LZ4, payload)) == payload


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
def test_zstd_agrees_with_kafka_python(payload):
    assert decompress(ZSTD, kafka_codec.zstd_encode(payload)) == payload
    assert kafka_codec.zstd_decode(compress(ZSTD, payload)) == payload


class _XXHashShim:
    """Stands in for the xxhash package, which kafka-python's old-Kafka LZ4 functions need but
    which is not installed; backed by our XXH32 (checked against liblz4 below)."""

    class _Digest:
        def __init__(self, value: int):
            self.value = value

        def digest(self) -> bytes:
            return self.value.to_bytes(4, "big")

    @classmethod
    def xxh32(cls, data) -> "_XXHashShim._Digest":
        return cls._Digest(codecs._xxh32_short(bytes(data)))


@pytest.fixture
def old_kafka_lz4(monkeypatch):
    monkeypatch.setattr(kafka_codec, "xxhash", _XXHashShim)
    return kafka_codec


def _correct_hc(frame: bytes) -> int:
    hc_pos = 6 + (8 if frame[4] & 0x08 else 0)
    return (codecs._xxh32_short(frame[4:hc_pos]) >> 8) & 0xFF


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
@pytest.mark.parametrize("magic", [0, 1])
def test_lz4_frames_with_the_kafka_0_8_header_checksum_decode_for_legacy_magic(old_kafka_lz4, payload, magic):
    frame = old_kafka_lz4.lz4_encode_old_kafka(payload)
    assert frame[6] != _correct_hc(frame)  # really the broken checksum, over magic + descriptor
    assert decompress(LZ4, frame, magic=magic) == payload


def test_lz4_frames_with_the_kafka_0_8_header_checksum_are_rejected_for_magic_2(old_kafka_lz4):
    frame = old_kafka_lz4.lz4_encode_old_kafka(RECORDS)
    with pytest.raises(CodecError, match="lz4"):
        decompress(LZ4, frame, magic=2)


@pytest.mark.parametrize("payload", CROSS_PAYLOADS.values(), ids=CROSS_PAYLOADS.keys())
def test_our_lz4_frames_decode_with_kafka_pythons_old_kafka_decoder(old_kafka_lz4, payload):
    assert old_kafka_lz4.lz4_decode_old_kafka(compress(LZ4, payload)) == payload


def test_legacy_magic_also_accepts_a_correct_header_checksum():
    assert decompress(LZ4, compress(LZ4, RECORDS), magic=0) == RECORDS


def test_legacy_header_checksum_repair_finds_hc_after_a_content_size_field():
    frame = bytearray(lz4.frame.compress(RECORDS, store_size=True, block_linked=False))
    assert frame[4] & 0x08
    frame[14] = (codecs._xxh32_short(bytes(frame[0:14])) >> 8) & 0xFF  # the 0.8/0.9 rule
    assert frame[14] != _correct_hc(bytes(frame))
    assert decompress(LZ4, bytes(frame), magic=0) == RECORDS


def test_truncated_legacy_frame_with_broken_header_checksum_raises(old_kafka_lz4):
    frame = old_kafka_lz4.lz4_encode_old_kafka(RECORDS)
    with pytest.raises(CodecError, match="lz4"):
        decompress(LZ4, frame[:-3], magic=0)


@pytest.mark.parametrize(
    "data,expected",
    [(b"", 0x02CC5D05), (b"a", 0x550D7456), (b"abc", 0x32D153FF)],
)
def test_xxh32_matches_the_reference_vectors(data, expected):
    assert codecs._xxh32_short(data) == expected


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"store_size": True},
        {"block_size": lz4.frame.BLOCKSIZE_MAX4MB},
        {"content_checksum": True, "block_checksum": True},
        {"block_linked": True, "store_size": False},
    ],
)
def test_xxh32_reproduces_liblz4s_header_checksum(options):
    frame = lz4.frame.compress(SMALL, **options)
    assert frame[6 + (8 if frame[4] & 0x08 else 0)] == _correct_hc(frame)


# --- what the reader accepts beyond our writer ------------------------------------------------


def test_raw_unframed_snappy_decodes():
    for payload in (b"x", SMALL, RECORDS, LARGE):
        assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(payload))) == payload
    assert decompress(SNAPPY, b"\x00") == b""  # raw snappy of nothing


def test_xerial_streams_written_one_after_another_decode_as_one():
    stream = compress(SNAPPY, RECORDS[:50_000]) + compress(SNAPPY, RECORDS[50_000:])
    assert decompress(SNAPPY, stream) == RECORDS


def test_xerial_version_fields_are_not_checked():
    # Redpanda writes them little-endian; kafka-python and snappy-java's magic check ignore them.
    stream = bytearray(compress(SNAPPY, RECORDS))
    stream[8:16] = struct.pack("<ii", 1, 1)
    assert decompress(SNAPPY, bytes(stream)) == RECORDS


def test_header_only_xerial_stream_is_empty():
    assert decompress(SNAPPY, b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01") == b""


def test_gzip_members_back_to_back_decode_as_one():
    stream = gzip.compress(RECORDS[:1000]) + gzip.compress(RECORDS[1000:], compresslevel=1)
    assert decompress(GZIP, stream) == RECORDS


def test_gzip_ignores_trailing_bytes_that_start_no_member_as_java_does():
    assert decompress(GZIP, compress(GZIP, RECORDS) + b"\x00\x00\x00\x00") == RECORDS


def _zstd_jni_style(payload: bytes) -> bytes:
    """A frame written through a stream, so without a content size, as Kafka's Java client writes."""
    sink = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(sink, closefd=False) as writer:
        writer.write(payload)
    return sink.getvalue()


@pytest.mark.parametrize("payload", [SMALL, RECORDS, LARGE], ids=["small", "records", "large"])
def test_zstd_frames_without_a_content_size_decode(payload):
    frame = _zstd_jni_style(payload)
    assert zstandard.frame_content_size(frame) == -1
    assert decompress(ZSTD, frame) == payload
    assert decompress(ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(payload)) == payload


def test_zstd_frames_back_to_back_decode_as_one():
    for first in (compress(ZSTD, RECORDS[:1000]), _zstd_jni_style(RECORDS[:1000])):
        assert decompress(ZSTD, first + compress(ZSTD, RECORDS[1000:])) == RECORDS


def test_zstd_skippable_frames_are_skipped():
    skippable = struct.pack("<II", 0x184D2A50, 3) + b"xyz"
    assert decompress(ZSTD, skippable + compress(ZSTD, RECORDS)) == RECORDS


def test_frames_at_the_highest_possible_ratio_still_decode():
    zeros = bytes(4 << 20)
    for block_size in (lz4.frame.BLOCKSIZE_MAX64KB, lz4.frame.BLOCKSIZE_MAX4MB):
        frame = lz4.frame.compress(zeros, store_size=True, block_size=block_size, block_linked=False)
        assert decompress(LZ4, frame) == zeros
    assert decompress(ZSTD, compress(ZSTD, zeros)) == zeros  # ~30000x: decoded as a stream
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(zeros))) == zeros
    assert decompress(GZIP, compress(GZIP, zeros, level=9)) == zeros


def test_lz4_ignores_bytes_after_the_end_mark_as_kafka_does():
    assert decompress(LZ4, compress(LZ4, RECORDS) + b"junk") == RECORDS


def test_none_returns_the_bytes_unchanged():
    assert decompress(NONE, memoryview(RECORDS)) == RECORDS
    assert decompress(NONE, b"") == b""


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [5, 6, 7, -1, 8])
def test_decompress_raises_codec_error_for_unknown_codec_ids(codec):
    with pytest.raises(CodecError, match="unknown compression codec"):
        decompress(codec, b"anything")


@pytest.mark.parametrize("codec", COMPRESSED, ids=name)
def test_empty_input_raises_codec_error(codec):
    with pytest.raises(CodecError, match=f"^{name(codec)}: "):
        decompress(codec, b"")


@pytest.mark.parametrize(
    "garbage", [b"\x07", b"this is not compressed data at all", bytes(range(256)) * 4], ids=["one-byte", "text", "byte-ramp"]
)
@pytest.mark.parametrize("codec", COMPRESSED, ids=name)
def test_bytes_that_are_not_compressed_data_raise_codec_error(codec, garbage):
    with pytest.raises(CodecError, match=f"^{name(codec)}: "):
        decompress(codec, garbage)


@pytest.mark.parametrize("payload", [RECORDS, RANDOM[:100_000]], ids=["records", "random"])
@pytest.mark.parametrize("codec", COMPRESSED, ids=name)
def test_truncated_input_raises_codec_error(codec, payload):
    compressed = compress(codec, payload)
    for cut in (1, 3, 7, 12, len(compressed) // 2, len(compressed) - 5, len(compressed) - 1):
        with pytest.raises(CodecError, match=f"^{name(codec)}: "):
            decompress(codec, compressed[:cut])


@pytest.mark.parametrize("codec", COMPRESSED, ids=name)
def test_codec_error_names_no_file_or_position_the_caller_adds_them(codec):
    with pytest.raises(CodecError) as caught:
        decompress(codec, b"\x01\x02\x03\x04\x05\x06\x07\x08\x09")
    assert caught.value.path is None and caught.value.position is None
    assert "at.log: byte 61" in str(caught.value.located("at.log", 61))


def _patched(data: bytes, pos: int, new: bytes) -> bytes:
    return data[:pos] + new + data[pos + len(new) :]


_GZ = compress(GZIP, RECORDS)
_XERIAL = compress(SNAPPY, RECORDS)
_RAW_SNAPPY = bytes(cramjam.snappy.compress_raw(RECORDS))
_LZ4 = compress(LZ4, RECORDS)
_ZST = compress(ZSTD, RECORDS)
_ZST_SIZED = compress(ZSTD, b"a" * 100_000)

CORRUPTIONS = {
    "gzip-bad-magic": (GZIP, _patched(_GZ, 0, b"\x1f\x8c")),
    "gzip-bad-method": (GZIP, _patched(_GZ, 2, b"\x07")),
    "gzip-crc-mismatch": (GZIP, _patched(_GZ, len(_GZ) - 8, bytes(b ^ 0xFF for b in _GZ[-8:-4]))),
    "gzip-size-mismatch": (GZIP, _patched(_GZ, len(_GZ) - 4, b"\x00\x00\x00\x00")),
    "gzip-damaged-deflate": (GZIP, _patched(_GZ, 10, b"\xff\xff\xff")),
    "snappy-block-longer-than-stream": (SNAPPY, _patched(_XERIAL, 16, b"\x7f\xff\xff\xff")),
    "snappy-negative-block-length": (SNAPPY, _patched(_XERIAL, 16, b"\xff\xff\xff\xf0")),
    "snappy-bad-length-varint": (SNAPPY, b"\xff\xff\xff\xff\xff\xff\xff"),
    "snappy-back-reference-before-start": (SNAPPY, b"\x05\x01\x00"),
    "snappy-declares-4-GiB": (SNAPPY, b"\xff\xff\xff\xff\x0f\x00"),
    "snappy-xerial-declares-4-GiB": (SNAPPY, _XERIAL[:16] + b"\x00\x00\x00\x06\xff\xff\xff\xff\x0f\x00"),
    "snappy-raw-length-mismatch": (SNAPPY, _patched(_RAW_SNAPPY, 0, b"\x81")),
    "lz4-bad-magic": (LZ4, _patched(_LZ4, 0, b"\x05")),
    "lz4-bad-header-checksum": (LZ4, _patched(_LZ4, 6, bytes([_LZ4[6] ^ 1]))),
    "lz4-bad-version": (LZ4, _patched(_LZ4, 4, b"\xa0")),
    "lz4-block-longer-than-max": (LZ4, _patched(_LZ4, 7, struct.pack("<I", 0x7FFFFFFF))),
    "lz4-declares-1-TiB": (LZ4, lz4.frame.compress(RECORDS, store_size=True)[:6] + struct.pack("<Q", 1 << 40) + b"\x00"),
    "zstd-bad-magic": (ZSTD, _patched(_ZST, 0, b"\x29")),
    "zstd-reserved-bit": (ZSTD, _patched(_ZST, 4, bytes([_ZST[4] | 0x08]))),
    "zstd-damaged-block": (ZSTD, _patched(_ZST, 20, b"\xff" * 8)),
    "zstd-declares-4-GiB": (ZSTD, _patched(_ZST_SIZED, 5, b"\xf0\xff\xff\xff")),
}


@pytest.mark.parametrize("codec,data", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_input_raises_codec_error(codec, data):
    with pytest.raises(CodecError, match=f"^{name(codec)}: "):
        decompress(codec, data)


@pytest.mark.parametrize("magic", [0, 2])
@pytest.mark.parametrize("codec", COMPRESSED, ids=name)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_codec_error_only(codec, magic, data):
    try:
        assert type(decompress(codec, data, magic=magic)) is bytes
    except CodecError:
        pass


@pytest.mark.parametrize("codec", COMPRESSED, ids=name)
@settings(max_examples=150, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4), cut=st.integers(0, 64))
def test_damaged_streams_decode_or_raise_codec_error_only(codec, edits, cut):
    data = bytearray(compress(codec, RECORDS[:5000]))
    for pos, value in edits:
        data[pos % len(data)] = value
    del data[len(data) - cut :]
    for magic in (0, 2):
        try:
            assert type(decompress(codec, bytes(data), magic=magic)) is bytes
        except CodecError:
            pass
