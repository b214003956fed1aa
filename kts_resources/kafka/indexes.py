"""A segment's offset index (.index) and time index (.timeindex): read, write, rebuild, verify.

Formats (big-endian, KAFKA_FORMATS.md §3–4):

- ``.index``: 8-byte entries, relativeOffset int32 + position int32 (byte position of a batch in
  the ``.log``). The offset is that batch's LAST offset, or, for a multi-batch append before
  KAFKA-806, the last offset of the append's last batch.
- ``.timeindex``: 12-byte entries, timestamp int64 + relativeOffset int32: the largest timestamp so
  far and an offset inside the batch that holds it (see the notes above :func:`verify_segment_indexes`
  for which offset each Kafka version writes).

Both are sparse. :class:`SegmentIndexer` implements ``LogSegment.recover``'s rule (per batch),
which a rebuild follows; verification accepts every version's ``LogSegment.append``. The active segment's files are preallocated
(``segment.index.bytes``) and zero-filled past the last entry; a closed segment's are trimmed.

Pure: bytes in, values out. The only I/O is on the files a caller names.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .errors import CorruptRecordError, FileChangedError, IndexFormatError, shown
from .files import MAX_KAFKA_FILE_BYTES, read_whole, write_atomically
from .logdir import SegmentFiles, list_segments, parse_offset_file_name
from .records import NO_TIMESTAMP, SegmentScan, scan_batches

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
DEFAULT_INDEX_INTERVAL_BYTES = 4096  # index.interval.bytes
DEFAULT_SEGMENT_INDEX_BYTES = 10 * 1024 * 1024  # segment.index.bytes

LOG_SUFFIX = ".log"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_INT32_MAX = 2**31 - 1


# --- values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """An offset index entry: the batch whose last offset is ``offset`` starts at byte ``position``."""

    offset: int  # absolute
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A time index entry: ``timestamp`` is the largest timestamp up to and including ``offset``."""

    timestamp: int
    offset: int  # absolute


@dataclass(frozen=True, slots=True)
class IndexFinding:
    """One thing wrong with a segment's index files; ``position`` is a byte in the index file."""

    path: str
    position: int | None
    message: str

    def __str__(self) -> str:
        where = shown(self.path) if self.position is None else f"{shown(self.path)}: byte {self.position}"
        return f"{where}: {self.message}"

    def to_json(self) -> dict:
        return {"path": self.path, "position": self.position, "message": self.message}


@dataclass(frozen=True, slots=True)
class RebuiltIndexes:
    """Index bytes rebuilt from a segment's batches, and the scan they came from.

    ``scan.invalid`` is set when the segment ends in bytes that are not a whole batch: only the
    valid prefix was indexed, and callers should report those bytes as a warning.
    """

    offset_index: bytes
    time_index: bytes
    scan: SegmentScan
    offset_entries: tuple[OffsetPosition, ...]
    time_entries: tuple[TimestampOffset, ...]
    closed: bool
    # Set by rebuild_segment_indexes: where the files were written.
    offset_index_path: str | None = None
    time_index_path: str | None = None


# --- sizes --------------------------------------------------------------------------------------


