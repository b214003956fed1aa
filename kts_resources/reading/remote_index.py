"""The seeds' remote log index (KAFKA_FORMATS.md §8): remoteLogIndex, remoteOffsetIndex and
remoteTimeIndex files of one partition, pure (no Dagster, no I/O beyond the files asked for).

**remoteLogIndex** — a run of entries, each big-endian::

    magic int16 (0) | length int16 (of the whole entry) | crc int32 (CRC-32C of firstOffset..end)
    firstOffset int64 | lastOffset int64 | firstTimestamp int64 | lastTimestamp int64
    dataLength int32 | rdiLength int16 | rdi bytes

An entry covers a run of whole batches of one remote segment, cut at ``chunk_bytes`` (a batch larger
than that is one entry of its own), so a fetch reads one entry's bytes with one ranged GET.
``firstOffset`` is the first batch's base offset and ``lastOffset`` the last batch's last offset;
``firstTimestamp`` is the first batch's base timestamp and ``lastTimestamp`` the *largest* timestamp
of any batch in the entry (the batches' maxTimestamp, as a time index keeps the largest so far), so a
search by time needs nothing else. −1 where a batch carries no timestamp (magic 0).
CRC-32C is Kafka's checksum of batches; the seeds name no algorithm.

**RDI** (remote data identifier), version 0, big-endian::

    version int8 (0) | segment id 16 bytes (the RemoteLogSegmentId's UUID) | position int32
    | the segment's .log object key, UTF-8, to the end of the RDI

``position`` is the entry's first byte in that object and ``dataLength`` its length; the segment id
lets a reader skip an entry whose segment is no longer COPY_SEGMENT_FINISHED (deleted or re-copied).
The key is the full key as the metadata store records it.

**remoteOffsetIndex** — 8-byte entries: relativeOffset int32 (an entry's firstOffset minus the
file's base offset) | position int32 (the entry's byte position in the remoteLogIndex file); one per
entry, ascending. **remoteTimeIndex** — 12-byte entries: timestamp int64 | position int32: the
largest lastTimestamp so far, appended only when it grows (as Kafka's time index), pointing at the
entry where it grew — so the first time entry with timestamp ≥ T names the first log-index entry
that can hold a record at or after T (KIP-33's guarantee, exactly).

**Files** are named ``<20-digit base offset>.remoteLogIndex`` (and ``.remoteOffsetIndex``,
``.remoteTimeIndex``), the base offset being the file's first entry's firstOffset. A file holds the
entries of whole segments; a new file starts at a segment when the current one would pass
``rotate_bytes``, when the segment's largest timestamp is more than ``rotate_ms`` after the file's
first timestamp (record time, never wall-clock time, so a rebuild writes the same files), or when an
offset would not fit the int32 relative offset.
"""

from __future__ import annotations

import bisect
import os
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kts_resources.kafka.crc import crc32c

from kts_resources.kafka.errors import KafkaFormatError

MAGIC = 0
RDI_VERSION = 0
LOG_INDEX_SUFFIX = ".remoteLogIndex"
OFFSET_INDEX_SUFFIX = ".remoteOffsetIndex"
TIME_INDEX_SUFFIX = ".remoteTimeIndex"
SUFFIXES = (LOG_INDEX_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX)

DEFAULT_CHUNK_BYTES = 1024 * 1024
DEFAULT_ROTATE_BYTES = 16 * 1024 * 1024
DEFAULT_ROTATE_MS = 7 * 24 * 3600 * 1000  # segment.ms's default: one file set per week of records

_PREFIX = struct.Struct(">hhi")  # magic, length, crc
_BODY = struct.Struct(">qqqqih")  # firstOffset, lastOffset, firstTimestamp, lastTimestamp, dataLength, rdiLength
_RDI_HEAD = struct.Struct(">b16si")  # version, segment id, position
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
ENTRY_OVERHEAD = _PREFIX.size + _BODY.size
_MAX_ENTRY = 2**15 - 1  # length is an int16
_INT32_MAX = 2**31 - 1


