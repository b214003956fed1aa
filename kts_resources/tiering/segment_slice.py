"""A closed segment cut at the first batch reaching an offset, as a segment of its own, for the copy.

After a leader change the new leader's copy starts inside one of its segments (where the tier's
lineage ends: ``lineage.copy_start_offset``). Kafka uploads that segment whole, and the tier holds
its first part twice. kts uploads the part from the first batch holding an offset at or past the copy
start: the batches' bytes as they are (a batch's CRC does not cover its position), its ``.index`` and
``.timeindex`` rebuilt as ``LogSegment.recover`` writes them for a segment with that base offset, and
the ``.txnindex`` entries whose abort markers it holds. The files go to a temporary directory the
caller removes once the upload is done; the broker's files are only read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kts_resources.kafka.crc import crc32c

from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.kafka.indexes import lookup_offset, read_offset_index, rebuild_indexes
from kts_resources.kafka.logdir import SegmentFiles, offset_file_name
from kts_resources.kafka.records import scan_batches
from kts_resources.kafka.snapshots import read_txn_index, write_txn_index


@dataclass(frozen=True)
class SegmentSlice:
    """The files of a cut segment (``files``, in ``directory``) and what the copy records of it."""

    directory: Path
    files: SegmentFiles
    size: int
    crc32c: int
    mtime_ns: int
    last_offset: int
    max_timestamp: int
    epochs: dict[int, int] = field(default_factory=dict)  # leader epoch → its first batch's base offset

    @property
    def base_offset(self) -> int:
        return self.files.base_offset

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class SliceError(Exception):
    """The segment cannot be cut there (a damaged batch, or none reaching the offset)."""


def slice_segment(segment: SegmentFiles, from_offset: int, *, temp_dir: str | os.PathLike | None = None) -> SegmentSlice:
    """``segment`` from its first batch whose last offset is ≥ ``from_offset`` (see the module
    docstring). Only the part from the offset index's entry at or below ``from_offset`` is read."""
    try:
        start = lookup_offset(read_offset_index(segment.offset_index, segment.base_offset), from_offset, segment.base_offset).position
    except (OSError, KafkaFormatError):
        start = 0  # no usable index: read from the start
    with open(segment.log, "rb") as f:
        f.seek(start)
        data = memoryview(f.read())
    scan = scan_batches(data, verify_crc=True)
    if scan.crc_failure_count:
        bad = scan.crc_failures[0]
        raise SliceError(f"{segment.log}: byte {start + bad.position}: the batch at offset {bad.base_offset} fails its CRC")
    first = next((b for b in scan.batches if b.last_offset >= from_offset), None)
    if first is None:
        raise SliceError(f"{segment.log}: no batch holds offset {from_offset} or later")
    kept = [b for b in scan.batches if b.position >= first.position]
    tail = data[first.position:scan.valid_bytes]
    directory = Path(tempfile.mkdtemp(prefix="kts-segment-slice-", dir=temp_dir))
    try:
        base = first.base_offset
        log = directory / offset_file_name(base, ".log")
        log.write_bytes(tail)
        rebuilt = rebuild_indexes(tail, base, path=log)
        offset_index, time_index = directory / offset_file_name(base, ".index"), directory / offset_file_name(base, ".timeindex")
        offset_index.write_bytes(rebuilt.offset_index)
        time_index.write_bytes(rebuilt.time_index)
        txn_index = None
        if segment.txn_index is not None:
            # An aborted transaction is listed in the segment holding its abort marker.
            aborted = [t for t in read_txn_index(segment.txn_index) if t.last_offset >= base]
            if aborted:
                txn_index = directory / offset_file_name(base, ".txnindex")
                write_txn_index(txn_index, aborted)
        epochs: dict[int, int] = {}
        for b in kept:
            if b.magic >= 2:
                epochs.setdefault(b.partition_leader_epoch, b.base_offset)
        return SegmentSlice(
            directory=directory,
            files=SegmentFiles(base, log, offset_index, time_index, txn_index, active=False, next_base_offset=segment.next_base_offset),
            size=len(tail),
            crc32c=crc32c(tail),
            mtime_ns=log.stat().st_mtime_ns,
            last_offset=kept[-1].last_offset,
            max_timestamp=max(b.max_timestamp for b in kept),
            epochs=epochs,
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
