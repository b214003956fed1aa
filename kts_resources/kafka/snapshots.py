"""Producer state snapshots (``<offset>.snapshot``) and aborted-transaction indexes (``.txnindex``).

Both travel with a tiered segment. Big-endian, pure: bytes in, values out; the file helpers only
touch the path they are handed.

Producer snapshot (``ProducerStateManager``, schema ``ProducerSnapshot`` v1)::

    version int16 (1) | crc uint32 | count int32 | count × 46-byte entries

The CRC is CRC-32C of bytes [6, end): the count and the entries, not the version.

Transaction index (``TransactionIndex`` / ``AbortedTxn``): back-to-back 34-byte entries
``version int16 (0), producerId int64, firstOffset int64, lastOffset int64, lastStableOffset int64``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterable

from kts_resources.kafka.crc import crc32c

from .checkpoints import write_atomically
from .errors import CheckpointError, IndexFormatError
from .files import read_whole

# --- producer snapshots -------------------------------------------------------------------------

PRODUCER_SNAPSHOT_VERSION = 1
NO_TXN_FIRST_OFFSET = -1  # currentTxnFirstOffset when the producer has no ongoing transaction

_SNAPSHOT_VERSION = struct.Struct(">h")
_SNAPSHOT_HEADER = struct.Struct(">hIi")  # version, crc, count
SNAPSHOT_CRC_POSITION = 2
SNAPSHOT_COUNT_POSITION = 6  # also where the CRC coverage starts
SNAPSHOT_HEADER_SIZE = _SNAPSHOT_HEADER.size  # 10
# producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp, coordinatorEpoch,
# currentTxnFirstOffset.
_PRODUCER_ENTRY = struct.Struct(">qhiqiqiq")
PRODUCER_ENTRY_SIZE = _PRODUCER_ENTRY.size  # 46


@dataclass(frozen=True, slots=True)
class ProducerSnapshotEntry:
    """One producer's state: its epoch, its last written batch, and its open transaction if any."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int = NO_TXN_FIRST_OFFSET

    @property
    def has_ongoing_txn(self) -> bool:
        return self.current_txn_first_offset >= 0


def _entry_fields(e: ProducerSnapshotEntry) -> tuple[int, ...]:
    return (
        e.producer_id, e.producer_epoch, e.last_sequence, e.last_offset,
        e.offset_delta, e.timestamp, e.coordinator_epoch, e.current_txn_first_offset,
    )


def encode_producer_snapshot(entries: Iterable[ProducerSnapshotEntry]) -> bytes:
    """The snapshot file's bytes, entries in the order given, CRC filled in."""
    entries = list(entries)
    body = bytearray(_SNAPSHOT_HEADER.size + PRODUCER_ENTRY_SIZE * len(entries))
    _SNAPSHOT_HEADER.pack_into(body, 0, PRODUCER_SNAPSHOT_VERSION, 0, len(entries))
    for i, entry in enumerate(entries):
        try:
            _PRODUCER_ENTRY.pack_into(body, SNAPSHOT_HEADER_SIZE + i * PRODUCER_ENTRY_SIZE, *_entry_fields(entry))
        except struct.error as e:
            raise ValueError(f"producer snapshot entry {i} ({entry}) does not fit the format: {e}") from None
    struct.pack_into(">I", body, SNAPSHOT_CRC_POSITION, crc32c(bytes(body[SNAPSHOT_COUNT_POSITION:])))
    return bytes(body)


def decode_producer_snapshot(
    data: bytes | bytearray | memoryview, *, path: str | os.PathLike | None = None
) -> list[ProducerSnapshotEntry]:
    """Entries of a producer snapshot; :class:`CheckpointError` (file, byte position) if it is not whole."""
    data = bytes(data)

    def error(message: str, position: int) -> CheckpointError:
        return CheckpointError(f"producer snapshot: {message}", path=path, position=position)

    if len(data) < _SNAPSHOT_VERSION.size:
        raise error(f"truncated: {len(data)} bytes, too short for the version", 0)
    (version,) = _SNAPSHOT_VERSION.unpack_from(data, 0)
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise error(f"unknown version {version}, expected {PRODUCER_SNAPSHOT_VERSION}", 0)
    if len(data) < SNAPSHOT_HEADER_SIZE:
        incomplete = SNAPSHOT_CRC_POSITION if len(data) < SNAPSHOT_COUNT_POSITION else SNAPSHOT_COUNT_POSITION
        raise error(f"truncated header: {len(data)} of {SNAPSHOT_HEADER_SIZE} bytes", incomplete)
    _, stored_crc, count = _SNAPSHOT_HEADER.unpack_from(data, 0)
    _check_snapshot_size(data, count, error)
    computed_crc = crc32c(data[SNAPSHOT_COUNT_POSITION:])
    if computed_crc != stored_crc:
        raise error(f"CRC mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}", SNAPSHOT_CRC_POSITION)
    return [
        ProducerSnapshotEntry(*fields)
        for fields in _PRODUCER_ENTRY.iter_unpack(data[SNAPSHOT_HEADER_SIZE:])
    ]


