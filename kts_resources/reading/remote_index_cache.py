"""A partition's remote log index on this machine, under ``KTS_HOME``.

The files (:mod:`kts_resources.reading.remote_index`) live in
``KTS_HOME/remote-log-index/<topic>-<topic id>/<partition>/``: a copy of the file sets the remote
tier names as current (:mod:`kts_resources.reading.remote_index_tier` ships and fetches them). Each remote
segment's entries are also kept on their own (``segments/<segment id>.entries``), so an incremental
build reads only the segments that are new since the last one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.reading import remote_index as ri
from kts_resources.kafka.records import scan_batches
from kts_resources.reading.remote_index_check import segment_coverage_problems
from kts_resources.remote_log import RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.remote_storage.keys import ObjectKeys

if TYPE_CHECKING:
    from kts_resources.remote_storage.base import RemoteStorageManager

CACHE_DIR = "remote-log-index"
SEGMENTS_DIR = "segments"
ENTRIES_SUFFIX = ".entries"


def cache_directory(home: Path, tip: TopicIdPartition) -> Path:
    """Where the partition's remote log index files are kept on this machine."""
    return Path(home) / CACHE_DIR / ObjectKeys().partition_prefix(tip)


# --- one segment's entries ----------------------------------------------------------------------


def segment_entries_from_bytes(data: bytes | memoryview, md: RemoteLogSegmentMetadata, key: str, *,
                               chunk_bytes: int = ri.DEFAULT_CHUNK_BYTES, where: str) -> list[ri.RemoteLogIndexEntry]:
    """The entries of a remote segment whose .log bytes are ``data``: its batches must frame the
    whole object and pass their CRCs (ValueError naming ``where`` and the position otherwise)."""
    scan = scan_batches(data, verify_crc=True)
    if scan.invalid is not None:
        raise ValueError(f"{where}: byte {scan.invalid.position}: {scan.invalid.reason}")
    for h in scan.batches:
        if not h.crc_ok:
            raise ValueError(f"{where}: byte {h.position}: the batch at offset {h.base_offset} fails its CRC")
    if len(data) != md.segment_size_in_bytes:
        raise ValueError(f"{where}: {len(data)} bytes, the segment's metadata says {md.segment_size_in_bytes}")
    return ri.segment_entries(scan.batches, segment_id=md.segment_id.id, key=key, chunk_bytes=chunk_bytes)


def read_segment_entries(rsm: "RemoteStorageManager", md: RemoteLogSegmentMetadata, *, local_log: Path | None = None,
                         chunk_bytes: int = ri.DEFAULT_CHUNK_BYTES) -> list[ri.RemoteLogIndexEntry]:
    """A remote segment's entries: from the local copy when it is still there with the same size
    (the bytes the copy uploaded; no remote read), else from the remote object read once."""
    key = rsm.segment_object_keys(md)["log"]
    if local_log is not None:
        try:
            if local_log.stat().st_size == md.segment_size_in_bytes:
                with open(local_log, "rb") as f:
                    return segment_entries_from_bytes(f.read(), md, key, chunk_bytes=chunk_bytes, where=str(local_log))
        except OSError:
            pass  # gone since it was listed (local retention): read the remote copy
    data = rsm.fetch_range(key, 0, None)
    return segment_entries_from_bytes(data, md, key, chunk_bytes=chunk_bytes, where=rsm.location(key))


def encode_segment_entries(entries: Iterable[ri.RemoteLogIndexEntry]) -> bytes:
    return b"".join(e.encode() for e in entries)


def decode_segment_entries(data: bytes, *, path: str | os.PathLike | None = None) -> list[ri.RemoteLogIndexEntry]:
    return [e for _p, e in ri.decode_entries(data, path=path)]


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- the partition's files ----------------------------------------------------------------------


@dataclass(frozen=True)
class IndexBuild:
    """What one build of a partition's remote log index did."""

    segments: int
    entries: int
    bytes_indexed: int
    index_bytes: int
    file_sets: int
    written: list[str]
    removed: list[str]
    new_segments: int


def cached_segment_ids(directory: Path) -> set[uuid.UUID]:
    out = set()
    try:
        names = os.listdir(directory / SEGMENTS_DIR)
    except FileNotFoundError:
        return out
    for name in names:
        if name.endswith(ENTRIES_SUFFIX):
            try:
                out.add(uuid.UUID(name[: -len(ENTRIES_SUFFIX)]))
            except ValueError:
                pass
    return out


def store_segment_entries(directory: Path, segment_id: uuid.UUID, encoded: bytes) -> None:
    write_atomically(directory / SEGMENTS_DIR / f"{segment_id}{ENTRIES_SUFFIX}", encoded)


