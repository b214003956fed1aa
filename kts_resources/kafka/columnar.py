"""Magic-2 batches decoded straight into columns (numpy and Arrow), for readers that want a
table rather than record objects: ``read_tiered``'s executors.

:func:`records.decode_batch` makes a ``Record`` per record, walking every varint in Python; that
is most of what a Spark read task costs. Here only the records' lengths are walked in Python (one
varint each: that is what finds where the next record starts). Every other field is read for all
records of all batches at once, field by field, with numpy: the attributes byte, the timestamp and
offset deltas, the key and value lengths, the header count and, one header index at a time, the
headers. Keys, values and header values are cut out of the decompressed bodies by Arrow (no
Python bytes per record).

The same layout rules as the record decoder, which stays the reference: whatever this path does
not take as plainly well-formed — a field running past its record, bytes left over, a varint
using its last allowed byte, a null header key, a header key that is not UTF-8 — sends the whole
call back to :func:`records.decode_batch`, which decodes it or raises the located
``CorruptRecordError`` it always did. So both paths give the same records or the same error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kts_resources.kafka import codecs
from kts_resources.kafka.records import (
    LOG_APPEND_TIME,
    V2_HEADER_SIZE,
    BatchHeader,
    CorruptRecordError,
    decode_batch,
    decode_varint,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


@dataclass
class RecordColumns:
    """The records of some batches, one entry per record in offset order within each batch."""

    offset: "np.ndarray"  # int64
    timestamp: "np.ndarray"  # int64
    timestamp_type: "np.ndarray"  # int32
    leader_epoch: "np.ndarray"  # int32
    key: "pa.Array"  # binary, null for a null key
    value: "pa.Array"  # binary
    headers: "pa.Array"  # list<struct<key: string, value: binary>>

    def __len__(self) -> int:
        return len(self.offset)


def header_type() -> "pa.DataType":
    """The headers column's type: list<struct<key: string not null, value: binary>>, as
    ``read_tiered``'s schema has it."""
    import pyarrow as pa

    return pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))


class _NotPlain(Exception):
    """Something the vectorised path leaves to the reference decoder."""


def decode_columns(batches: Sequence[tuple[BatchHeader, "bytes | memoryview"]]) -> RecordColumns:
    """The records of ``batches`` — (header, the buffer ``header.position`` points into), CRCs
    already checked — as columns. Raises ``CorruptRecordError`` (located at the batch) as
    :func:`records.decode_batch` does. Magic 0/1 messages go through the record decoder."""
    if any(h.magic != 2 for h, _ in batches):
        return _decode_reference(batches)  # magic 0/1 messages: rare, and laid out otherwise
    try:
        return _decode_plain(batches)
    except _NotPlain:
        return _decode_reference(batches)


def _bodies(batches: Sequence[tuple[BatchHeader, "bytes | memoryview"]]) -> list:
    out = []
    for h, buffer in batches:
        body = memoryview(buffer)[h.position + V2_HEADER_SIZE : h.position + h.size]
        if h.codec != codecs.NONE:
            try:
                body = codecs.decompress(h.codec, body, magic=2)
            except codecs.CodecError:
                raise _NotPlain from None  # the reference raises it, after any earlier batch's error
        out.append(body)
    return out


def _record_starts(buf: bytes, batches, bodies) -> tuple[list[int], list[int]]:
    """Where each record's fields start (after its length) and how long it is, walking the
    lengths: the one sequential step (a record's start is known once the one before is read)."""
    starts: list[int] = []
    lengths: list[int] = []
    add_start, add_length = starts.append, lengths.append
    pos = 0
    try:
        for (h, _), body in zip(batches, bodies):
            end = pos + len(body)
            for _ in range(h.record_count):
                b = buf[pos]
                if b < 0x80:
                    length = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    c = buf[pos + 1]
                    if c < 0x80:  # records of 64 B to 8 KiB
                        raw = (b & 0x7F) | (c << 7)
                        length = (raw >> 1) ^ -(raw & 1)
                        pos += 2
                    else:
                        length, pos = decode_varint(buf, pos, 5)
                if length < 0:  # not one step back: a forged record count would walk for ever
                    raise _NotPlain
                add_start(pos)
                add_length(length)
                pos += length
            # The records lie within the batch exactly when the last one ends where its body does.
            if pos != end:
                raise _NotPlain
    except (IndexError, CorruptRecordError):
        raise _NotPlain from None
    return starts, lengths


