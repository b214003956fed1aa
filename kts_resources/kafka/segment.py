"""One log segment summarised from its batch headers: offsets, sizes, epochs, CRC health.

This is the inventory row kts keeps per segment; it reads headers only (the fast path) and checks
every batch's CRC-32C.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import FileChangedError
from .records import (
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    V2_HEADER_SIZE,
    BatchTally,
    InvalidBytes,
    SegmentScan,
    SegmentVerification,
    SegmentVerifier,
    framing_problem,
    minimum_batch_length,
    scan_batches,
    tally_batches,
)
from kts_resources.kafka.crc import crc32c

# How much of a segment one read brings in: memory stays at this plus one batch. 1 MiB scans as
# fast as 8 MiB here (its bytes stay in a core's cache between the read and the CRCs), with an
# eighth of the memory per scanning task.
SCAN_CHUNK_BYTES = 1024 * 1024
# The copy's verification reads a segment in windows of this size (see verify_segment_file).
VERIFY_READ_BYTES = 4 * 1024 * 1024


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


def summarize_tally(path: str, base_offset: int, active: bool, size: int, tally: BatchTally,
                    invalid: InvalidBytes | None) -> SegmentSummary:
    """The summary of a segment's batches, from their tally (:func:`summarize_segment`)."""
    if not tally.batch_count:
        return SegmentSummary(path, base_offset, active, size, invalid=invalid)
    return SegmentSummary(
        path=path,
        base_offset=base_offset,
        active=active,
        size_bytes=size,
        batch_count=tally.batch_count,
        record_count=tally.record_count,
        last_offset=tally.last_offset,
        max_timestamp=tally.max_timestamp,
        leader_epochs=tuple(sorted(tally.leader_epochs)),
        first_timestamp=tally.first_max_timestamp,
        crc_failures=tuple(tally.crc_failures),
        invalid=invalid,
    )


def summarize_segment(log_path: str | os.PathLike, base_offset: int, *, active: bool,
                      chunk_bytes: int = SCAN_CHUNK_BYTES) -> SegmentSummary:
    """Scan one ``.log`` file's headers, checking every CRC (tallied, not listed): the one way
    kts summarises a segment, for ``kts segments`` and the Spark inventory alike."""
    path = os.fspath(log_path)
    tally = BatchTally()
    size, scan = scan_segment_file(path, verify_crc=True, chunk_bytes=chunk_bytes, tally=tally)
    return summarize_tally(path, base_offset, active, size, tally, scan.invalid)


def scan_segment_file(path: str | os.PathLike, *, verify_crc: bool = True,
                      chunk_bytes: int = SCAN_CHUNK_BYTES, start: int = 0,
                      tally: BatchTally | None = None) -> tuple[int, SegmentScan]:
    """``scan_batches`` over a whole file (from byte ``start``: a batch boundary), read in chunks
    rather than mapped: (file size, scan), the same scan a mapping of the file gives. Memory stays
    at a chunk plus one batch, and a file truncated while it is read (a broker truncating its
    active segment after a leader change) raises FileChangedError where a mapping would take
    SIGBUS, which no Python code can catch. With ``tally`` (CRCs checked), the batches go into it
    (``tally_batches``) and the scan returned lists none."""
    if tally is not None and not verify_crc:
        raise ValueError("a tally checks every CRC")
    scan = SegmentScan()
    with open(path, "rb", buffering=0) as f:
        window = _FileWindow(f, start, chunk_bytes, lambda at, opened, _now: FileChangedError(
            f"{os.fspath(path)}: byte {at}: the file ended at {at} bytes while it was read ({opened} when it was "
            f"opened): truncated underneath"))
        size = window.size
        need = 0  # bytes the buffer must hold before the next scan (a batch cut off by a chunk)
        while True:
            at_end = window.fill(need)
            base, view = window.base, window.view
            if tally is None:
                part = scan_batches(view, verify_crc=verify_crc)
                for batch in part.batches:
                    batch.position += base
                scan.batches.extend(part.batches)
                scan.crc_failure_count += part.crc_failure_count
            else:
                part = tally_batches(view, tally, base=base)
            position = base + part.valid_bytes
            if part.invalid is None:
                if at_end:
                    scan.valid_bytes = position
                    return size, scan
                window.consume(part.valid_bytes)
                need = 0
                continue
            # Stopped short of the buffer's end: bytes that can never be a batch, or a batch the
            # chunk cut off. The verdict must be the one a scan of the whole file gives.
            file_rest = size - position
            header = _next_header(view[part.valid_bytes:])
            if at_end or header is None:
                # Bad magic or a too-short length: more bytes change nothing but the length.
                scan.invalid = InvalidBytes(position, file_rest, part.invalid.reason)
                scan.valid_bytes = position
                return size, scan
            magic, batch_length, need = header
            if magic >= 0 and need > file_rest > chunk_bytes:
                # A length past the end of the file (a partial write, or garbage that looks like a
                # header): not worth reading up to a GiB to say so.
                scan.invalid = InvalidBytes(position, file_rest, framing_problem(magic, batch_length, file_rest))
                scan.valid_bytes = position
                return size, scan
            need = min(need, file_rest)
            window.consume(part.valid_bytes)  # the cut-off batch moves to the front