def build_partition_index(
    directory: Path,
    finished: Sequence[RemoteLogSegmentMetadata],
    entries_for: Callable[[RemoteLogSegmentMetadata], list[ri.RemoteLogIndexEntry]],
    *,
    rotate_bytes: int = ri.DEFAULT_ROTATE_BYTES,
    rotate_ms: int = ri.DEFAULT_ROTATE_MS,
    fresh: bool = False,
) -> IndexBuild:
    """Bring the partition's index files in ``directory`` up to ``finished`` (its
    COPY_SEGMENT_FINISHED segments): segments without cached entries are read through
    ``entries_for``; segments no longer finished roll out (their cached entries too); files that
    stay the same are not rewritten. ``fresh``: ignore the current files' boundaries."""
    finished = sorted(finished, key=lambda md: md.start_offset)
    have = cached_segment_ids(directory)
    per_segment: list[list[ri.RemoteLogIndexEntry]] = []
    new = 0
    for md in finished:
        path = directory / SEGMENTS_DIR / f"{md.segment_id.id}{ENTRIES_SUFFIX}"
        entries: list[ri.RemoteLogIndexEntry] | None = None
        if md.segment_id.id in have:
            try:
                entries = decode_segment_entries(path.read_bytes(), path=path)
            except (OSError, ri.RemoteIndexFormatError):
                entries = None  # damaged cache: read the segment again
            if entries is not None and segment_coverage_problems(md, entries):
                entries = None  # whole entries that no longer cover the segment (cut short): read it again
        if entries is None:
            entries = entries_for(md)
            store_segment_entries(directory, md.segment_id.id, encode_segment_entries(entries))
            new += 1
        per_segment.append(entries)
    boundaries: list[int] = []
    kept_end = -1
    if not fresh:
        for base in ri.file_set_offsets(directory):
            boundaries.append(base)
        if boundaries:
            kept_end = _last_offset_of(directory, boundaries[-1])
    file_sets = ri.layout(per_segment, rotate_bytes=rotate_bytes, rotate_ms=rotate_ms,
                          kept_boundaries=boundaries, kept_end_offset=kept_end)
    written, removed = ri.write_file_sets(directory, file_sets)
    finished_ids = {md.segment_id.id for md in finished}
    for stale in have - finished_ids:
        (directory / SEGMENTS_DIR / f"{stale}{ENTRIES_SUFFIX}").unlink(missing_ok=True)
    return IndexBuild(
        segments=len(finished), entries=sum(len(e) for e in per_segment),
        bytes_indexed=sum(e.data_length for es in per_segment for e in es),
        index_bytes=sum(len(fs.log_index) + len(fs.offset_index) + len(fs.time_index) for fs in file_sets),
        file_sets=len(file_sets), written=written, removed=removed, new_segments=new)


def _last_offset_of(directory: Path, base_offset: int) -> int:
    try:
        data = (directory / f"{base_offset:020d}{ri.LOG_INDEX_SUFFIX}").read_bytes()
        entries = ri.decode_entries(data)
    except (OSError, ri.RemoteIndexFormatError):
        return -1
    return entries[-1][1].last_offset if entries else -1


# --- the cache directory's lock ----------------------------------------------------------------


@contextlib.contextmanager
def cache_lock(directory: Path) -> Iterator[None]:
    """Hold this machine's lock on the partition's cache directory: a build and a reader's refresh
    from the tier on one machine write the same files, one at a time (readers of the files take
    no lock: each file is replaced whole)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)  # the directory itself: no lock file among the index files
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# --- entries from the partition's files ----------------------------------------------------------


def seed_entries_from_files(directory: Path, finished: Iterable[RemoteLogSegmentMetadata], rsm: "RemoteStorageManager") -> int:
    """Cache each finished segment's entries from the partition's index files in ``directory``
    when they cover the whole segment (positions from 0 to its size, its .log key, within its
    offsets), so a build does not read the segment again. Returns how many were cached."""
    have = cached_segment_ids(directory)
    wanted = {md.segment_id.id: md for md in finished if md.segment_id.id not in have}
    if not wanted:
        return 0
    grouped: dict[uuid.UUID, list[ri.RemoteLogIndexEntry]] = defaultdict(list)
    for base in ri.file_set_offsets(directory):
        try:
            entries = ri.decode_entries((directory / f"{base:020d}{ri.LOG_INDEX_SUFFIX}").read_bytes())
        except (OSError, ri.RemoteIndexFormatError):
            continue  # a damaged file: its segments are read again
        for _position, entry in entries:
            if entry.segment_id in wanted:
                grouped[entry.segment_id].append(entry)
    cached = 0
    for segment_id, entries in grouped.items():
        md = wanted[segment_id]
        key = rsm.segment_object_keys(md)["log"]
        entries.sort(key=lambda e: e.rdi.position)
        position = 0
        whole = entries[0].first_offset >= md.start_offset and entries[-1].last_offset <= md.end_offset
        for entry in entries:
            whole = whole and entry.rdi.key == key and entry.rdi.position == position
            position += entry.data_length
        if whole and position == md.segment_size_in_bytes:
            store_segment_entries(directory, segment_id, encode_segment_entries(entries))
            cached += 1
    return cached
