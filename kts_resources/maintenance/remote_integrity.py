"""Are a partition's finished remote segments whole in the tier? One listing of the partition's
objects against what the store recorded for each segment (key, size, CRC-32C), and small objects
read back and their checksum recomputed.

The remote_segments_in_bucket check runs it after every copy pass and records what it finds on the
segments (``RemoteLogMetadataStore.record_segment_damage``); the next copy pass re-copies a damaged
segment from its local segment while that exists (``copier.recopy_damaged``). Given what was
verified before (``verified``: the store's ``verified_objects``), a routine look reads an object
again only when the tier lists it at another version (``ObjectInfo.tag``) or it was never read:
every pass would otherwise read every small object of every remote segment again, a cost that grows
with retention rather than with what changed. `kts scrub --deep` reads every byte regardless.

A segment's .log object is a Kafka segment: ``scan_log_object`` reads what it holds (offsets,
leader epochs, max timestamp, every batch's CRC) from the object alone, so a segment the store
does not know can be judged (the scrub) or described again (``kts recover``, a lost manifest).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kts_resources.kafka.crc import crc32c

from kts_resources.kafka.files import mapped
from kts_resources.kafka.records import NO_TIMESTAMP, verify_segment
from kts_resources.metadata.models import VerifiedObject
from kts_resources.remote_log import RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.remote_storage.base import (
    RemoteStorageError,
    RemoteStorageManager,
    StoredObject,
    recorded_manifest,
    stored_objects,
)
from kts_resources.remote_storage.manifest import ManifestError, decode_manifest, manifest_differences

# Objects up to this size are read back and their CRC-32C recomputed; larger ones are checked by size.
VERIFY_CRC_MAX_BYTES = 1024 * 1024


@dataclass
class TierInspection:
    """What one look at a partition's finished segments in the tier found."""

    objects_checked: int = 0
    objects_missing: int = 0  # recorded segment objects not in the listing
    damaged: list[tuple[RemoteLogSegmentMetadata, list[str]]] = field(default_factory=list)
    # Segments whose data is whole but whose recorded manifest is missing or wrong: the tier no
    # longer describes them (``kts recover`` would not find them); the copy pass writes it again.
    manifests_lost: list[tuple[RemoteLogSegmentMetadata, str]] = field(default_factory=list)
    objects_read: int = 0  # read back for their checksum (the rest: checked by size, or verified at this version before)
    # Objects read and found whole at a version the tier listed: for ``store.record_verified_objects``.
    verified_now: list[VerifiedObject] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [problem for _, problems in self.damaged for problem in problems]

    @property
    def none_present(self) -> bool:
        """Not one recorded object of the segments looked at is in the tier: that is another
        tier than the one they were copied to (a wrong KTS_REMOTE_URI), not proof of damage in
        theirs, so nothing is recorded (issue 34)."""
        return self.objects_missing > 0 and self.objects_missing == self.objects_checked

    @property
    def intact(self) -> bool:
        """Every object present and whole, every manifest as recorded: what the bucket check passes."""
        return not (self.none_present or self.damaged or self.manifests_lost)

    def clear_whole(self, store, tip: TopicIdPartition, finished: Sequence[RemoteLogSegmentMetadata], why: str) -> int:
        """Forget damage recorded on segments of ``finished`` this look found whole (seen in
        another tier, or their objects are back); how many were cleared. Only after a look that
        read every byte (a CRC mismatch in a large object is found by no shallower one)."""
        looked_at = {md.segment_id for md in finished}
        damaged = {md.segment_id for md, _ in self.damaged}
        return sum(store.clear_segment_damage(md.segment_id, why) for md, _ in store.damaged_segments(tip)
                   if md.segment_id in looked_at and md.segment_id not in damaged)

    def wrong_tier_line(self, storage: RemoteStorageManager, tip: TopicIdPartition) -> str:
        return wrong_tier_line(storage, tip, len(self.damaged))