def _varints(data: "np.ndarray", pos: "np.ndarray", max_bytes: int) -> tuple["np.ndarray", "np.ndarray"]:
    """Zigzag varints at ``pos``: (values as int64, their sizes). A varint that would use its last
    allowed byte (where Kafka drops high bits) is left to the reference decoder."""
    import numpy as np

    last = len(data) - 1
    if last < 0:
        raise _NotPlain
    b = data[np.minimum(pos, last)].astype(np.uint64)
    more = b >= 0x80
    if not more.any():  # the common case: one byte each
        size = np.ones(len(pos), np.int64)
        value = b
    else:
        value = b & np.uint64(0x7F)
        size = np.ones(len(pos), np.int64)
        for k in range(1, max_bytes - 1):
            b = data[np.minimum(pos + k, last)].astype(np.uint64)
            value |= np.where(more, (b & np.uint64(0x7F)) << np.uint64(7 * k), np.uint64(0))
            size += more
            more &= b >= 0x80
            if not more.any():
                break
        else:
            raise _NotPlain
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -((value & np.uint64(1)).astype(np.int64))
    return signed, size


def _binary(buf: "pa.Buffer", starts: "np.ndarray", lengths: "np.ndarray", valid: "np.ndarray | None") -> "pa.Array":
    """A binary array of the slices ``[starts, starts + lengths)`` of ``buf``, which follow one
    another in order: the slices and the gaps between them as one array over ``buf``, then every
    other element taken (Arrow copies the slices into a compact array)."""
    import numpy as np
    import pyarrow as pa

    n = len(starts)
    if n == 0:
        return pa.array([], type=pa.binary())
    edges = np.empty(2 * n, np.int64)
    edges[0::2] = starts
    edges[1::2] = starts + lengths
    spread = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(edges), buf])
    taken = spread.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64))).cast(pa.binary())
    if taken.offset:
        taken = pa.concat_arrays([taken])  # buffers that start at the first element, as the bitmap does
    if valid is None or valid.all():
        return taken
    bitmap = pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, *taken.buffers()[1:]], offset=taken.offset)