def _next_header(rest: memoryview) -> tuple[int, int, int] | None:
    """(magic, batch length, bytes needed to hold the whole batch) of the batch starting ``rest``;
    (-1, -1, header size) when too few bytes show even its length; None when its header already
    shows it can never be a batch (unknown magic, a length below the minimum). A batch is read
    whole to check its CRC, so memory goes up to the largest batch the file claims (never more
    than the file)."""
    if len(rest) < LOG_OVERHEAD + 5:
        return -1, -1, V2_HEADER_SIZE
    batch_length = int.from_bytes(rest[8:12], "big", signed=True)
    magic = rest[16]
    if magic not in (0, 1, 2) or batch_length < minimum_batch_length(magic):
        return None
    return magic, batch_length, max(batch_length + LOG_OVERHEAD, V2_HEADER_SIZE if magic == 2 else 0)


def verify_segment_file(path: str | os.PathLike, *, chunk_bytes: int | None = None,
                        read_bytes: int = VERIFY_READ_BYTES) -> SegmentVerification:
    """``records.verify_segment`` of a whole file, with the same verdict, read in windows of
    ``read_bytes`` into one buffer rather than mapped: a segment the broker truncates while it is
    verified raises FileChangedError (naming the file, the size it had and the size found) where a
    mapping would take SIGBUS and kill the process. Memory stays at a window plus one batch."""
    verifier = SegmentVerifier(chunk_bytes)
    crc = 0
    with open(path, "rb", buffering=0) as f:
        window = _FileWindow(f, 0, read_bytes, lambda _at, opened, now: FileChangedError(
            f"truncated while it was verified: {opened} bytes expected, {now} found", path=path))
        size = window.size
        need = 0  # bytes the buffer must hold before the next look (a batch a window cut off)
        while True:
            at_end = window.fill(need)
            base, view = window.base, window.view
            used = len(view) if verifier.problem is not None else _verify_window(verifier, view, base, size, at_end, read_bytes)
            crc = crc32c(view[:used], crc)
            if at_end:  # the whole file: every byte used (a verdict on the last ones included)
                return verifier.finish(size, crc)
            need = _needed(view[used:], size - base - used) if used < len(view) else 0
            window.consume(used)  # the bytes not used yet (a batch the window cut off) move to the front


class _FileWindow:
    """A file read forward into one buffer, never mapped: a file truncated underneath (a broker
    truncating its active segment after a leader change) raises what ``truncated(position, size
    when opened, size now)`` makes, where a mapping would take SIGBUS, which no Python code can
    catch. ``view`` holds the file from byte ``base``; memory stays at a window plus one batch."""

    def __init__(self, f, start: int, window_bytes: int, truncated: Callable[[int, int, int], Exception]):
        self._fd = f.fileno()
        self.size = os.fstat(self._fd).st_size
        self._window_bytes = window_bytes
        self._truncated = truncated
        # One buffer, read into again and again: a fresh bytes object per chunk (and a bytearray
        # grown by it) page-faulted its memory in on every chunk, which cost more than the scan.
        self._buf = bytearray(max(1, min(window_bytes, self.size - start)))
        self._filled = 0
        self.base = self._read_to = start

    def fill(self, need: int = 0) -> bool:
        """Read up to a window past what is held (or up to ``need`` bytes held: a whole batch the
        last window cut off); True once the file's end is held."""
        while self._read_to < self.size:
            want = min(max(self._window_bytes, need) - self._filled, self.size - self._read_to)
            if len(self._buf) < self._filled + want:
                grown = bytearray(self._filled + want)
                grown[:self._filled] = self._buf[:self._filled]
                self._buf = grown
            got = os.preadv(self._fd, [memoryview(self._buf)[self._filled:self._filled + want]], self._read_to)
            if not got:
                raise self._truncated(self._read_to, self.size, os.fstat(self._fd).st_size)
            self._filled += got
            self._read_to += got
            if self._filled >= need:
                break
        return self._read_to >= self.size

    @property
    def view(self) -> memoryview:
        return memoryview(self._buf)[:self._filled]

    def consume(self, used: int) -> None:
        """Done with the first ``used`` bytes: the rest moves to the front (a same-size slice copy:
        the buffer never shrinks)."""
        kept = self._filled - used
        self._buf[:kept] = self._buf[used:self._filled]
        self._filled = kept
        self.base += used


def _verify_window(verifier: SegmentVerifier, view: memoryview, base: int, size: int, at_end: bool, read_bytes: int) -> int:
    """Verify the whole batches of ``view`` (the file from byte ``base``); returns how many of its
    bytes are done: all of them once a problem is found (the rest is only checksummed), else up to
    a batch the window cut off."""
    pos = verifier.magic_2_batches(view, base)
    if pos == len(view) or verifier.problem is not None:
        return len(view)
    rest = verifier.any_batches(view, base, pos)
    if verifier.problem is not None or rest.invalid is None:
        return len(view) if verifier.problem is not None else rest.valid_bytes
    # Stopped short of the window's end: bytes that can never be a batch, or a batch cut off. The
    # verdict must be the one a pass over the whole file gives (as scan_segment_file decides it).
    position, file_rest = rest.invalid.position, size - rest.invalid.position
    header = _next_header(view[rest.valid_bytes:])
    if at_end or header is None:
        verifier.problem = (position, f"{file_rest} invalid bytes ({rest.invalid.reason})")
        return len(view)
    magic, batch_length, need = header
    if magic >= 0 and need > file_rest:
        # A length past the end of the file (a partial write, or garbage that looks like a header).
        verifier.problem = (position, f"{file_rest} invalid bytes ({framing_problem(magic, batch_length, file_rest)})")
        return len(view)
    return rest.valid_bytes


def _needed(rest: memoryview, file_rest: int) -> int:
    """How many bytes from the start of ``rest`` the next window must hold: the whole batch there."""
    header = _next_header(rest)
    return min(header[2] if header is not None else len(rest), file_rest)