def preallocated_size(segment_index_bytes: int, entry_size: int) -> int:
    """The length an active segment's index file is preallocated to (AbstractIndex rounds down)."""
    if segment_index_bytes < entry_size:
        raise ValueError(f"segment.index.bytes {segment_index_bytes} cannot hold one {entry_size}-byte entry")
    return entry_size * (segment_index_bytes // entry_size)


def max_entries(segment_index_bytes: int, entry_size: int) -> int:
    """How many entries a preallocated index holds.

    The offset index is full at ``max_entries`` entries; the time index is full one entry earlier,
    because TimeIndex keeps its last slot for the entry appended when the segment rolls. Either
    being full rolls the segment (see :meth:`SegmentIndexer.is_full`).
    """
    return preallocated_size(segment_index_bytes, entry_size) // entry_size


# --- decode / encode ----------------------------------------------------------------------------


def _decode(
    data: bytes | memoryview, entry: struct.Struct, relative_at: int, path: str | os.PathLike | None, what: str
) -> tuple[list[tuple[int, int]], int | None]:
    """The whole entries before the zero-filled tail, raw, and the byte where that tail starts.

    The tail starts at the first entry i > 0 whose relative offset is 0 (no real entry after the
    first can point at the base offset: offsets strictly increase). An all-zero file of more than
    one entry is a preallocated index with no entries yet.
    """
    size = entry.size
    length = len(data)
    partial = length % size
    if partial:
        raise IndexFormatError(
            f"{what} is {length} bytes, not a whole number of {size}-byte entries: "
            f"the last entry has only {partial} bytes",
            path=path,
            position=length - partial,
        )
    count = length // size
    raw = bytes(data)
    # Skip the (possibly 10 MiB) zero run in C before walking entries in Python.
    used = len(raw.rstrip(b"\0"))
    if used == 0:
        if count > 1:
            return [], 0
        return ([entry.unpack_from(raw, 0)] if count else []), None
    walk = min(count, -(-used // size))
    out: list[tuple[int, int]] = []
    for i, fields in enumerate(entry.iter_unpack(raw[: walk * size])):
        if i > 0 and fields[relative_at] == 0:
            return out, i * size
        out.append(fields)
    return out, (walk * size if walk < count else None)


def _decode_offsets(data: bytes | memoryview, base_offset: int, path: str | os.PathLike | None) -> tuple[list[OffsetPosition], int | None]:
    raw, tail = _decode(data, _OFFSET_ENTRY, 0, path, "offset index")
    return [OffsetPosition(base_offset + rel, pos) for rel, pos in raw], tail


def _decode_times(data: bytes | memoryview, base_offset: int, path: str | os.PathLike | None) -> tuple[list[TimestampOffset], int | None]:
    raw, tail = _decode(data, _TIME_ENTRY, 1, path, "time index")
    return [TimestampOffset(ts, base_offset + rel) for ts, rel in raw], tail


def decode_offset_index(data: bytes | memoryview, base_offset: int, *, path: str | os.PathLike | None = None) -> list[OffsetPosition]:
    """The entries of an ``.index`` file, stopping at a preallocated zero-filled tail.

    Tolerant: entries out of order are returned as they are (:func:`verify_segment_indexes` judges
    them). Raises :class:`IndexFormatError` when the length is not a multiple of 8.
    """
    return _decode_offsets(data, base_offset, path)[0]


def decode_time_index(data: bytes | memoryview, base_offset: int, *, path: str | os.PathLike | None = None) -> list[TimestampOffset]:
    """The entries of a ``.timeindex`` file, stopping at a preallocated zero-filled tail.

    Raises :class:`IndexFormatError` when the length is not a multiple of 12.
    """
    return _decode_times(data, base_offset, path)[0]


def _relative(offset: int, base_offset: int) -> int:
    relative = offset - base_offset
    if not 0 <= relative <= _INT32_MAX:
        # Kafka's IndexOffsetOverflowException: the segment must roll before this offset.
        raise ValueError(f"offset {offset} does not fit a relative offset from base offset {base_offset}")
    return relative


def encode_offset_index(entries: Iterable[OffsetPosition], base_offset: int) -> bytes:
    """A trimmed ``.index`` file holding ``entries``."""
    out = bytearray()
    for e in entries:
        if not 0 <= e.position <= _INT32_MAX:
            raise ValueError(f"position {e.position} does not fit an int32")
        out += _OFFSET_ENTRY.pack(_relative(e.offset, base_offset), e.position)
    return bytes(out)


def encode_time_index(entries: Iterable[TimestampOffset], base_offset: int) -> bytes:
    """A trimmed ``.timeindex`` file holding ``entries``."""
    out = bytearray()
    for e in entries:
        out += _TIME_ENTRY.pack(e.timestamp, _relative(e.offset, base_offset))
    return bytes(out)


def _base_offset_of(path: str | os.PathLike) -> int:
    try:
        return parse_offset_file_name(Path(path).name)[0]
    except ValueError as e:
        raise ValueError(f"{os.fspath(path)}: not a segment file name ({e})") from None


@dataclass(slots=True)
class _IndexFile:
    """What a bounded, streaming read of an index file found (see :func:`_read_index_file`)."""

    size: int
    entries: list[tuple[int, int]]
    tail: int | None = None  # byte where the zero-filled (preallocated) tail starts
    stray: int | None = None  # first non-zero byte after the tail start
    partial: int = 0  # bytes of a last entry cut short
    excess: int | None = None  # byte of the first entry beyond ``max_count``


_INDEX_READ_CHUNK = 24 * 65536  # a whole number of 8- and 12-byte entries


def _read_index_file(
    path: str | os.PathLike, entry: struct.Struct, relative_at: int, what: str,
    *, max_count: int | None = None, check_tail: bool = True,
) -> _IndexFile:
    """Entries of an index file read in chunks, never the whole file at once.

    The tail starts at the first entry i > 0 whose relative offset is 0 (no real entry after the
    first can point at the base offset); an all-zero file of several entries has no entries. A file
    larger than Kafka ever writes raises :class:`IndexFormatError`; the walk stops after
    ``max_count`` entries (a segment's index needs at most one per batch), so a hostile file costs
    a bounded read. With ``check_tail`` the bytes after the tail are checked (in chunks) to be zero.
    """
    size_of = entry.size
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_KAFKA_FILE_BYTES:
            raise IndexFormatError(
                f"{what} is {size:,} bytes, larger than any index Kafka writes (segment.index.bytes is a "
                f"32-bit int: at most {MAX_KAFKA_FILE_BYTES:,}); not read", path=path, position=MAX_KAFKA_FILE_BYTES)
        out = _IndexFile(size, [], partial=size % size_of)
        whole = size - out.partial
        first_zero = False
        pos = 0
        while pos < whole:
            chunk = f.read(min(_INDEX_READ_CHUNK, whole - pos))
            if not chunk:
                raise FileChangedError(f"{what} shrank to {pos:,} bytes while being read", path=path, position=pos)
            if out.tail is None:
                for k, fields in enumerate(entry.iter_unpack(chunk)):
                    i = pos // size_of + k
                    if i == 0:
                        first_zero = not any(chunk[:size_of])
                    elif fields[relative_at] == 0:
                        out.tail = i * size_of
                        break
                    if max_count is not None and len(out.entries) > max_count:
                        # One past the cap: entry 0 may be a preallocated all-zero one, not an entry.
                        out.excess = max_count * size_of
                        return out
                    out.entries.append(fields)
                if out.tail is None:
                    pos += len(chunk)
                    continue
                if not check_tail:
                    break
                rest = chunk[out.tail - pos :]
                start = out.tail
            else:
                rest, start = chunk, pos
            nonzero = len(rest) - len(rest.lstrip(b"\0"))
            if nonzero < len(rest):
                out.stray = start + nonzero
                break
            pos += len(chunk)
        if out.tail == size_of and first_zero and out.stray is None:
            # Preallocated and never written: entry 0 is tail too.
            out.entries, out.tail = [], 0
    if max_count is not None and len(out.entries) > max_count:
        out.excess = max_count * size_of
    return out


def _stop_on_partial(read: _IndexFile, path: str | os.PathLike, what: str, size_of: int) -> None:
    if read.partial:
        raise IndexFormatError(
            f"{what} is {read.size} bytes, not a whole number of {size_of}-byte entries: "
            f"the last entry has only {read.partial} bytes",
            path=path, position=read.size - read.partial,
        )


def read_offset_index(path: str | os.PathLike, base_offset: int | None = None) -> list[OffsetPosition]:
    """Read an ``.index`` file (in chunks, up to its zero-filled tail); the base offset defaults to
    the one its name carries."""
    base = _base_offset_of(path) if base_offset is None else base_offset
    read = _read_index_file(path, _OFFSET_ENTRY, 0, "offset index", check_tail=False)
    _stop_on_partial(read, path, "offset index", OFFSET_ENTRY_SIZE)
    return [OffsetPosition(base + rel, pos) for rel, pos in read.entries]


def _last_entry(path: str | os.PathLike, entry: struct.Struct, relative_at: int, what: str,
                *, partial_ok: bool) -> tuple[int, ...] | None:
    """The last entry of an index file (raw fields), found by bisecting for the start of its
    zero-filled tail: a score of reads instead of the whole file (an active segment's index is
    preallocated to segment.index.bytes, 10 MiB by default). Entries' relative offsets increase,
    so the tail is where they drop to 0 (as the full readers read it). None when the file has no
    entry, is larger than Kafka writes, or (unless ``partial_ok``: the partial entry is ignored)
    is not a whole number of entries."""
    size_of = entry.size
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        if (size % size_of and not partial_ok) or size > MAX_KAFKA_FILE_BYTES:
            return None

        def read(i: int) -> tuple[int, ...]:
            data = os.pread(fd, size_of, i * size_of)
            if len(data) < size_of:
                raise FileChangedError(f"{what} shrank to {len(data) + i * size_of:,} bytes while "
                                       "being read", path=path, position=i * size_of)
            return entry.unpack(data)

        count = size // size_of
        if count == 0:
            return None
        last, past = 0, count  # entry `last` is an entry (0 always is, if any is); `past` is tail or the end
        while past - last > 1:
            middle = (last + past) // 2
            if read(middle)[relative_at] != 0:
                last = middle
            else:
                past = middle
        fields = read(last)
        if last == 0 and not any(fields) and count > 1:
            return None  # preallocated and never written (one zero entry alone is an entry, as the full readers read it)
        return fields


def last_offset_index_entry(path: str | os.PathLike, base_offset: int | None = None) -> OffsetPosition | None:
    """The last entry of an ``.index`` file (:func:`_last_entry`); None when the file has no entry
    or is not a whole number of entries. In a damaged file the entry found may be any non-zero
    one, so it is a hint its caller checks against the log."""
    base = _base_offset_of(path) if base_offset is None else base_offset
    fields = _last_entry(path, _OFFSET_ENTRY, 0, "offset index", partial_ok=False)
    return None if fields is None else OffsetPosition(base + fields[0], fields[1])


def last_time_index_entry(path: str | os.PathLike, base_offset: int | None = None) -> TimestampOffset | None:
    """The last entry of a ``.timeindex`` file (:func:`_last_entry`; a partial entry a crash cut
    short is ignored): a closed segment's holds its largest timestamp (the roll appends it)."""
    base = _base_offset_of(path) if base_offset is None else base_offset
    fields = _last_entry(path, _TIME_ENTRY, 1, "time index", partial_ok=True)
    return None if fields is None else TimestampOffset(fields[0], base + fields[1])


def largest_timestamp(max_timestamp: int, log_mtime_ns: int) -> int:
    """Kafka's LogSegment.largestTimestamp: the largest record timestamp, else (no timestamps:
    magic 0, or none recorded) the .log's modification time in ms, so time-based retention still
    applies."""
    return max_timestamp if max_timestamp >= 0 else log_mtime_ns // 1_000_000


def segment_largest_timestamp(segment: SegmentFiles) -> int:
    """A closed segment's largest timestamp without reading its batches: its time index's last
    entry, else the .log's modification time (:func:`largest_timestamp`); −1 when the .log is gone.
    An entry that is all zeros (a zero-filled index) is no entry."""
    try:
        last = last_time_index_entry(segment.time_index, segment.base_offset)
    except (OSError, FileChangedError):
        last = None
    if last is not None and (last.timestamp > 0 or last.offset > segment.base_offset):
        return last.timestamp
    try:
        return largest_timestamp(NO_TIMESTAMP, os.stat(segment.log).st_mtime_ns)
    except OSError:
        return -1


def read_time_index(path: str | os.PathLike, base_offset: int | None = None) -> list[TimestampOffset]:
    """Read a ``.timeindex`` file (in chunks, up to its zero-filled tail); the base offset defaults
    to the one its name carries."""
    base = _base_offset_of(path) if base_offset is None else base_offset
    read = _read_index_file(path, _TIME_ENTRY, 1, "time index", check_tail=False)
    _stop_on_partial(read, path, "time index", TIME_ENTRY_SIZE)
    return [TimestampOffset(ts, base + rel) for ts, rel in read.entries]


# --- the broker's indexing rule -----------------------------------------------------------------


class SegmentIndexer:
    """The broker's indexing rule for one segment (LogSegment.append / LogSegment.recover).

    Feed every batch in log order with :meth:`append_batch`; call :meth:`close` when the segment
    rolls. Before a batch, if more than ``index_interval_bytes`` were appended since the last
    entry, the batch gets an offset entry (its last offset, its position) and the time index gets
    (max timestamp so far, its offset) if that timestamp is strictly greater than the last time
    entry's. So the first batch is never indexed.
    """

    def __init__(self, base_offset: int, index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES):
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.offset_entries: list[OffsetPosition] = []
        self.time_entries: list[TimestampOffset] = []
        # An empty time index's last entry is (NO_TIMESTAMP, base offset); Kafka starts from it.
        self.max_timestamp_so_far: int = NO_TIMESTAMP
        self.offset_of_max_timestamp_so_far: int = base_offset
        self.bytes_since_last_index_entry = 0

    def append_batch(
        self, position: int, size: int, last_offset: int, max_timestamp: int
    ) -> tuple[OffsetPosition | None, TimestampOffset | None]:
        """Index one batch; returns the entries it added (so a writer can append them to files)."""
        _relative(last_offset, self.base_offset)  # LogSegment.ensureOffsetInRange
        if max_timestamp > self.max_timestamp_so_far:
            self.max_timestamp_so_far = max_timestamp
            # The batch's last offset, not the record's: the time index points at batch boundaries.
            self.offset_of_max_timestamp_so_far = last_offset
        offset_entry = time_entry = None
        if self.bytes_since_last_index_entry > self.index_interval_bytes:
            if self.offset_entries and last_offset <= self.offset_entries[-1].offset:
                # OffsetIndex.append's InvalidOffsetException.
                raise ValueError(f"offset {last_offset} is not above the last indexed offset {self.offset_entries[-1].offset}")
            offset_entry = OffsetPosition(last_offset, position)
            self.offset_entries.append(offset_entry)
            time_entry = self._maybe_append_time_entry()
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size
        return offset_entry, time_entry

    def close(self) -> TimestampOffset | None:
        """The segment rolls: append the final time entry (same strictly-greater rule).

        That makes a closed segment's last time entry carry its largest timestamp, which time-based
        retention reads. Calling it again adds nothing.
        """
        return self._maybe_append_time_entry()

    def _maybe_append_time_entry(self) -> TimestampOffset | None:
        last = self.time_entries[-1].timestamp if self.time_entries else NO_TIMESTAMP
        if self.max_timestamp_so_far <= last:
            return None
        entry = TimestampOffset(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far)
        self.time_entries.append(entry)
        return entry

    def is_full(self, segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES) -> bool:
        """Whether either index is full, which rolls the segment before the next append."""
        return (
            len(self.offset_entries) >= max_entries(segment_index_bytes, OFFSET_ENTRY_SIZE)
            # TimeIndex.isFull keeps one slot for the entry the roll appends.
            or len(self.time_entries) >= max_entries(segment_index_bytes, TIME_ENTRY_SIZE) - 1
        )

    def offset_index_bytes(self) -> bytes:
        return encode_offset_index(self.offset_entries, self.base_offset)

    def time_index_bytes(self) -> bytes:
        return encode_time_index(self.time_entries, self.base_offset)


# --- rebuild ------------------------------------------------------------------------------------


def rebuild_indexes(
    log_data: bytes | memoryview,
    base_offset: int,
    *,
    closed: bool = True,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    path: str | os.PathLike | None = None,
) -> RebuiltIndexes:
    """Both indexes of a segment, rebuilt from its batches as ``LogSegment.recover`` writes them.

    Recovery indexes batch by batch (index.interval.bytes rule, time entries at a batch's last
    offset), then appends the closing time entry (the segment's largest timestamp) whether the
    segment is active or not, and trims both files. So the output is byte-identical to what a
    broker leaves after recovering the segment. ``closed`` is recorded only (a closed segment must
    carry that last entry; an active one gets it here as recovery gives it one too).

    Invalid bytes at the end (a crash's partial write) end the indexing: the valid prefix is
    indexed and ``scan.invalid`` tells the caller. A batch failing its CRC raises
    :class:`CorruptRecordError` naming ``path`` and its position: Kafka's recovery would truncate
    the log there, and kts never edits a log.
    """
    scan = scan_batches(log_data, verify_crc=True)
    indexer = SegmentIndexer(base_offset, index_interval_bytes)
    for batch in scan.batches:
        if batch.crc_ok is False:
            raise CorruptRecordError(
                f"batch at offset {batch.base_offset} fails its CRC; Kafka's recovery would truncate the "
                "segment here, and kts does not edit logs",
                path=path,
                position=batch.position,
            )
        try:
            indexer.append_batch(batch.position, batch.size, batch.last_offset, batch.max_timestamp)
        except ValueError as e:
            raise CorruptRecordError(f"batch at offset {batch.base_offset}: {e}", path=path, position=batch.position) from None
    # LogSegment.recover: "a normally closed segment always appends the biggest timestamp ever
    # seen into log segment, we do this as well" (timeIndex.maybeAppend(..., skipFullCheck=true)).
    indexer.close()
    return RebuiltIndexes(
        offset_index=indexer.offset_index_bytes(),
        time_index=indexer.time_index_bytes(),
        scan=scan,
        offset_entries=tuple(indexer.offset_entries),
        time_entries=tuple(indexer.time_entries),
        closed=closed,
    )


def is_active_segment(log_path: str | os.PathLike) -> bool:
    """Whether a segment is its partition's active one: the highest base offset in its directory."""
    path = Path(log_path)
    base = _base_offset_of(path)
    segments = list_segments(path.parent)
    return not segments or base >= segments[-1].base_offset


def index_paths(log_path: str | os.PathLike, directory: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """The ``.index`` and ``.timeindex`` paths of a segment (beside it, or in ``directory``)."""
    path = Path(log_path)
    stem = path.name.split(".", 1)[0]
    where = path.parent if directory is None else Path(directory)
    return where / (stem + OFFSET_INDEX_SUFFIX), where / (stem + TIME_INDEX_SUFFIX)


def read_segment(log_path: str | os.PathLike) -> memoryview:
    """A segment's bytes, read rather than mapped: a broker may truncate it while kts reads
    (:class:`FileChangedError` then, never SIGBUS), and no segment exceeds segment.bytes' int."""
    return read_whole(log_path, what="segment")


def rebuild_segment_indexes(
    log_path: str | os.PathLike,
    *,
    out_dir: str | os.PathLike | None = None,
    closed: bool | None = None,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
) -> RebuiltIndexes:
    """Rebuild ``<base>.index`` and ``<base>.timeindex`` of a segment file (see :func:`rebuild_indexes`).

    Writes beside the segment, or into ``out_dir``; each file is replaced atomically. Nothing is
    written when the segment has a batch failing its CRC.

    Beside a live broker's active segment, prefer ``out_dir``: the broker keeps writing to the
    index it has mapped, not to the replacement.
    """
    path = Path(log_path)
    base_offset = _base_offset_of(path)
    if closed is None:
        closed = not is_active_segment(path)
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise NotADirectoryError(20, "not a directory", os.fspath(out_dir))
    rebuilt = rebuild_indexes(read_segment(path), base_offset, closed=closed, index_interval_bytes=index_interval_bytes, path=path)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    offset_path, time_path = index_paths(path, out_dir)
    write_atomically(offset_path, rebuilt.offset_index)
    write_atomically(time_path, rebuilt.time_index)
    return RebuiltIndexes(
        rebuilt.offset_index, rebuilt.time_index, rebuilt.scan, rebuilt.offset_entries, rebuilt.time_entries,
        rebuilt.closed, os.fspath(offset_path), os.fspath(time_path),
    )


# --- verify -------------------------------------------------------------------------------------
#
# What a broker writes depends on its version and on the segment's history, so verification checks
# the invariants every broker keeps, not one rebuild's bytes:
#
# - Offset index. Kafka before KAFKA-806 (every release up to 3.9.0 and 4.0.0; per batch since 4.1,
#   backported to 3.9.1 / 4.0.1) adds at most one entry per LogSegment.append, and an append can
#   hold several batches (a follower's fetch, the log cleaner's rewrite, appendChunkFromFile when a
#   log dir moves): the entry is (the append's largest offset, the position of its FIRST batch).
#   Since KAFKA-806, and in LogSegment.recover always, it is (a batch's last offset, its position).
#   Both: the entry's position starts a batch, and its offset is the last offset of that batch or
#   of a later one; offsets and positions strictly increase.
# - Time index. The entry is (largest timestamp so far, the offset LogSegment.append was given for
#   it). Leaders appending an uncompressed magic-2 batch with CreateTime gave the offset of the
#   RECORD holding the largest timestamp in Kafka 0.11.0 to 3.6.x (LogValidator's
#   assignOffsetsNonCompressed); since 3.7.0 ("MINOR: Small LogValidator clean ups", #14697, then
#   KAFKA-16310 in 3.8.0) the batch's last offset, as followers, compressed batches, the cleaner
#   and recovery always did. Both: the offset lies inside a batch whose largest timestamp is the
#   entry's, and no earlier batch has a larger one. Timestamps and offsets strictly increase
#   (TimeIndex.maybeAppend appends only a greater timestamp).
# - The closing entry. When a segment rolls (onBecomeInactiveSegment), at a clean shutdown
#   (LogSegment.close) and after recovery, maybeAppend(maxTimestampSoFar, ...) adds the largest
#   timestamp if the index does not end with it yet: a closed segment's time index ends with its
#   largest timestamp; an active segment's may end with one from each clean shutdown.


def _index_findings(read: _IndexFile, path: str, entry_size: int, what: str, closed: bool, max_count: int) -> list[IndexFinding]:
    findings = []
    if read.partial:
        findings.append(IndexFinding(
            path, read.size - read.partial,
            f"{what} is {read.size} bytes, not a whole number of {entry_size}-byte entries "
            f"(truncated: the last entry has {read.partial} bytes)",
        ))
    if read.excess is not None:
        findings.append(IndexFinding(
            path, read.excess,
            f"{what} holds more entries than the segment's {max_count} batches could need (a broker indexes each batch "
            "at most once); not read further",
        ))
    if read.tail is not None and closed:
        findings.append(IndexFinding(
            path, read.tail, f"closed segment's {what} has a zero-filled preallocated tail from here (a rolled segment's index is trimmed)"
        ))
    if read.stray is not None:
        findings.append(IndexFinding(
            path, read.tail,
            f"entry {read.tail // entry_size} has relative offset 0, which reads as the start of the zero-filled tail, "
            f"but a non-zero byte follows at byte {read.stray}: entries after it are invisible to readers",
        ))
    return findings


def _read_for_verify(path: Path, entry: struct.Struct, relative_at: int, what: str, closed: bool, max_count: int,
                     findings: list[IndexFinding]) -> list[tuple[int, int]] | None:
    p = os.fspath(path)
    try:
        read = _read_index_file(path, entry, relative_at, what, max_count=max_count)
    except FileNotFoundError:
        findings.append(IndexFinding(p, None, f"{what} file is missing"))
        return None
    except IndexFormatError as e:
        findings.append(IndexFinding(p, e.position, e.message))
        return None
    findings.extend(_index_findings(read, p, entry.size, what, closed, max_count))
    return read.entries


def verify_segment_indexes(log_path: str | os.PathLike, *, closed: bool | None = None) -> list[IndexFinding]:
    """Check a segment's ``.index`` and ``.timeindex`` against its batches; an empty list is healthy.

    Accepts whatever a broker of any version since magic 2 writes (see the notes above) and reports
    what none writes: partial or excess entries, entries past the log or at no batch, offsets or
    positions that do not increase, time entries outside a batch with their timestamp or above the
    segment's largest, and, for a closed segment, a preallocated tail or a missing closing entry.
    ``closed=None`` decides from the directory: the segment with the highest base offset is active.
    Index files are read in bounded chunks; the segment is read, not mapped.

    Batch CRCs and invalid trailing bytes are the segment summary's business, not checked here.
    """
    path = Path(log_path)
    base_offset = _base_offset_of(path)
    if closed is None:
        closed = not is_active_segment(path)
    batches = scan_batches(read_segment(path), verify_crc=False).batches
    offset_path, time_path = index_paths(path)
    findings: list[IndexFinding] = []

    by_position = {b.position: i for i, b in enumerate(batches)}
    last_offsets = [b.last_offset for b in batches]
    by_last_offset = {o: i for i, o in enumerate(last_offsets)}
    running_max: list[int] = []
    for b in batches:
        running_max.append(max(b.max_timestamp, running_max[-1] if running_max else NO_TIMESTAMP))
    segment_last = last_offsets[-1] if batches else None
    largest = running_max[-1] if running_max else NO_TIMESTAMP

    def out_of_range(offset: int) -> str | None:
        if segment_last is None:
            return f"offset {offset} is indexed but the segment holds no batches"
        if not base_offset <= offset <= segment_last:
            return f"offset {offset} is outside the segment's offsets [{base_offset}, {segment_last}]"
        return None

    raw = _read_for_verify(offset_path, _OFFSET_ENTRY, 0, "offset index", closed, len(batches), findings)
    if raw is not None:
        p = os.fspath(offset_path)
        prev: OffsetPosition | None = None
        append_end = -1  # index of the last batch the previous entry's append covered
        for i, (rel, position) in enumerate(raw):
            e = OffsetPosition(base_offset + rel, position)
            at = i * OFFSET_ENTRY_SIZE
            if prev is not None and e.offset <= prev.offset:
                findings.append(IndexFinding(p, at, f"offset {e.offset} does not increase on the previous entry's {prev.offset}"))
            if prev is not None and e.position <= prev.position:
                findings.append(IndexFinding(p, at, f"position {e.position} does not increase on the previous entry's {prev.position}"))
            prev = e
            if (problem := out_of_range(e.offset)) is not None:
                findings.append(IndexFinding(p, at, problem))
                continue
            k = by_position.get(e.position)
            if k is None:
                findings.append(IndexFinding(p, at, f"offset {e.offset} points at byte {e.position} of the log, where no batch starts"))
                continue
            batch = batches[k]
            end = by_last_offset.get(e.offset)
            if end is None or end < k:
                findings.append(IndexFinding(
                    p, at, f"offset {e.offset} points at the batch at byte {e.position} (offsets "
                    f"{batch.base_offset}..{batch.last_offset}), but is not the last offset of that batch or of a later one",
                ))
            elif k <= append_end:
                findings.append(IndexFinding(
                    p, at, f"position {e.position} lies inside the batches the previous entry's append covered "
                    f"(through byte {batches[append_end].position})",
                ))
            else:
                append_end = end

    raw = _read_for_verify(time_path, _TIME_ENTRY, 1, "time index", closed, len(batches), findings)
    if raw is not None:
        p = os.fspath(time_path)
        prev_t: TimestampOffset | None = None
        for i, (timestamp, rel) in enumerate(raw):
            e = TimestampOffset(timestamp, base_offset + rel)
            at = i * TIME_ENTRY_SIZE
            if prev_t is not None:
                if e.offset <= prev_t.offset:
                    findings.append(IndexFinding(p, at, f"offset {e.offset} does not increase on the previous entry's {prev_t.offset}"))
                if e.timestamp < prev_t.timestamp:
                    findings.append(IndexFinding(p, at, f"timestamp {e.timestamp} goes backwards from the previous entry's {prev_t.timestamp}"))
                elif e.timestamp == prev_t.timestamp:
                    findings.append(IndexFinding(
                        p, at, f"timestamp {e.timestamp} repeats the previous entry's (the broker appends only greater timestamps)"
                    ))
            prev_t = e
            if (problem := out_of_range(e.offset)) is not None:
                findings.append(IndexFinding(p, at, problem))
                continue
            if e.timestamp > largest:
                findings.append(IndexFinding(p, at, f"timestamp {e.timestamp} is above the segment's largest timestamp {largest}"))
                continue
            k = bisect.bisect_left(last_offsets, e.offset)
            batch = batches[k]
            if batch.base_offset > e.offset:
                findings.append(IndexFinding(
                    p, at, f"offset {e.offset} is in no batch (the next batch, at byte {batch.position}, holds offsets "
                    f"{batch.base_offset}..{batch.last_offset})",
                ))
            elif batch.max_timestamp != e.timestamp:
                findings.append(IndexFinding(
                    p, at, f"timestamp {e.timestamp} at offset {e.offset}, but the batch holding that offset (at byte "
                    f"{batch.position}, offsets {batch.base_offset}..{batch.last_offset}) has largest timestamp {batch.max_timestamp}",
                ))
            elif k > 0 and running_max[k - 1] > e.timestamp:
                findings.append(IndexFinding(
                    p, at, f"timestamp {e.timestamp} at offset {e.offset}, but an earlier batch already has timestamp "
                    f"{running_max[k - 1]} (time lookups would skip it)",
                ))
        if closed and largest != NO_TIMESTAMP:
            if not raw:
                findings.append(IndexFinding(p, 0, f"closed segment's time index is empty, but the segment's largest timestamp is {largest}"))
            elif raw[-1][0] != largest:
                findings.append(IndexFinding(
                    p, (len(raw) - 1) * TIME_ENTRY_SIZE,
                    f"closed segment's last time entry has timestamp {raw[-1][0]}, not the segment's largest {largest} "
                    "(the roll appends it; time-based retention reads it)",
                ))
    return findings


# --- lookup -------------------------------------------------------------------------------------


def lookup_offset(entries: Sequence[OffsetPosition], target_offset: int, base_offset: int) -> OffsetPosition:
    """Where to start scanning for ``target_offset``: the largest entry with offset <= target, else (base, 0)."""
    i = bisect.bisect_right(entries, target_offset, key=lambda e: e.offset) - 1
    return entries[i] if i >= 0 else OffsetPosition(base_offset, 0)


def lookup_timestamp(entries: Sequence[TimestampOffset], target_timestamp: int, base_offset: int) -> TimestampOffset:
    """Where to start scanning for ``target_timestamp``: the largest entry with timestamp <= target,
    else (NO_TIMESTAMP, base offset).

    Scan from the batch holding the returned offset (find it with :func:`lookup_offset`): no record
    with timestamp >= target sits before that batch (KIP-33).
    """
    i = bisect.bisect_right(entries, target_timestamp, key=lambda e: e.timestamp) - 1
    return entries[i] if i >= 0 else TimestampOffset(NO_TIMESTAMP, base_offset)