class RemoteIndexFormatError(KafkaFormatError):
    """A remote index file that is not a whole number of valid entries."""


# --- values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemoteDataId:
    """Where an entry's bytes are: ``data_length`` bytes from ``position`` of object ``key``, the
    .log of remote segment ``segment_id``."""

    segment_id: uuid.UUID
    position: int
    key: str

    def encode(self) -> bytes:
        if not 0 <= self.position <= _INT32_MAX:
            raise ValueError(f"RDI position {self.position} does not fit an int32")
        return _RDI_HEAD.pack(RDI_VERSION, self.segment_id.bytes, self.position) + self.key.encode("utf-8")

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "RemoteDataId":
        if len(data) < _RDI_HEAD.size:
            raise ValueError(f"the RDI has {len(data)} bytes, fewer than its {_RDI_HEAD.size}-byte head")
        version, segment_id, position = _RDI_HEAD.unpack_from(data)
        if version != RDI_VERSION:
            raise ValueError(f"RDI version {version} is not {RDI_VERSION}")
        if position < 0:
            raise ValueError(f"RDI position {position} is negative")
        try:
            key = bytes(data[_RDI_HEAD.size:]).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the RDI's object key is not UTF-8") from None
        return cls(uuid.UUID(bytes=bytes(segment_id)), position, key)


@dataclass(frozen=True, slots=True)
class RemoteLogIndexEntry:
    """One remoteLogIndex entry: whole batches ``first_offset..last_offset`` of one remote segment."""

    first_offset: int
    last_offset: int
    first_timestamp: int
    last_timestamp: int  # the largest batch timestamp in the entry
    data_length: int
    rdi: RemoteDataId

    def encode(self) -> bytes:
        rdi = self.rdi.encode()
        length = ENTRY_OVERHEAD + len(rdi)
        if length > _MAX_ENTRY:
            raise ValueError(f"a remoteLogIndex entry of {length} bytes does not fit its int16 length (object key too long)")
        body = _BODY.pack(self.first_offset, self.last_offset, self.first_timestamp, self.last_timestamp,
                          self.data_length, len(rdi)) + rdi
        return _PREFIX.pack(MAGIC, length, _signed32(crc32c(body))) + body

    @property
    def encoded_size(self) -> int:
        return ENTRY_OVERHEAD + _RDI_HEAD.size + len(self.rdi.key.encode("utf-8"))

    @property
    def segment_id(self) -> uuid.UUID:
        return self.rdi.segment_id


def _signed32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def decode_entry(data: bytes | memoryview, position: int, *, path: str | os.PathLike | None = None) -> tuple[RemoteLogIndexEntry, int]:
    """The entry at ``position`` of a remoteLogIndex file's bytes and the position after it;
    RemoteIndexFormatError naming ``path`` and the position for anything but a whole, valid entry."""

    def bad(message: str) -> RemoteIndexFormatError:
        return RemoteIndexFormatError(message, path=path, position=position)

    remaining = len(data) - position
    if remaining < _PREFIX.size:
        raise bad(f"truncated remoteLogIndex entry: {remaining} bytes left, an entry has at least {ENTRY_OVERHEAD}")
    magic, length, crc = _PREFIX.unpack_from(data, position)
    if magic != MAGIC:
        raise bad(f"remoteLogIndex entry magic is {magic}, expected {MAGIC}")
    if length < ENTRY_OVERHEAD + _RDI_HEAD.size:
        raise bad(f"remoteLogIndex entry length {length} is below the smallest entry ({ENTRY_OVERHEAD + _RDI_HEAD.size})")
    if length > remaining:
        raise bad(f"truncated remoteLogIndex entry: its length is {length}, {remaining} bytes are left")
    body = bytes(data[position + _PREFIX.size:position + length])
    actual = _signed32(crc32c(body))
    if actual != crc:
        raise bad(f"remoteLogIndex entry CRC is {crc & 0xFFFFFFFF:08x}, its bytes give {actual & 0xFFFFFFFF:08x}")
    first_offset, last_offset, first_ts, last_ts, data_length, rdi_length = _BODY.unpack_from(body)
    if rdi_length != length - ENTRY_OVERHEAD:
        raise bad(f"remoteLogIndex entry rdiLength {rdi_length} disagrees with its length {length}")
    if last_offset < first_offset or first_offset < 0:
        raise bad(f"remoteLogIndex entry offsets {first_offset}..{last_offset} are not a range")
    if data_length <= 0:
        raise bad(f"remoteLogIndex entry dataLength {data_length} is not positive")
    try:
        rdi = RemoteDataId.decode(memoryview(body)[_BODY.size:])
    except ValueError as e:
        raise bad(str(e)) from None
    return RemoteLogIndexEntry(first_offset, last_offset, first_ts, last_ts, data_length, rdi), position + length


