"""Kafka's compression codecs: the bytes Kafka's Java client writes, and everything Kafka reads.

The codec id is the low three bits of a batch's (or legacy wrapper message's) attributes:
0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. Pure functions, no I/O, safe to call from several threads.

What each codec writes and reads:

- gzip: one gzip member, as ``GZIPOutputStream`` writes. Reading accepts members back to back and,
  like Java's ``GZIPInputStream``, ignores trailing bytes that do not start another member.
- snappy: snappy-java's (xerial) ``SnappyOutputStream`` framing: a 16-byte header, then blocks of
  big-endian int32 length + raw snappy, 32 KiB uncompressed per block. Reading also accepts raw
  unframed snappy (librdkafka, Sarama and others write that) and xerial streams concatenated.
- lz4: one LZ4 frame as ``Lz4BlockOutputStream`` writes: independent 64 KiB blocks, no content
  size, no checksums. For magic 0/1 the frame descriptor checksum is not trusted, because Kafka
  0.8/0.9 computed it over the wrong bytes.
- zstd: a standard zstd frame. Reading accepts frames without a content size (what zstd-jni's
  streaming writer produces) and several frames back to back.

``decompress`` raises :class:`CodecError` for every problem with the data (without a file or
position; the caller adds those). ``compress`` raises ``ValueError`` for a bad codec or level,
since those come from the caller, not from a file.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import Callable

import cramjam
import lz4.frame
import zstandard

from .errors import CodecError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4

# Index = codec id. These strings appear in JSON output and configs: never rename them.
CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")

# Kafka's compression.<codec>.level bounds (KIP-390) and the level used when none is given.
_GZIP_LEVELS = range(1, 10)  # plus -1, Deflater.DEFAULT_COMPRESSION (= 6), Kafka's default
_LZ4_LEVELS = range(1, 18)
_LZ4_KAFKA_DEFAULT_LEVEL = 9
_ZSTD_LEVELS = range(-131072, 23)
_ZSTD_DEFAULT_LEVEL = 3
_ZSTD_PREALLOCATE_RATIO = 256

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip container, not zlib or raw deflate
_GZIP_MAGIC = b"\x1f\x8b"

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # format version 1, min compatible 1
_XERIAL_HEADER_SIZE = len(_XERIAL_HEADER)
_XERIAL_BLOCK_SIZE = 32 * 1024
_XERIAL_MAX_BLOCK = cramjam.snappy.compress_raw_max_len(bytes(_XERIAL_BLOCK_SIZE))
_BE_INT32 = struct.Struct(">i")
# A snappy element can expand at most 3 input bytes into 64 output bytes, so a block declaring
# more than this many bytes per input byte is corrupt. Checking first avoids allocating up to
# 4 GiB for a damaged length varint.
_SNAPPY_MAX_RATIO = 22

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_DICT_ID = 0x01
_LZ4_MAX_RATIO = 256  # an LZ4 sequence turns one extra length byte into at most 255 output bytes

_local = threading.local()  # zstd contexts are not thread-safe: one per thread, reused


def codec_id(name: str) -> int:
    """The codec id for a name in :data:`CODEC_NAMES` (``"gzip"`` -> 1)."""
    try:
        return CODEC_NAMES.index(name)
    except ValueError:
        raise ValueError(f"unknown compression codec {name!r}; expected one of {', '.join(CODEC_NAMES)}") from None


def compress(codec: int, data: bytes | bytearray | memoryview, *, level: int | None = None) -> bytes:
    """Compress ``data`` as Kafka's Java producer would for ``codec``.

    ``level`` follows Kafka's ``compression.<codec>.level``: gzip 1–9 (or -1, Kafka's default,
    meaning 6), lz4 1–17 (default 9), zstd -131072–22 (default 3); none and snappy take no level.
    """
    if not isinstance(codec, int) or not NONE <= codec <= ZSTD:
        raise ValueError(f"unknown compression codec {codec!r}")
    return _COMPRESSORS[codec](data, level)


def decompress(codec: int, data: bytes | bytearray | memoryview, *, magic: int = 2) -> bytes:
    """Decompress the records block of a batch (``magic`` 2) or the value of a legacy wrapper
    message (``magic`` 0 or 1; only lz4 reads differently for those).

    Raises :class:`CodecError` if the codec id is not 0-4 or the data does not decode.
    """
    if not isinstance(codec, int) or not NONE <= codec <= ZSTD:
        raise CodecError(f"unknown compression codec {codec!r} (Kafka defines 0-4)")
    if codec != NONE and not len(data):
        raise CodecError(f"{CODEC_NAMES[codec]}: no compressed data")
    return _DECOMPRESSORS[codec](data, magic)


# --- none -------------------------------------------------------------------------------------


def _none_compress(data, level):
    if level is not None:
        raise ValueError("codec none takes no compression level")
    return bytes(data)


def _none_decompress(data, magic):
    return bytes(data)


# --- gzip -------------------------------------------------------------------------------------


def _gzip_compress(data, level):
    if level is None or level == -1:
        level = zlib.Z_DEFAULT_COMPRESSION
    elif level not in _GZIP_LEVELS:
        raise ValueError(f"gzip compression level must be 1-9 or -1, not {level!r}")
    return zlib.compress(data, level, wbits=_GZIP_WBITS)


def _gzip_decompress(data, magic):
    parts = []
    rest = data
    while True:
        # A fresh object per member: zlib has no reset, and creating one is cheap.
        d = zlib.decompressobj(_GZIP_WBITS)
        try:
            parts.append(d.decompress(rest))
        except zlib.error as e:
            raise CodecError(f"gzip: corrupt data ({e})") from None
        if not d.eof:
            raise CodecError("gzip: stream is truncated (no end of member)")
        rest = d.unused_data
        if rest[:2] != _GZIP_MAGIC:
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


# --- snappy -----------------------------------------------------------------------------------


def _snappy_compress(data, level):
    if level is not None:
        raise ValueError("snappy takes no compression level")
    view = memoryview(data)
    size = len(view)
    blocks = -(-size // _XERIAL_BLOCK_SIZE)
    # Compress every block straight into one buffer sized for the worst case: no per-block
    # objects, and a single copy at the end.
    out = bytearray(_XERIAL_HEADER_SIZE + blocks * (4 + _XERIAL_MAX_BLOCK))
    out[:_XERIAL_HEADER_SIZE] = _XERIAL_HEADER
    out_view = memoryview(out)
    pos = _XERIAL_HEADER_SIZE
    for start in range(0, size, _XERIAL_BLOCK_SIZE):
        written = cramjam.snappy.compress_raw_into(view[start : start + _XERIAL_BLOCK_SIZE], out_view[pos + 4 :])
        _BE_INT32.pack_into(out, pos, written)
        pos += 4 + written
    result = bytes(out_view[:pos])
    out_view.release()
    return result


def _snappy_reason(e: Exception) -> str:
    return str(e).removeprefix("snappy: ")


def _snappy_raw_length(block, at: int) -> int:
    """The uncompressed length a raw snappy block declares, checked against what it could hold."""
    try:
        length = cramjam.snappy.decompress_raw_len(block)
    except Exception as e:
        raise CodecError(f"snappy: corrupt block at byte {at} ({_snappy_reason(e)})") from None
    if length > _SNAPPY_MAX_RATIO * len(block):
        raise CodecError(f"snappy: block at byte {at} declares {length} bytes, more than {len(block)} compressed bytes can hold")
    return length


def _snappy_decompress(data, magic):
    view = memoryview(data)
    # The xerial magic cannot start a valid raw block (its length varint would be followed by a
    # back-reference into empty output), so the header alone tells the two apart. The version
    # fields after it are ignored: some writers (Redpanda) store them little-endian.
    if len(view) >= _XERIAL_HEADER_SIZE and view[:8] == _XERIAL_MAGIC:
        return _xerial_decompress(view)
    _snappy_raw_length(view, 0)
    try:
        return bytes(cramjam.snappy.decompress_raw(view))
    except Exception as e:
        raise CodecError(f"snappy: corrupt data ({_snappy_reason(e)})") from None


def _xerial_decompress(view: memoryview) -> bytes:
    size = len(view)
    blocks = []
    total = 0
    pos = _XERIAL_HEADER_SIZE
    # First pass: find the blocks and their lengths so the output can be allocated once.
    while pos < size:
        if size - pos < 4:
            raise CodecError(f"snappy: truncated block length at byte {pos}")
        length = _BE_INT32.unpack_from(view, pos)[0]
        if length < 0:
            # snappy-java reads streams written one after the other, headers included.
            if size - pos >= _XERIAL_HEADER_SIZE and view[pos : pos + 8] == _XERIAL_MAGIC:
                pos += _XERIAL_HEADER_SIZE
                continue
            raise CodecError(f"snappy: negative block length {length} at byte {pos}")
        start = pos + 4
        end = start + length
        if end > size:
            raise CodecError(f"snappy: block at byte {pos} declares {length} bytes but only {size - start} remain")
        block = view[start:end]
        uncompressed = _snappy_raw_length(block, start)
        blocks.append((block, start, uncompressed))
        total += uncompressed
        pos = end
    out = bytearray(total)
    out_view = memoryview(out)
    filled = 0
    for block, start, uncompressed in blocks:
        try:
            written = cramjam.snappy.decompress_raw_into(block, out_view[filled : filled + uncompressed])
        except Exception as e:
            raise CodecError(f"snappy: corrupt block at byte {start} ({_snappy_reason(e)})") from None
        if written != uncompressed:
            raise CodecError(f"snappy: block at byte {start} decodes to {written} bytes, not the {uncompressed} it declares")
        filled += uncompressed
    out_view.release()
    return bytes(out)


# --- lz4 --------------------------------------------------------------------------------------


def _lz4_compress(data, level):
    if level is None or level == _LZ4_KAFKA_DEFAULT_LEVEL:
        # Kafka uses lz4-java's fast compressor for its default level, the HC one otherwise.
        lib_level = lz4.frame.COMPRESSIONLEVEL_MIN
    elif level in _LZ4_LEVELS:
        lib_level = level
    else:
        raise ValueError(f"lz4 compression level must be 1-17, not {level!r}")
    return lz4.frame.compress(
        data,
        compression_level=lib_level,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,  # Kafka's reader rejects dependent blocks
        content_checksum=False,
        block_checksum=False,
        store_size=False,
    )


def _lz4_decompress(data, magic):
    view = memoryview(data)
    # Frame descriptor: magic, FLG, BD, [content size 8], [dictionary id 4], HC.
    if len(view) >= 7 and view[:4] == _LZ4_MAGIC:
        flg = view[4]
        hc_pos = 6
        if flg & _LZ4_FLG_CONTENT_SIZE:
            hc_pos += 8
            # liblz4 allocates whatever a frame declares; no valid frame expands past ~255x.
            declared = int.from_bytes(view[6:14], "little")
            if declared > _LZ4_MAX_RATIO * len(view):
                raise CodecError(f"lz4: frame declares {declared} bytes, more than {len(view)} compressed bytes can hold")
        if flg & _LZ4_FLG_DICT_ID:
            hc_pos += 4
        if magic < 2 and len(view) > hc_pos:
            hc = (_xxh32_short(bytes(view[4:hc_pos])) >> 8) & 0xFF
            if view[hc_pos] != hc:
                return _lz4_decompress_repaired(view, hc_pos, hc)
    try:
        # Bytes after the end mark are ignored, as Kafka's Lz4BlockInputStream ignores them.
        return lz4.frame.decompress(view)
    except Exception as e:
        raise CodecError(f"lz4: {e}") from None


def _lz4_decompress_repaired(view: memoryview, hc_pos: int, hc: int) -> bytes:
    """Decode a legacy frame whose descriptor checksum (HC) byte is wrong, using ``hc`` instead.

    Kafka 0.8/0.9 hashed the 4 magic bytes into HC too, and Kafka ignores HC for legacy messages;
    liblz4 always checks it. The repaired header is fed first and then the untouched rest, so the
    frame is not copied.
    """
    d = lz4.frame.LZ4FrameDecompressor()
    try:
        d.decompress(bytes(view[:hc_pos]) + bytes((hc,)))
        out = d.decompress(view[hc_pos + 1 :])
    except Exception as e:
        raise CodecError(f"lz4: {e}") from None
    if not d.eof:
        raise CodecError("lz4: frame is truncated (no end mark)")
    return out


_XXH_P1, _XXH_P2, _XXH_P3, _XXH_P4, _XXH_P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_U32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _U32


def _xxh32_short(data: bytes, seed: int = 0) -> int:
    """XXH32 of fewer than 16 bytes, all an LZ4 frame descriptor can be (at most 14).

    Only the short-input path of the algorithm is needed, so the 16-byte stripe loop is left out;
    the xxhash package is not a dependency just for one byte of header checksum.
    """
    n = len(data)
    if n >= 16:
        raise ValueError("_xxh32_short hashes fewer than 16 bytes")
    h = (seed + _XXH_P5 + n) & _U32
    i = 0
    while i + 4 <= n:
        lane = int.from_bytes(data[i : i + 4], "little")
        h = (_rotl32((h + lane * _XXH_P3) & _U32, 17) * _XXH_P4) & _U32
        i += 4
    for byte in data[i:]:
        h = (_rotl32((h + byte * _XXH_P5) & _U32, 11) * _XXH_P1) & _U32
    h ^= h >> 15
    h = (h * _XXH_P2) & _U32
    h ^= h >> 13
    h = (h * _XXH_P3) & _U32
    h ^= h >> 16
    return h


# --- zstd -------------------------------------------------------------------------------------


def _zstd_compress(data, level):
    if level is None:
        level = _ZSTD_DEFAULT_LEVEL
    elif level not in _ZSTD_LEVELS:
        raise ValueError(f"zstd compression level must be -131072-22, not {level!r}")
    compressors = getattr(_local, "zstd_compressors", None)
    if compressors is None:
        compressors = _local.zstd_compressors = {}
    cctx = compressors.get(level)
    if cctx is None:
        # Unlike zstd-jni's stream, the content size is written: it lets readers allocate once.
        cctx = compressors[level] = zstandard.ZstdCompressor(level=level)
    return cctx.compress(data)


def _zstd_decompress(data, magic):
    dctx = getattr(_local, "zstd_decompressor", None)
    if dctx is None:
        dctx = _local.zstd_decompressor = zstandard.ZstdDecompressor()
    try:
        content_size = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        content_size = -1  # not a frame we can size: the streaming path reports what is wrong
    if 0 < content_size <= _ZSTD_PREALLOCATE_RATIO * len(data):
        # One frame with its size known (our writer, kafka-python): decode into a single buffer.
        # Anything else, including a second frame after it, fails here and is retried below.
        # A larger declared size may be a damaged header, so that is left to the streaming
        # path, which allocates only as output is actually produced.
        try:
            return dctx.decompress(data, allow_extra_data=False)
        except zstandard.ZstdError:
            pass
    # Frames without a content size, as zstd-jni (Kafka's Java client) writes, or several frames.
    parts = []
    rest = data
    while True:
        dobj = dctx.decompressobj()
        try:
            parts.append(dobj.decompress(rest))
        except zstandard.ZstdError as e:
            raise CodecError(f"zstd: corrupt frame at byte {len(data) - len(rest)} ({_zstd_reason(e)})") from None
        if not dobj.eof:
            raise CodecError("zstd: frame is truncated")
        rest = dobj.unused_data
        if not rest:
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _zstd_reason(e: Exception) -> str:
    return str(e).removeprefix("zstd decompressor error: ")


# Indexed by codec id: one tuple lookup per call on the hot path.
_COMPRESSORS: tuple[Callable[..., bytes], ...] = (
    _none_compress,
    _gzip_compress,
    _snappy_compress,
    _lz4_compress,
    _zstd_compress,
)
_DECOMPRESSORS: tuple[Callable[..., bytes], ...] = (
    _none_decompress,
    _gzip_decompress,
    _snappy_decompress,
    _lz4_decompress,
    _zstd_decompress,
)
