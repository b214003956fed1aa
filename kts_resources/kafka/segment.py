"""One log segment summarised from its batch headers: offsets, sizes, epochs, CRC health.

This is the inventory row kts keeps per segment; it reads headers only (the fast path) and checks
every batch's CRC-32C.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from .files import mapped
from .records import NO_TIMESTAMP, BatchHeader, InvalidBytes, SegmentScan, scan_batches


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What a segment holds, from its batch headers."""

    path: str
    base_offset: int
    active: bool
    size_bytes: int
    batch_count: int = 0
    record_count: int = 0
    # None for an empty segment.
    last_offset: int | None = None
    max_timestamp: int = NO_TIMESTAMP
    leader_epochs: tuple[int, ...] = ()
    first_timestamp: int = NO_TIMESTAMP
    crc_failures: tuple[int, ...] = field(default=())  # byte positions of batches failing their CRC
    invalid: InvalidBytes | None = None

    @property
    def next_offset(self) -> int:
        return self.base_offset if self.last_offset is None else self.last_offset + 1

    @property
    def healthy(self) -> bool:
        return not self.crc_failures and self.invalid is None

    @property
    def health(self) -> str:
        if self.crc_failures:
            return "corrupt"
        if self.invalid is not None:
            return "invalid-bytes"
        return "ok"

    def problems(self) -> list[str]:
        """One line per finding, each naming the file and byte position."""
        lines = [f"{self.path}: byte {p}: batch fails its CRC" for p in self.crc_failures]
        if self.invalid is not None:
            lines.append(f"{self.path}: byte {self.invalid.position}: {self.invalid.length} invalid bytes at the end ({self.invalid.reason})")
        return lines

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "base_offset": self.base_offset,
            "last_offset": self.last_offset,
            "next_offset": self.next_offset,
            "size_bytes": self.size_bytes,
            "batch_count": self.batch_count,
            "record_count": self.record_count,
            "max_timestamp": self.max_timestamp,
            "leader_epochs": list(self.leader_epochs),
            "active": self.active,
            "health": self.health,
            "crc_failures": list(self.crc_failures),
            "invalid_bytes": None if self.invalid is None else {
                "position": self.invalid.position, "length": self.invalid.length, "reason": self.invalid.reason,
            },
        }


def summarize_scan(path: str, base_offset: int, active: bool, size: int, scan: SegmentScan) -> SegmentSummary:
    batches: list[BatchHeader] = scan.batches
    if not batches:
        return SegmentSummary(path, base_offset, active, size, invalid=scan.invalid)
    epochs = sorted({b.partition_leader_epoch for b in batches if b.partition_leader_epoch >= 0})
    return SegmentSummary(
        path=path,
        base_offset=base_offset,
        active=active,
        size_bytes=size,
        batch_count=len(batches),
        record_count=sum(b.record_count for b in batches),
        last_offset=batches[-1].last_offset,
        max_timestamp=max(b.max_timestamp for b in batches),
        leader_epochs=tuple(epochs),
        first_timestamp=batches[0].max_timestamp,
        crc_failures=tuple(b.position for b in batches if b.crc_ok is False),
        invalid=scan.invalid,
    )


def summarize_segment(log_path: str | os.PathLike, base_offset: int, *, active: bool) -> SegmentSummary:
    """Scan one ``.log`` file's headers, checking every CRC."""
    path = os.fspath(log_path)
    with mapped(path) as view:
        scan = scan_batches(view, verify_crc=True)
        return summarize_scan(path, base_offset, active, len(view), scan)

