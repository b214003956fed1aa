"""The remote tier's one interface (Kafka's RemoteStorageManager) and what both backends share.

A backend (filesystem, S3) only moves bytes: put one object atomically, read a range, read a whole
object, delete, list. Everything about segments lives here, once: which objects a segment is, their
keys, the custom metadata (key, size, CRC-32C of every object) handed to the metadata store, checksum
verification on whole reads, and removing what a failed copy had already uploaded.
"""

from __future__ import annotations

import abc
import io
import logging
import os
import re
import stat
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from kts_resources.kafka.crc import crc32c

# The errors live with KIP-405's types (the metadata store raises the same not-found); re-exported here.
from kts_resources.remote_log import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentMetadata,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    VerifiedChecksum,
)
from kts_resources.remote_storage.keys import (
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    SEGMENT_SUFFIXES,
    ObjectKeys,
    check_object_key,
    suffix_for_index,
)

log = logging.getLogger(__name__)

# Streamed ranged reads of a remote .log fill their buffer this much at a time.
STREAM_BUFFER_SIZE = 1024 * 1024

_HEX_CRC = re.compile(r"[0-9a-f]{8}")


class ChecksumMismatch(RemoteStorageError):
    """An object read whole does not have the CRC-32C recorded when it was uploaded."""

    def __init__(self, location: str, key: str, expected: str, actual: str):
        super().__init__(f"{location}: CRC-32C is {actual}, expected {expected}: the object is corrupt or was replaced")
        self.key = key
        self.expected = expected
        self.actual = actual


class SourceChangedError(RemoteStorageError):
    """A local file changed size or was modified while it was being uploaded."""