def inspect_finished_segments(storage: RemoteStorageManager, tip: TopicIdPartition,
                              finished: Sequence[RemoteLogSegmentMetadata], *,
                              verify_crc_max_bytes: int = VERIFY_CRC_MAX_BYTES,
                              listed: Mapping[str, int] | None = None,
                              compare_manifests: bool = False,
                              verified: Mapping[tuple[uuid.UUID, str], VerifiedObject] | None = None) -> TierInspection:
    """Every object each finished segment recorded is listed with its recorded size; those up to
    ``verify_crc_max_bytes`` also match their recorded checksum (read in chunks: memory stays
    bounded whatever the object's size). A segment with no log object recorded is damaged too (it
    could never be read). ``listed``: key → size of a listing already made (the scrub's).
    A whole segment's manifest must be there with its recorded bytes; ``compare_manifests`` (a
    deep scrub) also parses it and compares it with the store's row, and checks the manifest of
    a segment that has none recorded when the tier has one.

    ``verified`` (with a listing made here): an object the tier lists at the size and version it
    was verified at, whose recorded checksum is the one verified, is not read again; what is read
    and found whole goes into ``verified_now``."""
    found = TierInspection()
    if not finished:
        return found
    tags: Mapping[str, str | None] = {}
    if listed is None:
        infos = list(storage.list_objects(storage.keys.partition_prefix(tip)))
        listed = {o.key: o.size for o in infos}
        tags = {o.key: o.tag for o in infos}

    def still_verified(md: RemoteLogSegmentMetadata, key: str, size: int, crc: int) -> bool:
        before = verified.get((md.segment_id.id, key)) if verified is not None else None
        return before is not None and (before.size, before.tag, before.crc32c) == (size, tags.get(key), crc)

    def remember(md: RemoteLogSegmentMetadata, key: str, size: int, crc: int) -> None:
        tag = tags.get(key)
        if verified is not None and tag is not None:
            found.verified_now.append(VerifiedObject(md.segment_id.id, key, size, tag, crc))

    for md in finished:
        problems: list[str] = []
        objects = stored_objects(md.custom_metadata)
        if "log" not in objects:
            problems.append(f"segment {md.start_offset}: no log object recorded")
        read: list[StoredObject] = []
        for obj in objects.values():
            found.objects_checked += 1
            size = listed.get(obj.key)
            if size is None:
                found.objects_missing += 1
                problems.append(f"{storage.location(obj.key)}: missing")
            elif size != obj.size:
                problems.append(f"{storage.location(obj.key)}: {size} bytes, recorded {obj.size}")
            elif obj.size <= verify_crc_max_bytes and not still_verified(md, obj.key, obj.size, obj.crc32c):
                found.objects_read += 1
                try:
                    problem = object_checksum_problem(storage, obj)
                except RemoteStorageError as e:
                    problem = str(e)
                if problem is not None:
                    problems.append(problem)
                else:
                    read.append(obj)
        for obj in read:
            remember(md, obj.key, obj.size, obj.crc32c)
        if problems:
            found.damaged.append((md, problems))
            continue
        if "manifest.key" in md.custom_metadata:
            found.objects_checked += 1
        recorded = _recorded_manifest_or_none(md)
        if recorded is not None and not compare_manifests and still_verified(md, recorded.key, recorded.size, recorded.crc32c) \
                and listed.get(recorded.key) == recorded.size:
            continue
        if recorded is not None and listed.get(recorded.key) is not None:
            found.objects_read += 1  # manifest_problem reads it
        problem = manifest_problem(storage, md, listed, compare=compare_manifests)
        if problem is not None:
            found.manifests_lost.append((md, problem))
        elif recorded is not None and listed.get(recorded.key) == recorded.size:
            remember(md, recorded.key, recorded.size, recorded.crc32c)
    return found


class RoutineLooks:
    """Looks at partitions' finished segments in the tier as a routine pass makes them (the bucket
    check, a no-op sync's look at what it leaves out): what was verified before of many segments
    read in one query (``read``), each partition inspected without reading those objects again
    (``inspect``, from any thread), and what was read whole recorded in one statement (``write``)."""

    def __init__(self, store, storage: RemoteStorageManager):
        self.store, self.storage = store, storage
        self.known: Mapping[tuple[uuid.UUID, str], VerifiedObject] = {}
        self.found: list[VerifiedObject] = []  # list.extend from the inspecting threads is atomic

    def read(self, finished: Iterable[RemoteLogSegmentMetadata]) -> None:
        self.known = self.store.verified_objects_of(md.segment_id.id for md in finished)

    def inspect(self, tip: TopicIdPartition, finished: Sequence[RemoteLogSegmentMetadata]) -> TierInspection:
        found = inspect_finished_segments(self.storage, tip, finished, verified=self.known)
        self.found.extend(found.verified_now)
        return found

    def write(self) -> None:
        found, self.found = self.found, []
        self.store.record_verified_objects(found)


def _recorded_manifest_or_none(md: RemoteLogSegmentMetadata) -> StoredObject | None:
    try:
        return recorded_manifest(md.custom_metadata)
    except ValueError:
        return None  # manifest_problem says what is wrong with it


