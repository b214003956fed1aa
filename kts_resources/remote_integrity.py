"""Are a partition's finished remote segments whole in the tier? One listing of the partition's
objects against what the store recorded for each segment (key, size, CRC-32C), and small objects
read back and their checksum recomputed.

The remote_segments_in_bucket check runs it after every copy pass and records what it finds on the
segments (``RemoteLogMetadataStore.record_segment_damage``); the next copy pass re-copies a damaged
segment from its local segment while that exists (``copier.recopy_damaged``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from crc32c import crc32c

from kts_resources.remote_log import RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.remote_storage.base import (
    RemoteStorageError,
    RemoteStorageManager,
    StoredObject,
    recorded_manifest,
    stored_objects,
)

# Objects up to this size are read back and their CRC-32C recomputed; larger ones are checked by size.
VERIFY_CRC_MAX_BYTES = 1024 * 1024


@dataclass
class TierInspection:
    """What one look at a partition's finished segments in the tier found."""

    objects_checked: int = 0
    damaged: list[tuple[RemoteLogSegmentMetadata, list[str]]] = field(default_factory=list)
    # Segments whose data is whole but whose recorded manifest is missing or wrong: the tier no
    # longer describes them (``kts recover`` would not find them); the copy pass writes it again.
    manifests_lost: list[tuple[RemoteLogSegmentMetadata, str]] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [problem for _, problems in self.damaged for problem in problems]


def inspect_finished_segments(storage: RemoteStorageManager, tip: TopicIdPartition,
                              finished: Sequence[RemoteLogSegmentMetadata], *,
                              verify_crc_max_bytes: int = VERIFY_CRC_MAX_BYTES,
                              listed: Mapping[str, int] | None = None) -> TierInspection:
    """Every object each finished segment recorded is listed with its recorded size; those up to
    ``verify_crc_max_bytes`` also match their recorded checksum (read in chunks: memory stays
    bounded whatever the object's size). A segment with no log object recorded is damaged too (it
    could never be read). ``listed``: key → size of a listing already made (the scrub's)."""
    found = TierInspection()
    if not finished:
        return found
    if listed is None:
        listed = {o.key: o.size for o in storage.list_objects(storage.keys.partition_prefix(tip))}
    for md in finished:
        problems: list[str] = []
        objects = stored_objects(md.custom_metadata)
        if "log" not in objects:
            problems.append(f"segment {md.start_offset}: no log object recorded")
        for obj in objects.values():
            found.objects_checked += 1
            size = listed.get(obj.key)
            if size is None:
                problems.append(f"{storage.location(obj.key)}: missing")
            elif size != obj.size:
                problems.append(f"{storage.location(obj.key)}: {size} bytes, recorded {obj.size}")
            elif obj.size <= verify_crc_max_bytes:
                try:
                    problem = object_checksum_problem(storage, obj)
                except RemoteStorageError as e:
                    problem = str(e)
                if problem is not None:
                    problems.append(problem)
        if problems:
            found.damaged.append((md, problems))
            continue
        manifest = recorded_manifest(md.custom_metadata)
        if manifest is not None:  # none recorded yet: the copy pass's backfill writes it
            found.objects_checked += 1
            size = listed.get(manifest.key)
            try:
                if size is None:
                    problem = f"{storage.location(manifest.key)}: manifest missing"
                elif size != manifest.size:
                    problem = f"{storage.location(manifest.key)}: manifest has {size} bytes, recorded {manifest.size}"
                else:
                    storage.fetch_object(manifest.key, verify_checksum=manifest.checksum)
                    problem = None
            except RemoteStorageError as e:
                problem = f"manifest: {e}"
            if problem is not None:
                found.manifests_lost.append((md, problem))
    return found


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