class ObjectInfo(NamedTuple):
    """One object as listed: its full key (prefix included), size, and modification time (epoch
    seconds) so a scrub can leave young objects of a copy still in flight alone. ``tag``: its
    version as the tier says it, which any write changes (S3's ETag; a file's inode, modification
    and change times): an object verified at a tag is still those bytes while the tag holds."""

    key: str
    size: int
    last_modified: float | None = None
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object as uploaded: what the metadata store keeps to find and verify it later."""

    key: str
    size: int
    crc32c: int

    @property
    def checksum(self) -> str:
        return crc32c_hex(self.crc32c)


def crc32c_hex(value: int) -> str:
    """The checksum as stored in custom metadata: 8 lowercase hex digits."""
    return f"{value & 0xFFFFFFFF:08x}"


def parse_crc32c_hex(text: str) -> int:
    if not _HEX_CRC.fullmatch(text):
        raise ValueError(f"CRC-32C {text!r} is not 8 lowercase hex digits")
    return int(text, 16)


# --- custom metadata: "<suffix>.key", "<suffix>.size", "<suffix>.crc32c" per object ---------------


def custom_metadata_fields(suffix: str) -> tuple[str, str, str]:
    """The custom-metadata names of one object's key, size and checksum (``log.key``, ``log.size``,
    ``log.crc32c``; ``index.…``, ``timeindex.…``, ``txnindex.…``, ``snapshot.…``,
    ``leader-epoch-checkpoint.…``)."""
    return f"{suffix}.key", f"{suffix}.size", f"{suffix}.crc32c"


def segment_custom_metadata(objects: Mapping[str, StoredObject]) -> dict[str, str]:
    """suffix → stored object, as the flat string map the metadata store keeps."""
    out: dict[str, str] = {}
    for suffix, obj in objects.items():
        key_field, size_field, crc_field = custom_metadata_fields(suffix)
        out[key_field] = obj.key
        out[size_field] = str(obj.size)
        out[crc_field] = obj.checksum
    return out


def recorded_manifest(custom_metadata: Mapping[str, str]) -> StoredObject | None:
    """The segment's manifest as recorded in its custom metadata (``manifest.key`` etc.), or None
    when the store has not recorded one (a segment copied before manifests existed)."""
    key_field, size_field, crc_field = custom_metadata_fields(MANIFEST_SUFFIX)
    if key_field not in custom_metadata:
        return None
    try:
        return StoredObject(check_object_key(custom_metadata[key_field]), int(custom_metadata[size_field]),
                            parse_crc32c_hex(custom_metadata[crc_field]))
    except (KeyError, ValueError) as e:
        raise ValueError(f"custom metadata of the manifest is malformed: {e}") from None


def stored_objects(custom_metadata: Mapping[str, str]) -> dict[str, StoredObject]:
    """The inverse of ``segment_custom_metadata``: suffix → stored object for each object recorded
    (what a scrub compares the store against). ValueError for a malformed entry."""
    out = {}
    for suffix in SEGMENT_SUFFIXES:
        key_field, size_field, crc_field = custom_metadata_fields(suffix)
        if key_field in custom_metadata:
            try:
                out[suffix] = StoredObject(
                    check_object_key(custom_metadata[key_field]),
                    int(custom_metadata[size_field]),
                    parse_crc32c_hex(custom_metadata[crc_field]),
                )
            except (KeyError, ValueError) as e:
                raise ValueError(f"custom metadata of {suffix!r} object is malformed: {e}") from None
    return out


def _recorded_keys(metadata: RemoteLogSegmentMetadata) -> dict[str, str]:
    """suffix → key of each object the segment's custom metadata records, its manifest's too."""
    keys = {suffix: obj.key for suffix, obj in stored_objects(metadata.custom_metadata).items()}
    manifest = recorded_manifest(metadata.custom_metadata)
    if manifest is not None:
        keys[MANIFEST_SUFFIX] = manifest.key
    return keys


# --- what gets uploaded ------------------------------------------------------------------------


class UploadSource(abc.ABC):
    """Bytes to upload, read once from front to back. ``finish`` is the cheap, sound check that what
    was read is the whole of it: the byte count matches and the file was not modified meanwhile."""

    description: str
    size: int
    # The content's CRC-32C when the caller already knows it (a segment it has just verified):
    # every backend compares its own with it before the object becomes visible.
    known_crc32c: int | None = None

    @abc.abstractmethod
    def readinto(self, buffer: memoryview | bytearray) -> int: ...

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; fewer only at the end."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.readinto(view[got:])
            if not k:
                break
            got += k
        view.release()
        del buf[got:]
        return bytes(buf)

    def chunks(self, size: int) -> Iterator[memoryview]:
        """The bytes in pieces of ``size`` (the last one shorter). Each piece is only valid until
        the next is asked for: CRC it and write it, do not keep it."""
        view = memoryview(bytearray(size))
        while n := self.readinto(view):
            yield view[:n]

    @abc.abstractmethod
    def finish(self, total: int) -> None: ...

    def check_crc32c(self, crc: int, location: str) -> None:
        """SourceChangedError unless ``crc`` (of the bytes uploaded) is the known CRC-32C, if any:
        the bytes changed between the caller's verification and the upload."""
        if self.known_crc32c is not None and crc != self.known_crc32c:
            raise SourceChangedError(
                f"{location}: {self.description} changed since it was verified "
                f"(CRC-32C {crc32c_hex(crc)}, verified {crc32c_hex(self.known_crc32c)})"
            )

    def close(self) -> None:
        pass


