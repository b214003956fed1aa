"""A partition's remote log index in the remote tier: versioned file sets, and the pointer that
names the current ones.

Under ``<partition prefix>remote-log-index/``::

    <version>/<20-digit base offset>.remoteLogIndex   (and .remoteOffsetIndex, .remoteTimeIndex)
    current                                           the pointer (manifest.encode_index_pointer)

The files are the seeds' (:mod:`kts_resources.reading.remote_index`), byte for byte; only where they live
is new. A version is ``<12-digit generation>-<8 random hex digits>``, so no two builds — not even
two that lost track of each other — write the same key.

**Writing** (:func:`update_partition_index`) happens under the partition lock, so builders beside
different brokers take turns: each starts from the tier's current file sets (fetched into its cache
first), adds the segments finished since, and publishes. A file set it did not change keeps its
version; a new or changed one goes up under a new version, never over an existing key; the pointer
goes last, in one atomic write (a rename on a filesystem tier, one PUT on S3). A reader therefore
always finds a complete set. What nothing names any more stays until ``kts scrub`` removes it after
its grace period (a reader that read the previous pointer may still be fetching it).

**Reading** (:func:`sync_cache`): the cache directory is made to hold the pointer's file sets — a set
whose local files have the sizes and CRC-32Cs the pointer records is kept, any other is fetched
and checked against them, sets it does not name are removed.

**The flat layout** of earlier kts versions (files straight under ``remote-log-index/``, rewritten
in place): while no pointer exists those files are the index, fetched when the cache has none.
The first build seeds its entries from them and publishes them as versioned sets; the scrub
removes the flat files once a pointer exists and they are past its grace period.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.kafka.crc import crc32c

from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.remote_log import RemoteLogSegmentMetadata, RemoteLogSegmentState, RemoteResourceNotFoundError, TopicIdPartition
from kts_resources.remote_storage.manifest import (
    INDEX_FILE_KINDS,
    IndexFileSetRef,
    IndexPointer,
    ManifestError,
    decode_index_pointer,
    encode_index_pointer,
)

if TYPE_CHECKING:
    from kts_resources.metadata.store import PartitionLock, RemoteLogMetadataStore
    from kts_resources.remote_storage.base import ObjectInfo, RemoteStorageManager

log = logging.getLogger(__name__)

IndexPointerError = ManifestError  # a pointer that does not decode, or names another partition


def _file_name(base_offset: int, kind: str) -> str:
    return f"{base_offset:020d}.{kind}"


# --- the pointer ---------------------------------------------------------------------------------


def read_pointer(rsm: "RemoteStorageManager", tip: TopicIdPartition) -> IndexPointer | None:
    """The partition's current pointer; None when there is none (nothing built yet, or only the
    flat layout). IndexPointerError (naming the object) for a damaged one."""
    key = rsm.keys.remote_index_pointer_key(tip)
    try:
        data = rsm.fetch_object(key)
    except RemoteResourceNotFoundError:
        return None
    pointer = decode_index_pointer(data, where=rsm.location(key))
    if pointer.topic_id_partition != tip:
        raise IndexPointerError(f"{rsm.location(key)}: damaged remote log index pointer: it names "
                                f"{pointer.topic_id_partition}, not {tip}")
    return pointer


def _local_ref(directory: Path, base_offset: int, version: str) -> tuple[IndexFileSetRef, dict[str, bytes]]:
    """The local file set at ``base_offset`` as a pointer would name it under ``version``, and its bytes."""
    contents = {kind: (directory / _file_name(base_offset, kind)).read_bytes() for kind in INDEX_FILE_KINDS}
    return IndexFileSetRef(base_offset, version, {k: (len(d), crc32c(d)) for k, d in contents.items()}), contents


def _matches(directory: Path, ref: IndexFileSetRef) -> bool:
    try:
        local, _ = _local_ref(directory, ref.base_offset, ref.version)
    except OSError:
        return False
    return local.files == dict(ref.files)


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheSync:
    """What :func:`sync_cache` found and did."""

    pointer: IndexPointer | None
    fetched: int = 0  # files fetched
    removed: int = 0  # local files of sets the pointer does not name

    @property
    def changed(self) -> bool:
        return bool(self.fetched or self.removed)


def sync_cache(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition) -> CacheSync:
    """Make the cache in ``directory`` hold the tier's current file sets (see the module docstring).
    IndexPointerError for a damaged pointer; RemoteStorageError / OSError as the tier and the disk fail."""
    with index_cache.cache_lock(directory):
        return _sync_locked(directory, rsm, tip)


def _sync_locked(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition) -> CacheSync:
    for attempt in range(2):
        pointer = read_pointer(rsm, tip)
        if pointer is None:
            return CacheSync(None, fetched=_fetch_flat_layout(directory, rsm, tip))
        try:
            fetched = sum(_fetch_file_set(directory, rsm, tip, ref) for ref in pointer.file_sets
                          if not _matches(directory, ref))
        except RemoteResourceNotFoundError:
            if attempt:
                raise
            continue  # a newer build replaced the pointer and the scrub took the old sets: read it again
        named = {ref.base_offset for ref in pointer.file_sets}
        removed = 0
        for base in ri.file_set_offsets(directory):
            if base not in named:
                for kind in INDEX_FILE_KINDS:
                    (directory / _file_name(base, kind)).unlink(missing_ok=True)
                    removed += 1
        return CacheSync(pointer, fetched, removed)
    raise AssertionError("unreachable")


def _fetch_file_set(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition, ref: IndexFileSetRef) -> int:
    """The three files of ``ref`` into ``directory``, each checked against the pointer's CRC-32C
    before it replaces the local one."""
    for kind in INDEX_FILE_KINDS:
        name = _file_name(ref.base_offset, kind)
        size, crc = ref.files[kind]
        data = rsm.fetch_object(rsm.keys.remote_index_key(tip, name, ref.version), verify_checksum=f"{crc:08x}")
        if len(data) != size:
            raise IndexPointerError(f"{rsm.location(rsm.keys.remote_index_key(tip, name, ref.version))}: {len(data)} bytes, "
                                    f"the remote log index pointer says {size}")
        index_cache.write_atomically(directory / name, data)
    return len(INDEX_FILE_KINDS)


def _fetch_flat_layout(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition) -> int:
    """Without a pointer: the flat layout's files, when this machine has none of the partition's."""
    if ri.file_set_offsets(directory):
        return 0
    fetched = 0
    for obj in rsm.list_objects(rsm.keys.remote_index_prefix(tip)):
        parsed = rsm.keys.parse_remote_index_key(obj.key)
        if parsed is not None and parsed.version is None and parsed.file_name is not None:
            index_cache.write_atomically(directory / parsed.file_name, rsm.fetch_object(obj.key))
            fetched += 1
    return fetched


# --- writing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Publication:
    """A pointer written: it and how many files went up with it."""

    pointer: IndexPointer
    uploaded: int


def publish(directory: Path, rsm: "RemoteStorageManager", tip: TopicIdPartition, current: IndexPointer | None, *,
            lock: "PartitionLock | None" = None) -> Publication | None:
    """Name the file sets in ``directory`` as the partition's current index, ``current`` being the
    pointer the cache was synced to (None: there is none). Sets it names with the same bytes keep
    their version; the others go up under a new one; the pointer last (after ``lock`` is checked
    still held). None when ``current`` already says exactly this: nothing is written."""
    generation = current.generation + 1 if current is not None else 1
    version = f"{generation:012d}-{secrets.token_hex(4)}"
    named = {ref.base_offset: ref for ref in current.file_sets} if current is not None else {}
    refs: list[IndexFileSetRef] = []
    uploads: list[tuple[IndexFileSetRef, dict[str, bytes]]] = []
    for base in ri.file_set_offsets(directory):
        local, contents = _local_ref(directory, base, version)
        old = named.get(base)
        if old is not None and dict(old.files) == local.files:
            refs.append(old)
        else:
            refs.append(local)
            uploads.append((local, contents))
    if current is not None and tuple(refs) == current.file_sets:
        return None
    for ref, contents in uploads:
        for kind, data in contents.items():
            rsm.put_object(rsm.keys.remote_index_key(tip, _file_name(ref.base_offset, kind), version), data)
    if lock is not None:
        lock.assert_held()  # a builder that lost the lock must not name its sets over another's
    pointer = IndexPointer(tip, generation, tuple(refs))
    rsm.put_object(rsm.keys.remote_index_pointer_key(tip), encode_index_pointer(pointer))
    return Publication(pointer, len(uploads) * len(INDEX_FILE_KINDS))


@dataclass(frozen=True)
class IndexUpdate:
    """One :func:`update_partition_index`: the local build, the pointer now current, and whether
    this update wrote it."""

    build: index_cache.IndexBuild
    pointer: IndexPointer | None
    published: Publication | None
    fetched: int  # files fetched from the tier first

    @property
    def uploaded(self) -> int:
        return self.published.uploaded if self.published is not None else 0


def update_partition_index(
    store: "RemoteLogMetadataStore",
    rsm: "RemoteStorageManager",
    directory: Path,
    tip: TopicIdPartition,
    entries_for: Callable[[RemoteLogSegmentMetadata], list[ri.RemoteLogIndexEntry]],
    *,
    rotate_bytes: int = ri.DEFAULT_ROTATE_BYTES,
    rotate_ms: int = ri.DEFAULT_ROTATE_MS,
    fresh: bool = False,
    lock_timeout_s: float | None = None,
) -> IndexUpdate:
    """Bring the partition's remote log index, in the tier and in ``directory``, up to its
    COPY_SEGMENT_FINISHED segments, under the partition lock: the tier's current sets fetched into
    the cache, each finished segment's entries taken from the cache (``segments/``), else from
    those files where they cover it whole, else ``entries_for``; the files laid out as
    :func:`remote_index_cache.build_partition_index` does (``fresh``: afresh, and no entries taken
    from the files), and what changed published. A damaged pointer is replaced (logged)."""
    with store.partition_lock(tip, timeout_s=lock_timeout_s) as lock, index_cache.cache_lock(directory):
        finished = store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
        try:
            synced = _sync_locked(directory, rsm, tip)
        except IndexPointerError as e:
            log.warning("%s; this build replaces it", e)
            synced = CacheSync(None)
        if not fresh:
            index_cache.seed_entries_from_files(directory, finished, rsm)
        build = index_cache.build_partition_index(directory, finished, entries_for, rotate_bytes=rotate_bytes,
                                                  rotate_ms=rotate_ms, fresh=fresh)
        published = publish(directory, rsm, tip, synced.pointer, lock=lock)
    return IndexUpdate(build, published.pointer if published is not None else synced.pointer, published, synced.fetched)


# --- what the scrub may remove -------------------------------------------------------------------


@dataclass(frozen=True)
class UnnamedIndexObjects:
    """A partition's index objects no pointer names: ``removable`` past the grace period, ``young``
    (count) within it."""

    removable: list[str]
    young: int


def unnamed_index_objects(rsm: "RemoteStorageManager", tip: TopicIdPartition, objects: Sequence["ObjectInfo"], *,
                          now: float, grace_s: float) -> UnnamedIndexObjects:
    """Of ``objects`` (the partition's listed remote log index objects), those nothing names: files
    of versioned sets the current pointer does not name (all of them while there is no pointer), and
    — once a pointer exists — the flat layout's files. Never the pointer, and never a file of a set
    it names. Read the pointer after the listing: a set it no longer names is never named again (a
    build only keeps what the pointer it started from named), and one uploaded since the listing is
    not in it. IndexPointerError for a damaged pointer: then nothing is removable."""
    pointer = read_pointer(rsm, tip)
    named = pointer.named() if pointer is not None else set()
    removable: list[str] = []
    young = 0
    for obj in objects:
        parsed = rsm.keys.parse_remote_index_key(obj.key)
        if parsed is None or parsed.pointer:
            continue
        if parsed.version is None:
            if pointer is None:
                continue  # the flat layout is still the partition's index
        elif (parsed.base_offset, parsed.version) in named:
            continue
        if obj.last_modified is None or now - obj.last_modified < grace_s:
            young += 1
        else:
            removable.append(obj.key)
    return UnnamedIndexObjects(removable, young)


def index_objects_by_partition(rsm: "RemoteStorageManager", listing: Iterable["ObjectInfo"]) -> dict[TopicIdPartition, list["ObjectInfo"]]:
    """The remote log index objects of ``listing``, by partition."""
    out: dict[TopicIdPartition, list] = {}
    for obj in listing:
        parsed = rsm.keys.parse_remote_index_key(obj.key)
        if parsed is not None:
            out.setdefault(parsed.topic_id_partition, []).append(obj)
    return out
