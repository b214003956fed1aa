"""A partition's remote log index on disk under ``KTS_HOME`` and in the remote tier.

The files (:mod:`kts_resources.remote_index`) live in
``KTS_HOME/remote-log-index/<topic>-<topic id>/<partition>/`` and are shipped beside the segments
under ``<partition prefix>remote-log-index/``, so any node can fetch its copy. Each remote segment's
entries are also kept on their own (``segments/<segment id>.entries``), so an incremental build
reads only the segments that are new since the last one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources import remote_index as ri
from kts_resources.kafka.records import scan_batches
from kts_resources.remote_index_check import segment_coverage_problems
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


def _write_atomically(path: Path, data: bytes) -> None:
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
    _write_atomically(directory / SEGMENTS_DIR / f"{segment_id}{ENTRIES_SUFFIX}", encoded)


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


# --- shipping -----------------------------------------------------------------------------------


def publish(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition, build: IndexBuild) -> None:
    """Ship what the build wrote and remove what it removed, so the tier holds the same files.
    New files go up before old ones are deleted: a reader of the tier never finds a gap."""
    for name in build.written:
        rsm.put_object(rsm.keys.remote_index_key(tip, name), directory / name)
    if build.removed:
        rsm.delete_objects(rsm.keys.remote_index_key(tip, name) for name in build.removed)


def ensure_cached(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition) -> int:
    """When this machine has none of the partition's index files, fetch them from the tier (as
    shipped by whichever node built them). Returns how many files were fetched."""
    if ri.file_set_offsets(directory):
        return 0
    prefix = rsm.keys.remote_index_prefix(tip)
    fetched = 0
    for obj in rsm.list_objects(prefix):
        name = obj.key[len(prefix):]
        if ri.file_base_offset(name) is None or "/" in name:
            continue
        _write_atomically(directory / name, rsm.fetch_object(obj.key))
        fetched += 1
    return fetched