def _decode_plain(batches) -> RecordColumns:
    import numpy as np
    import pyarrow as pa

    bodies = _bodies(batches)
    buf = b"".join(bodies)
    starts_list, lengths_list = _record_starts(buf, batches, bodies)
    counts = np.fromiter((h.record_count for h, _ in batches), np.int64, len(batches))
    data = np.frombuffer(buf, np.uint8)
    start = np.array(starts_list, np.int64)
    length = np.array(lengths_list, np.int64)
    record_end = start + length

    def varint(pos, max_bytes):
        value, size = _varints(data, pos, max_bytes)
        if (pos + size > record_end).any():
            raise _NotPlain
        return value, pos + size

    pos = start + 1  # the record's attributes byte: unused
    ts_delta, pos = varint(pos, 10)
    offset_delta, pos = varint(pos, 5)
    key_length, pos = varint(pos, 5)
    key_start, key_valid = pos, key_length >= 0
    pos = pos + np.maximum(key_length, 0)
    value_length, pos = varint(pos, 5)
    value_start, value_valid = pos, value_length >= 0
    pos = pos + np.maximum(value_length, 0)
    header_count, pos = varint(pos, 5)
    if (header_count < 0).any():
        raise _NotPlain

    # Headers, one index at a time over the records that have that many.
    hk_start, hk_len, hv_start, hv_len, hv_valid, h_record, h_index = [], [], [], [], [], [], []
    most = int(header_count.max()) if len(header_count) else 0
    for j in range(most):
        rows = np.nonzero(header_count > j)[0]
        p = pos[rows]
        ends = record_end[rows]
        hk, size = _varints(data, p, 5)
        p = p + size
        if (hk < 0).any() or (p + hk > ends).any():
            raise _NotPlain  # a null header key is corrupt; the reference says so
        hk_start.append(p)
        hk_len.append(hk)
        p = p + hk
        hv, size = _varints(data, p, 5)
        p = p + size
        hv_start.append(p)
        hv_len.append(np.maximum(hv, 0))
        hv_valid.append(hv >= 0)
        p = p + np.maximum(hv, 0)
        if (p > ends).any():
            raise _NotPlain
        pos[rows] = p
        h_record.append(rows)
        h_index.append(np.full(len(rows), j, np.int64))
    if (pos != record_end).any():
        raise _NotPlain

    per_batch = np.repeat(np.arange(len(batches)), counts)
    headers_ = [h for h, _ in batches]
    base_offset = np.fromiter((h.base_offset for h in headers_), np.int64, len(headers_))
    log_append = np.fromiter((h.timestamp_type == LOG_APPEND_TIME for h in headers_), bool, len(headers_))
    base_ts = np.fromiter((h.max_timestamp if h.timestamp_type == LOG_APPEND_TIME else h.base_timestamp for h in headers_),
                          np.int64, len(headers_))
    offset = base_offset[per_batch] + offset_delta
    timestamp = base_ts[per_batch] + np.where(log_append[per_batch], 0, ts_delta)
    timestamp_type = np.fromiter((h.timestamp_type for h in headers_), np.int32, len(headers_))[per_batch]
    leader_epoch = np.fromiter((h.partition_leader_epoch for h in headers_), np.int32, len(headers_))[per_batch]

    arrow_buf = pa.py_buffer(buf)
    key = _binary(arrow_buf, key_start, np.maximum(key_length, 0), key_valid)
    value = _binary(arrow_buf, value_start, np.maximum(value_length, 0), value_valid)
    headers = _headers(arrow_buf, header_count, hk_start, hk_len, hv_start, hv_len, hv_valid, h_record, h_index)
    return RecordColumns(offset, timestamp, timestamp_type, leader_epoch, key, value, headers)


def _headers(buf, header_count, hk_start, hk_len, hv_start, hv_len, hv_valid, h_record, h_index) -> "pa.Array":
    import numpy as np
    import pyarrow as pa

    list_offsets = np.zeros(len(header_count) + 1, np.int32)
    np.cumsum(header_count, out=list_offsets[1:])
    item_type = header_type().value_type
    if not hk_start:
        items = pa.StructArray.from_arrays([pa.array([], pa.string()), pa.array([], pa.binary())], fields=list(item_type))
    else:
        # Collected header index by header index: put them in record order (each record's in turn).
        order = np.lexsort((np.concatenate(h_index), np.concatenate(h_record)))
        keys = _binary(buf, np.concatenate(hk_start)[order], np.concatenate(hk_len)[order], None)
        try:
            keys = keys.cast(pa.string())
        except pa.ArrowInvalid:
            raise _NotPlain from None  # not UTF-8: the reference decodes it with replacement, as Kafka's client does
        values = _binary(buf, np.concatenate(hv_start)[order], np.concatenate(hv_len)[order], np.concatenate(hv_valid)[order])
        items = pa.StructArray.from_arrays([keys, values], fields=list(item_type))
    return pa.ListArray.from_arrays(pa.array(list_offsets), items).cast(header_type())


def _decode_reference(batches) -> RecordColumns:
    """The record decoder's answer, as columns (or its CorruptRecordError)."""
    import numpy as np
    import pyarrow as pa

    offsets, timestamps, types, epochs, keys, values, headers = [], [], [], [], [], [], []
    for h, buffer in batches:
        records = decode_batch(buffer, h, verify_crc=False)
        offsets += [r.offset for r in records]
        timestamps += [r.timestamp for r in records]
        types += [h.timestamp_type] * len(records)
        epochs += [h.partition_leader_epoch] * len(records)
        keys += [r.key for r in records]
        values += [r.value for r in records]
        headers += [[{"key": k, "value": v} for k, v in r.headers] for r in records]
    return RecordColumns(np.array(offsets, np.int64), np.array(timestamps, np.int64), np.array(types, np.int32),
                         np.array(epochs, np.int32), pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                         pa.array(headers, header_type()))