def manifest_problem(storage: RemoteStorageManager, md: RemoteLogSegmentMetadata, listed: Mapping[str, int], *,
                     compare: bool = False) -> str | None:
    """What is wrong with a finished segment's manifest in the tier, starting with its location,
    or None. Missing, or bytes other than those recorded: what differs from the store's row (or
    why it does not parse). ``compare``: parsed and compared even when its bytes are as recorded,
    and a manifest the store has none recorded for is checked when the tier has one."""
    try:
        recorded = recorded_manifest(md.custom_metadata)
    except ValueError as e:
        return f"segment {md.start_offset}: {e}"
    key = recorded.key if recorded is not None else storage.keys.manifest_key(md.segment_id, md.start_offset)
    size = listed.get(key)
    if recorded is None and (not compare or size is None):
        return None  # none recorded yet: the copy pass's backfill writes it
    where = storage.location(key)
    if size is None:
        return f"{where}: manifest missing"
    try:
        data = storage.fetch_object(key)
    except RemoteStorageError as e:
        return f"manifest: {e}"
    changed = recorded is not None and (len(data) != recorded.size or crc32c(data) != recorded.crc32c)
    if not changed and not compare:
        return None
    try:
        differences = manifest_differences(decode_manifest(data, where=where), md)
    except ManifestError as e:
        return str(e)
    if differences:
        return f"{where}: the manifest disagrees with the store: {'; '.join(differences)}"
    if changed:
        return (f"{where}: manifest of {len(data)} bytes, CRC-32C {crc32c(data):08x}, recorded {recorded.size} bytes, "
                f"{recorded.checksum}: it changed in the tier")
    return None


# --- segment objects on their own ----------------------------------------------------------------


@dataclass(frozen=True)
class LogObjectScan:
    """What a segment's .log object holds, read from its batches (``verify_segment``)."""

    key: str
    size: int
    crc32c: int
    first_offset: int | None  # the first batch's base offset; None: no batch
    last_offset: int | None  # the last batch's last offset
    max_timestamp: int
    epochs: dict[int, int]  # leader epoch → base offset of its first batch
    problem: tuple[int, str] | None  # (byte position, what is wrong): a CRC failure or invalid bytes

    def problem_line(self, where: str) -> str | None:
        return None if self.problem is None else f"{where}: byte {self.problem[0]}: {self.problem[1]}"


def scan_log_object(storage: RemoteStorageManager, key: str) -> LogObjectScan:
    """Read a .log object through the tier in ranged chunks into a private temporary file and
    check every batch there (memory stays at a chunk: a segment may be a GiB)."""
    with tempfile.TemporaryFile(prefix="kts-segment-") as spool:
        read = 0
        while True:
            chunk = storage.fetch_range(key, read, read + CHECKSUM_READ_BYTES - 1)
            if not chunk:
                break
            spool.write(chunk)
            read += len(chunk)
            if len(chunk) < CHECKSUM_READ_BYTES:
                break
        spool.flush()
        with mapped(spool) as view:
            found = verify_segment(view)
            first = int.from_bytes(view[:8], "big", signed=True) if found.batches else None
    return LogObjectScan(key, found.size, found.crc32c, first, found.last_offset,
                         found.max_timestamp if found.batches else NO_TIMESTAMP, dict(found.epochs), found.problem)


def tier_holds_any(finished: Sequence[RemoteLogSegmentMetadata], listed: Mapping[str, int]) -> bool:
    """Whether the listing holds any recorded object of these segments (stops at the first)."""
    return any(obj.key in listed for md in finished for obj in stored_objects(md.custom_metadata).values())


def wrong_tier_line(storage: RemoteStorageManager, tip: TopicIdPartition, finished: int) -> str:
    return (f"{tip.topic_partition}: none of its {finished} finished segments has an object in "
            f"{storage.location(storage.keys.partition_prefix(tip))}: KTS_REMOTE_URI names another tier than the one "
            f"they were copied to (or all were deleted from it); nothing was recorded as damaged")


CHECKSUM_READ_BYTES = 8 * 1024 * 1024


def object_checksum_problem(storage: RemoteStorageManager, obj: StoredObject) -> str | None:
    """None when the object's bytes have the CRC-32C the copy recorded, else what is wrong. Read
    in ranged chunks. The copy recorded the checksum of bytes whose every batch CRC it had just
    verified, so a whole-object match is every batch CRC holding too."""
    crc, read = 0, 0
    while read < obj.size:
        chunk = storage.fetch_range(obj.key, read, min(read + CHECKSUM_READ_BYTES, obj.size) - 1)
        if not chunk:
            break
        crc = crc32c(chunk, crc)
        read += len(chunk)
    if read != obj.size:
        return f"{storage.location(obj.key)}: {read} bytes readable, recorded {obj.size}"
    if crc != obj.crc32c:
        return f"{storage.location(obj.key)}: CRC-32C {crc:08x}, recorded {obj.crc32c:08x} (the bytes changed in the tier)"
    return None