def _check_snapshot_size(data: bytes, count: int, error: Callable[[str, int], CheckpointError]) -> None:
    if count < 0:
        raise error(f"negative entry count {count}", SNAPSHOT_COUNT_POSITION)
    expected = SNAPSHOT_HEADER_SIZE + count * PRODUCER_ENTRY_SIZE
    if len(data) < expected:
        whole = (len(data) - SNAPSHOT_HEADER_SIZE) // PRODUCER_ENTRY_SIZE
        raise error(
            f"truncated: count says {count} entries ({expected} bytes) but the file has {len(data)} bytes;"
            f" entry {whole} is incomplete",
            SNAPSHOT_HEADER_SIZE + whole * PRODUCER_ENTRY_SIZE,
        )
    if len(data) > expected:
        raise error(f"count says {count} entries but {len(data) - expected} bytes follow them", expected)


def read_producer_snapshot(path: str | os.PathLike) -> list[ProducerSnapshotEntry]:
    return decode_producer_snapshot(read_whole(path, what="producer snapshot"), path=path)


def write_producer_snapshot(path: str | os.PathLike, entries: Iterable[ProducerSnapshotEntry]) -> None:
    write_atomically(path, encode_producer_snapshot(entries))


# --- transaction index --------------------------------------------------------------------------

ABORTED_TXN_VERSION = 0
_ABORTED_TXN = struct.Struct(">hqqqq")
TXN_INDEX_ENTRY_SIZE = _ABORTED_TXN.size  # 34


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """A transaction aborted by ``producer_id`` over [first_offset, last_offset].

    ``last_stable_offset`` is the partition's LSO when the abort marker was written: a fetch up to
    that offset needs no aborted transactions from later entries.
    """

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_aborted_txns(txns: Iterable[AbortedTxn]) -> bytes:
    out = bytearray()
    for i, txn in enumerate(txns):
        try:
            out += _ABORTED_TXN.pack(
                ABORTED_TXN_VERSION, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset
            )
        except struct.error as e:
            raise ValueError(f"aborted transaction {i} ({txn}) does not fit the format: {e}") from None
    return bytes(out)


def decode_aborted_txns(
    data: bytes | bytearray | memoryview, *, path: str | os.PathLike | None = None
) -> list[AbortedTxn]:
    """Entries of a ``.txnindex``; :class:`IndexFormatError` at the first bad entry or a partial tail."""
    data = bytes(data)
    txns: list[AbortedTxn] = []
    whole_bytes = len(data) - len(data) % TXN_INDEX_ENTRY_SIZE
    for position in range(0, whole_bytes, TXN_INDEX_ENTRY_SIZE):
        version, *fields = _ABORTED_TXN.unpack_from(data, position)
        if version != ABORTED_TXN_VERSION:
            raise IndexFormatError(
                f"transaction index: entry {position // TXN_INDEX_ENTRY_SIZE} has unknown version {version},"
                f" expected {ABORTED_TXN_VERSION}",
                path=path, position=position,
            )
        txns.append(AbortedTxn(*fields))
    if whole_bytes != len(data):
        raise IndexFormatError(
            f"transaction index: {len(data)} bytes is not a multiple of {TXN_INDEX_ENTRY_SIZE};"
            f" a partial entry of {len(data) - whole_bytes} bytes ends the file",
            path=path, position=whole_bytes,
        )
    return txns


def read_txn_index(path: str | os.PathLike) -> list[AbortedTxn]:
    return decode_aborted_txns(read_whole(path, what="transaction index"), path=path)


def write_txn_index(path: str | os.PathLike, txns: Iterable[AbortedTxn]) -> None:
    write_atomically(path, encode_aborted_txns(txns))