def decode_entries(data: bytes | memoryview, *, path: str | os.PathLike | None = None) -> list[tuple[int, RemoteLogIndexEntry]]:
    """Every entry of a remoteLogIndex file with its byte position."""
    out: list[tuple[int, RemoteLogIndexEntry]] = []
    position = 0
    while position < len(data):
        entry, after = decode_entry(data, position, path=path)
        out.append((position, entry))
        position = after
    return out


def decode_offset_index(data: bytes | memoryview, base_offset: int, *, path: str | os.PathLike | None = None) -> list[tuple[int, int]]:
    """(first offset, entry position) pairs of a remoteOffsetIndex file, checked ascending."""
    return _decode_pairs(data, _OFFSET_ENTRY, lambda rel: base_offset + rel, "remoteOffsetIndex", path,
                         strictly=True, key_min=base_offset)


def decode_time_index(data: bytes | memoryview, *, path: str | os.PathLike | None = None) -> list[tuple[int, int]]:
    """(timestamp, entry position) pairs of a remoteTimeIndex file, checked ascending."""
    return _decode_pairs(data, _TIME_ENTRY, lambda ts: ts, "remoteTimeIndex", path, strictly=True, key_min=None)


def _decode_pairs(data, entry: struct.Struct, key_of, what: str, path, *, strictly: bool, key_min: int | None) -> list[tuple[int, int]]:
    if len(data) % entry.size:
        whole = len(data) - len(data) % entry.size
        raise RemoteIndexFormatError(f"truncated {what} entry: {len(data) % entry.size} bytes after the last whole "
                                     f"{entry.size}-byte entry", path=path, position=whole)
    out: list[tuple[int, int]] = []
    for i, (k, position) in enumerate(entry.iter_unpack(data)):
        key = key_of(k)
        at = i * entry.size
        if position < 0 or (out and position <= out[-1][1]):
            raise RemoteIndexFormatError(f"{what} entry {i} points at position {position}, not after the previous entry's",
                                         path=path, position=at)
        if (key_min is not None and key < key_min) or (out and (key <= out[-1][0] if strictly else key < out[-1][0])):
            raise RemoteIndexFormatError(f"{what} entry {i} ({key}) does not grow from the previous one", path=path, position=at)
        out.append((key, position))
    return out


# --- building -----------------------------------------------------------------------------------