class FileSource(UploadSource):
    """A regular local file (a segment or one of its indexes).

    Read (pread into one buffer per thread), never mapped: Kafka never rewrites a rolled segment in
    place, but a broker does truncate its log (an unclean leader election, a replica catching up),
    and a mapped file truncated underneath kills the process with SIGBUS on the next touch, which
    nothing can catch. A read just comes back short, and ``finish`` names the file with the size it
    had and the size found.
    """

    def __init__(self, path: str | os.PathLike, verified: VerifiedChecksum | None = None):
        self.description = os.fspath(path)
        self._file = open(path, "rb", buffering=0)
        try:
            st = os.fstat(self._file.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise IsADirectoryError(f"{self.description} is not a regular file")
            if verified is not None:
                if (st.st_size, st.st_mtime_ns) != (verified.size, verified.mtime_ns):
                    raise SourceChangedError(
                        f"{self.description}: changed since it was verified ({verified.size} bytes then, {st.st_size} now); "
                        "a segment must not change once rolled"
                    )
                self.known_crc32c = verified.crc32c
            self.size = st.st_size
            self._mtime_ns = st.st_mtime_ns
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except BaseException:
            self._file.close()
            raise

    def readinto(self, buffer: memoryview | bytearray) -> int:
        return self._file.readinto(buffer) or 0

    def read(self, n: int) -> bytes:
        pieces = []
        while n > 0 and (piece := self._file.read(n)):
            pieces.append(piece)
            n -= len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def chunks(self, size: int) -> Iterator[memoryview]:
        # Exactly the size seen at open: growth shows in finish(), not as extra bytes; a truncation
        # ends the chunks early, and finish() says so.
        fd = self._file.fileno()
        buffer = _read_buffer(min(size, self.size))
        position = 0
        while position < self.size:
            n = os.preadv(fd, [buffer[: min(size, self.size - position)]], position)
            if not n:
                return
            position += n
            yield buffer[:n]

    def finish(self, total: int) -> None:
        st = os.fstat(self._file.fileno())
        if total != self.size or st.st_size != self.size or st.st_mtime_ns != self._mtime_ns:
            raise SourceChangedError(
                f"{self.description}: changed while being uploaded ({self.size} bytes at the start, "
                f"{total} read, {st.st_size} now); a segment must not change once rolled"
            )

    def close(self) -> None:
        self._file.close()


_thread_buffers = threading.local()


def _read_buffer(size: int) -> memoryview:
    """This thread's read buffer of at least ``size`` bytes: reused from one file to the next, as
    a fresh buffer of tens of MiB page-faults its memory in on every file. A chunk handed out is
    valid only until the next read, which ``UploadSource.chunks`` promises no more than."""
    buffer = getattr(_thread_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = memoryview(bytearray(max(size, 1)))
        _thread_buffers.buffer = buffer
    return buffer


class BytesSource(UploadSource):
    """Bytes already in memory (the leader-epoch lineage, a remote index)."""

    def __init__(self, data: bytes | bytearray | memoryview, description: str):
        self._view = memoryview(data).cast("B")
        self.size = len(self._view)
        self.description = description
        self._pos = 0

    def readinto(self, buffer: memoryview | bytearray) -> int:
        n = min(len(buffer), self.size - self._pos)
        buffer[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def chunks(self, size: int) -> Iterator[memoryview]:
        for position in range(self._pos, self.size, size):
            self._pos = min(position + size, self.size)
            yield self._view[position : self._pos]

    def finish(self, total: int) -> None:
        if total != self.size:
            raise SourceChangedError(f"{self.description}: {total} bytes read of {self.size}")


class RangeReader(io.RawIOBase):
    """A read-only stream of at most ``length`` bytes that closes its resource when closed."""

    def readable(self) -> bool:
        return True


# --- the interface -----------------------------------------------------------------------------


class RemoteStorageManager(abc.ABC):
    """Bytes in and out of the remote tier for KIP-405 segments (Kafka's RemoteStorageManager).

    Every segment copy has its own segment UUID, so its keys never collide with an earlier attempt;
    copy and delete are idempotent. Keys are full keys (the prefix included), as stored in the
    metadata store and as listed.
    """

    keys: ObjectKeys

    # --- what a backend provides ---

    @abc.abstractmethod
    def location(self, key: str = "") -> str:
        """Where ``key`` is, for messages: ``s3://bucket/key`` or ``file:///root/key``."""

    @abc.abstractmethod
    def _put_object(self, key: str, source: UploadSource) -> StoredObject:
        """Upload ``source`` under ``key`` computing its CRC-32C as it goes, verify the upload, and
        make it visible only when complete; on any failure nothing is left under ``key`` (an older
        object there may stay) and RemoteStorageError is raised."""

    @abc.abstractmethod
    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        """Bytes ``start..end`` inclusive (``end`` None: to the end), fewer at the end of the object,
        ``b""`` from or past its end."""

    @abc.abstractmethod
    def _open_range(self, key: str, start: int, end: int | None) -> RangeReader: ...

    @abc.abstractmethod
    def _get_object(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _delete_objects(self, keys: list[str]) -> dict[str, str]:
        """Delete every key, as few requests as the backend allows; a key that is not there is
        fine. Returns the keys that could not be deleted, each with why (S3 DeleteObjects answers
        per key); a failure of a whole request raises RemoteStorageError."""

    @abc.abstractmethod
    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every complete object whose key starts with ``prefix``; the empty prefix means everything
        under this store's own prefix. A prefix outside it is a ValueError."""

    @abc.abstractmethod
    def abort_incomplete_uploads(self, older_than_s: float) -> int:
        """Remove what crashed or failed uploads left behind (S3: incomplete multipart uploads;
        filesystem: temporary files) older than ``older_than_s``; returns how many."""

    @abc.abstractmethod
    def check_access(self) -> None:
        """Raise one clear RemoteStorageError when the store is unreachable, missing or not writable."""

    def close(self) -> None:
        pass

    # --- segments ---

    def segment_object_keys(self, metadata: RemoteLogSegmentMetadata) -> dict[str, str]:
        """suffix → key of each object of the segment. Keys recorded in the custom metadata win, so
        segments copied under an earlier prefix stay readable and deletable after it changes."""
        return self.keys.segment_keys(metadata.segment_id, metadata.start_offset, SEGMENT_SUFFIXES) | _recorded_keys(metadata)

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> dict[str, str]:
        """Upload the segment's .log, .index, .timeindex, .txnindex and producer snapshot (when
        present) and its leader-epoch lineage; return the custom metadata (key, size and CRC-32C of
        every object). On failure, objects this call uploaded are removed and RemoteStorageError is
        raised; ValueError when the metadata cannot make a safe key."""
        keys = {s: self.keys.segment_key(metadata.segment_id, metadata.start_offset, s) for s in SEGMENT_SUFFIXES}
        files: list[tuple[str, Path | None]] = [
            (LOG_SUFFIX, data.log_segment),
            (suffix_for_index(IndexType.OFFSET), data.offset_index),
            (suffix_for_index(IndexType.TIMESTAMP), data.time_index),
            (suffix_for_index(IndexType.TRANSACTION), data.transaction_index),
            (suffix_for_index(IndexType.PRODUCER_SNAPSHOT), data.producer_snapshot),
        ]
        sources: dict[str, UploadSource] = {}
        stored: dict[str, StoredObject] = {}
        in_flight: list[str] = []
        try:
            # Open everything first: a missing or unreadable file fails the copy before any upload.
            for suffix, path in files:
                if path is not None:
                    verified = data.log_segment_checksum if suffix == LOG_SUFFIX else None
                    try:
                        sources[suffix] = FileSource(path, verified)
                    except SourceChangedError as e:
                        raise SourceChangedError(f"{self.location(keys[suffix])}: {e}") from None
                    except OSError as e:
                        raise RemoteStorageError(f"{self.location(keys[suffix])}: cannot read {path}: {e.strerror or e}") from e
            epoch_suffix = suffix_for_index(IndexType.LEADER_EPOCH)
            sources[epoch_suffix] = BytesSource(data.leader_epoch_index, "leader-epoch lineage")
            if sources[LOG_SUFFIX].size != metadata.segment_size_in_bytes:
                raise RemoteStorageError(
                    f"{self.location(keys[LOG_SUFFIX])}: {data.log_segment} has {sources[LOG_SUFFIX].size} bytes, "
                    f"the segment metadata says {metadata.segment_size_in_bytes}"
                )
            for suffix, source in sources.items():
                # An upload whose response was lost may still have landed: it goes too on failure.
                in_flight[:] = [keys[suffix]]
                stored[suffix] = self._put(keys[suffix], source)
            in_flight.clear()
        except BaseException as e:
            self._discard([obj.key for obj in stored.values()] + in_flight, e)
            raise
        finally:
            for source in sources.values():
                source.close()
        return segment_custom_metadata(stored)

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int | None = None) -> bytes:
        """Bytes ``start_position..end_position`` (inclusive, like Kafka; None: to the end) of the
        segment's .log; shorter at the end of the segment, empty from or past it. A ranged read is
        not checksummed as a whole: every record batch in it carries its own CRC."""
        _check_range(start_position, end_position)
        return self._get_range(self.segment_object_keys(metadata)[LOG_SUFFIX], start_position, end_position)

    def fetch_log_segment_stream(
        self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int | None = None
    ) -> BinaryIO:
        """``fetch_log_segment`` as a file-like object, for reads too large to hold at once (close it)."""
        _check_range(start_position, end_position)
        raw = self._open_range(self.segment_object_keys(metadata)[LOG_SUFFIX], start_position, end_position)
        return io.BufferedReader(raw, STREAM_BUFFER_SIZE)  # type: ignore[return-value]

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole index (or producer snapshot, or leader-epoch lineage) of the segment, verified
        against its recorded CRC-32C. RemoteResourceNotFoundError when the segment has none (a
        transaction index is only there when the segment had aborted transactions)."""
        suffix = suffix_for_index(index_type)
        recorded = stored_objects(metadata.custom_metadata)
        if recorded and suffix not in recorded:
            raise RemoteResourceNotFoundError(
                f"{self.location(self.segment_object_keys(metadata)[suffix])}: the segment was copied without a {suffix} object"
            )
        obj = recorded.get(suffix)
        key = obj.key if obj else self.segment_object_keys(metadata)[suffix]
        return self.fetch_object(key, obj.checksum if obj else None)

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete every object of the segment and its manifest (``delete_segments_data`` of one);
        RemoteStorageError when some object could not be deleted."""
        failed = self.delete_segments_data([metadata])
        if failed:
            raise RemoteStorageError(next(iter(failed.values())))

    def delete_segments_data(self, metadatas: Sequence[RemoteLogSegmentMetadata]) -> dict[uuid.UUID, str]:
        """Delete every object of the segments and their manifests, idempotently (objects already
        gone, from an earlier attempt or a copy that never finished, are fine, and leftovers of an
        interrupted upload of these keys go too), in as few requests as the backend takes: the
        manifests of all of them, then all their other objects. A finished copy's objects are the
        ones its custom metadata records; a segment without that record (a copy cut short) gets
        every key of the layout. Returns segment id → why, for the segments some of whose objects
        are still there (deleting again finishes them)."""
        # The manifests go first: a delete cut short leaves objects nothing describes (the scrub's
        # orphans), never a manifest naming objects that are gone (which `kts recover` would trust).
        # A segment whose manifest stays keeps its other objects too.
        manifests: dict[str, uuid.UUID] = {}
        others: dict[str, uuid.UUID] = {}
        for md in metadatas:
            sid = md.segment_id.id
            # The objects a finished copy recorded are all it stored (under keys that may predate a
            # prefix change); a copy cut short recorded none, and any of the layout's may be there.
            recorded = _recorded_keys(md)
            wanted = (*SEGMENT_SUFFIXES, MANIFEST_SUFFIX) if recorded.keys() <= {MANIFEST_SUFFIX} else (MANIFEST_SUFFIX,)
            layout = self.keys.segment_keys(md.segment_id, md.start_offset, wanted)
            if MANIFEST_SUFFIX in recorded:
                del layout[MANIFEST_SUFFIX]
            for suffix, key in (*layout.items(), *recorded.items()):
                (manifests if suffix == MANIFEST_SUFFIX else others)[key] = sid
        failed: dict[uuid.UUID, str] = {}

        def delete(keys: dict[str, uuid.UUID]) -> None:
            for key, why in self._delete_objects(sorted(keys)).items():
                # A key the answer names that is not one asked for: whose it was is unknown.
                for sid in [keys[key]] if key in keys else set(keys.values()):
                    failed.setdefault(sid, f"{self.location(key)}: delete failed: {why}")

        delete(manifests)
        delete({k: sid for k, sid in others.items() if sid not in failed})
        return failed

    # --- single objects (remote indexes, the scrub) ---

    def put_object(self, key: str, data: bytes | str | os.PathLike) -> StoredObject:
        """Upload bytes or a local file under ``key`` (checked, and within this store's prefix)."""
        self._check_own_key(key)
        if isinstance(data, (bytes, bytearray, memoryview)):
            source: UploadSource = BytesSource(data, "bytes")
        else:
            try:
                source = FileSource(data)
            except OSError as e:
                raise RemoteStorageError(f"{self.location(key)}: cannot read {os.fspath(data)}: {e.strerror or e}") from e
        try:
            return self._put(key, source)
        finally:
            source.close()

    def fetch_object(self, key: str, verify_checksum: str | None = None) -> bytes:
        """The whole object; with ``verify_checksum`` (8 hex digits, as in custom metadata), raise
        ChecksumMismatch unless the bytes read have that CRC-32C."""
        check_object_key(key)
        expected = parse_crc32c_hex(verify_checksum) if verify_checksum is not None else None
        data = self._get_object(key)
        if expected is not None:
            actual = crc32c(data)
            if actual != expected:
                raise ChecksumMismatch(self.location(key), key, crc32c_hex(expected), crc32c_hex(actual))
        return data

    def fetch_range(self, key: str, start: int, end: int | None) -> bytes:
        """Bytes ``start..end`` inclusive of one object (a remote log index entry's chunk): one
        ranged request, not checksummed as a whole (every batch in it carries its CRC)."""
        check_object_key(key)
        _check_range(start, end)
        return self._get_range(key, start, end)

    def delete_objects(self, keys: Iterable[str]) -> None:
        """Delete objects by key (an orphan clean-up); missing ones are fine."""
        checked = [self._check_own_key(k) for k in keys]
        if checked:
            failed = self._delete_objects(checked)
            if failed:
                key, why = next(iter(failed.items()))
                raise RemoteStorageError(f"{self.location(key)}: delete failed: {why}"
                                         + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))

    # --- helpers ---

    def _put(self, key: str, source: UploadSource) -> StoredObject:
        try:
            return self._put_object(key, source)
        except RemoteStorageError:
            raise
        except OSError as e:
            # A local read failing half way (I/O error, file too large for a limit, …).
            raise RemoteStorageError(f"{self.location(key)}: upload of {source.description} failed: {e}") from e

    def _discard(self, keys: list[str], cause: BaseException) -> None:
        """Best effort: a failed copy leaves nothing; if this fails too, the metadata store's
        DELETE_SEGMENT_STARTED clean-up (or the scrub) removes them later."""
        if not keys:
            return
        try:
            failed = self._delete_objects(keys)
            if failed:
                raise RemoteStorageError("; ".join(f"{k}: {why}" for k, why in failed.items()))
        except Exception as e:  # the original failure is the one to report
            log.warning("could not remove objects of a failed copy: %s", e)
            cause.add_note(f"objects left behind by the failed copy: {', '.join(keys)} ({e})")

    def _check_own_key(self, key: str) -> str:
        check_object_key(key)
        if not key.startswith(self.keys.root):
            raise ValueError(f"object key {key!r} is outside this store's prefix {self.keys.prefix!r}")
        return key

    def _list_prefix(self, prefix: str) -> str:
        """The full-key prefix ``list_objects`` scans: this store's own when ``prefix`` is empty."""
        if not prefix:
            return self.keys.root
        if not prefix.startswith(self.keys.root):
            raise ValueError(f"listing prefix {prefix!r} is outside this store's prefix {self.keys.prefix!r}")
        return prefix


def _check_range(start: int, end: int | None) -> None:
    if start < 0:
        raise ValueError(f"start position {start} is negative")
    if end is not None and end < start:
        raise ValueError(f"end position {end} is before start position {start}")