def segment_entries(
    batches: Iterable,
    *,
    segment_id: uuid.UUID,
    key: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[RemoteLogIndexEntry]:
    """The entries of one remote segment from its batch headers in file order (anything with
    ``position``, ``size``, ``base_offset``, ``last_offset``, ``base_timestamp``, ``max_timestamp``):
    runs of whole, contiguous batches of at most ``chunk_bytes`` (a larger batch alone)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk size {chunk_bytes} is not positive")
    entries: list[RemoteLogIndexEntry] = []
    run: list = []
    run_bytes = 0

    def close() -> None:
        first, last = run[0], run[-1]
        entries.append(RemoteLogIndexEntry(
            first_offset=first.base_offset, last_offset=last.last_offset,
            first_timestamp=first.base_timestamp, last_timestamp=max(b.max_timestamp for b in run),
            data_length=run_bytes, rdi=RemoteDataId(segment_id, first.position, key)))

    for batch in batches:
        if run and (run_bytes + batch.size > chunk_bytes or batch.position != run[-1].position + run[-1].size):
            close()
            run, run_bytes = [], 0
        run.append(batch)
        run_bytes += batch.size
    if run:
        close()
    return entries


@dataclass
class IndexFileSet:
    """One remoteLogIndex file and its two indexes, as bytes, named by ``base_offset``."""

    base_offset: int
    log_index: bytearray = field(default_factory=bytearray)
    offset_index: bytearray = field(default_factory=bytearray)
    time_index: bytearray = field(default_factory=bytearray)
    first_timestamp: int = -1
    max_timestamp: int = -1
    last_offset: int = -1
    segment_ids: list[uuid.UUID] = field(default_factory=list)

    def append_segment(self, entries: Sequence[RemoteLogIndexEntry]) -> None:
        for entry in entries:
            position = len(self.log_index)
            self.log_index += entry.encode()
            self.offset_index += _OFFSET_ENTRY.pack(entry.first_offset - self.base_offset, position)
            if entry.last_timestamp > self.max_timestamp:
                self.max_timestamp = entry.last_timestamp
                self.time_index += _TIME_ENTRY.pack(entry.last_timestamp, position)
            if self.first_timestamp < 0:
                self.first_timestamp = entry.first_timestamp
            self.last_offset = entry.last_offset
        if entries:
            self.segment_ids.append(entries[0].segment_id)

    def files(self) -> dict[str, bytes]:
        """File name → content."""
        stem = f"{self.base_offset:020d}"
        return {stem + LOG_INDEX_SUFFIX: bytes(self.log_index), stem + OFFSET_INDEX_SUFFIX: bytes(self.offset_index),
                stem + TIME_INDEX_SUFFIX: bytes(self.time_index)}


def layout(
    segments: Sequence[Sequence[RemoteLogIndexEntry]],
    *,
    rotate_bytes: int = DEFAULT_ROTATE_BYTES,
    rotate_ms: int = DEFAULT_ROTATE_MS,
    kept_boundaries: Iterable[int] = (),
    kept_end_offset: int = -1,
) -> list[IndexFileSet]:
    """The file sets for the entries of ``segments`` (each one segment's entries, ascending by offset).

    A fresh build rotates greedily. ``kept_boundaries`` (the base offsets of the current files) and
    ``kept_end_offset`` (their last offset) make an incremental build keep the files it has: a
    segment already covered starts a file exactly where one started before, so when the oldest
    segments go (retention) only the file that held them is rewritten; segments past
    ``kept_end_offset`` follow the rotation rule.
    """
    boundaries = set(kept_boundaries)
    out: list[IndexFileSet] = []
    for entries in segments:
        if not entries:
            continue
        first = entries[0]
        size = sum(e.encoded_size for e in entries)
        current = out[-1] if out else None
        if current is None:
            start_new = True
        elif first.first_offset <= kept_end_offset:
            start_new = first.first_offset in boundaries
        else:
            start_new = (
                len(current.log_index) + size > rotate_bytes
                or max(e.last_timestamp for e in entries) - current.first_timestamp > rotate_ms
                or entries[-1].last_offset - current.base_offset > _INT32_MAX
            )
        if start_new:
            out.append(IndexFileSet(first.first_offset))
        out[-1].append_segment(entries)
    return out


# --- files on disk ------------------------------------------------------------------------------


def file_base_offset(name: str) -> int | None:
    """The base offset a remote index file's name gives, or None for any other file."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            return int(stem) if len(stem) == 20 and stem.isdigit() else None
    return None


def write_file_sets(directory: str | os.PathLike, file_sets: Sequence[IndexFileSet]) -> tuple[list[str], list[str]]:
    """Make ``directory`` hold exactly ``file_sets``: each changed file written to a temporary name
    and renamed into place (a reader never sees half a file), then files of sets no longer there
    removed. Returns (names written, names removed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, bytes] = {}
    for fs in file_sets:
        wanted.update(fs.files())
    written: list[str] = []
    for name, content in wanted.items():
        path = directory / name
        try:
            if path.stat().st_size == len(content) and path.read_bytes() == content:
                continue
        except FileNotFoundError:
            pass
        tmp = directory / f".{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        written.append(name)
    removed = []
    for path in directory.iterdir():
        if file_base_offset(path.name) is not None and path.name not in wanted:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(written), sorted(removed)


@dataclass(frozen=True)
class LoadedFileSet:
    """One file set read back and checked: its entries with positions, and both indexes."""

    base_offset: int
    entries: list[tuple[int, RemoteLogIndexEntry]]
    offset_index: list[tuple[int, int]]
    time_index: list[tuple[int, int]]


def load_file_set(directory: str | os.PathLike, base_offset: int) -> LoadedFileSet:
    """Read and cross-check one file set: every entry valid, the offset index naming each entry
    once, the time index pointing at entries. RemoteIndexFormatError (file, position) otherwise."""
    directory = Path(directory)
    stem = f"{base_offset:020d}"
    paths = [directory / (stem + s) for s in SUFFIXES]
    try:
        log_bytes, offset_bytes, time_bytes = (p.read_bytes() for p in paths)
    except FileNotFoundError as e:
        raise RemoteIndexFormatError("missing: a remote index file set needs all three files", path=e.filename) from None
    entries = decode_entries(log_bytes, path=paths[0])
    offsets = decode_offset_index(offset_bytes, base_offset, path=paths[1])
    times = decode_time_index(time_bytes, path=paths[2])
    expected = [(e.first_offset, pos) for pos, e in entries]
    if offsets != expected:
        at = next((i for i, (a, b) in enumerate(zip(offsets, expected)) if a != b), min(len(offsets), len(expected)))
        raise RemoteIndexFormatError(f"remoteOffsetIndex entry {at} does not match the remoteLogIndex's entries "
                                     f"({len(offsets)} entries for {len(expected)})", path=paths[1], position=at * _OFFSET_ENTRY.size)
    if entries and entries[0][1].first_offset != base_offset:
        raise RemoteIndexFormatError(f"the first entry starts at offset {entries[0][1].first_offset}, the file is named for {base_offset}",
                                     path=paths[0], position=0)
    positions = {pos for pos, _ in entries}
    for i, (_ts, pos) in enumerate(times):
        if pos not in positions:
            raise RemoteIndexFormatError(f"remoteTimeIndex entry {i} points at position {pos}, where no entry starts",
                                         path=paths[2], position=i * _TIME_ENTRY.size)
    return LoadedFileSet(base_offset, entries, offsets, times)


def file_set_offsets(directory: str | os.PathLike) -> list[int]:
    """Base offsets of the file sets in ``directory``, ascending (a missing directory: none)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted({b for n in names if n.endswith(LOG_INDEX_SUFFIX) and (b := file_base_offset(n)) is not None})


# --- lookups ------------------------------------------------------------------------------------


def entry_for_offset(file_set: LoadedFileSet, offset: int) -> int | None:
    """Index (into ``file_set.entries``) of the entry holding ``offset``: the last whose first
    offset ≤ ``offset``, or None when ``offset`` is before the file set."""
    i = bisect.bisect_right(file_set.offset_index, (offset, _INT32_MAX)) - 1
    return i if i >= 0 else None


def entry_for_timestamp(file_set: LoadedFileSet, timestamp: int) -> int | None:
    """Index of the first entry that may hold a record with timestamp ≥ ``timestamp`` (the first
    time entry ≥ it), or None when every record of the file set is older."""
    i = bisect.bisect_left(file_set.time_index, (timestamp, -1))
    if i == len(file_set.time_index):
        return None
    position = file_set.time_index[i][1]
    return bisect.bisect_left(file_set.entries, position, key=lambda pe: pe[0])


def iter_entries(file_sets: Iterable[LoadedFileSet]) -> Iterator[RemoteLogIndexEntry]:
    for fs in file_sets:
        for _pos, entry in fs.entries:
            yield entry
