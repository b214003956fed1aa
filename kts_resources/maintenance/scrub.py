"""Scrub: reconcile the remote tier's listing with the metadata store.

The whole tier is listed first; a listing that fails half-way raises before anything is touched.
Then, per segment the listed keys name (``keys.parse``; every other object — remote log index
files, which follow their own rule below, log-start-offset records, another tool's keys — is never
touched):

- a segment id the store does not know, whose objects are all older than the grace period: deleted
  only when provably redundant — it has no .log object (no records), its .log holds no batch, every
  offset it holds is in finished segments the store knows (a crashed copy re-copied later), or its
  partition is being deleted. Otherwise its objects are the only copy of those offsets (a segment
  whose manifest and store row were lost): kept, and reported ("not in the store; run kts
  recover"), as is a .log object that fails its scan (its key and byte position);
- a segment the store has as DELETE_SEGMENT_FINISHED: leftovers of its delete, deleted;
- DELETE_SEGMENT_STARTED, or COPY_SEGMENT_STARTED older than the grace period: the delete procedure
  finishes it (``copier.delete_remote_log_segment``), under the partition lock, skipped while a
  copy or an expiry holds it;
- COPY_SEGMENT_FINISHED: referenced, never deleted. Every finished segment of the store is checked
  against the listing (missing objects, wrong sizes; ``deep``: every object's CRC-32C, read in
  chunks) and what is found is recorded as damage, which the next copy pass re-copies from a local
  segment that still exists (``copier.recopy_damaged``). A whole segment's manifest must be its
  recorded bytes (``deep``: also parsed and compared with the store's row); one that is missing or
  disagrees is reported and written again from the store's row once every object of the segment
  verifies (the store and the objects agree, so the row is what the tier should say). ``deep``
  clears damage recorded earlier on a segment now found whole. A partition none of whose finished
  segments has an object in the tier is another tier than the store's (a wrong KTS_REMOTE_URI),
  not damage: reported, and then the scrub records, writes and deletes nothing (the finished
  segments are checked first, before any object is deleted).

Remote log index files (``remote_index_tier``): the files of a file set the partition's pointer
does not name — superseded by a later build, or left by one that crashed before naming them — are
deleted once older than the grace period (a reader that read the previous pointer may still be
fetching them); so are the flat layout's files of earlier kts versions once a pointer exists. The
pointer and every file it names are never touched; a pointer that does not decode is reported, and
then none of its partition's index files is deleted.

Multipart uploads (S3) and temporary files (directory tier) older than the grace period are
aborted. ``dry_run`` reports what would be done and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.tiering.copier import delete_remote_log_segment, manifest_context_for, write_manifest
from kts_resources.tiering.lost_ranges import uncovered
from kts_resources.tiering.quotas import SystemClock
from kts_resources.maintenance.remote_integrity import inspect_finished_segments, object_checksum_problem, scan_log_object
from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState
from kts_resources.remote_storage.base import ObjectInfo, RemoteStorageError, RemoteStorageManager, stored_objects
from kts_resources.remote_storage.keys import LOG_SUFFIX, ParsedObjectKey

DEFAULT_GRACE_S = 24 * 3600
S = RemoteLogSegmentState


@dataclass
class ScrubReport:
    objects_listed: int = 0
    segments_checked: int = 0
    orphans_deleted: list[str] = field(default_factory=list)  # keys
    deletes_finished: int = 0  # DELETE_SEGMENT_STARTED / stale COPY_SEGMENT_STARTED segments the delete procedure finished
    uploads_aborted: int = 0
    young_left: int = 0  # objects of unknown or in-flight segments within the grace period
    locked_left: int = 0  # segments skipped because a copy or an expiry held the partition
    damaged: list[str] = field(default_factory=list)  # one line per damaged finished segment
    # One line per segment the store does not know whose objects are kept: the only copy of its
    # offsets, or a .log that fails its scan.
    unrecorded: list[str] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)  # one line per finished segment's missing or wrong manifest
    # One line per partition none of whose finished segments has an object in the tier: another
    # tier than the store's (a wrong KTS_REMOTE_URI); then nothing is recorded or deleted.
    wrong_tier: list[str] = field(default_factory=list)
    index_files_deleted: list[str] = field(default_factory=list)  # keys of remote log index files no pointer names
    index_files_young: int = 0  # ... within the grace period
    index_pointers: list[str] = field(default_factory=list)  # one line per damaged remote log index pointer
    # Partitions whose numbers the scrub changed (damage recorded or cleared, an interrupted
    # delete finished), to be reported again where they are shown.
    partitions_changed: set[TopicPartition] = field(default_factory=set)
    dry_run: bool = False

    @property
    def problems(self) -> list[str]:
        return self.wrong_tier + self.damaged + self.unrecorded + self.manifests + self.index_pointers

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"objects_listed": self.objects_listed, "segments_checked": self.segments_checked,
                "orphans_deleted": len(self.orphans_deleted), "deletes_finished": self.deletes_finished,
                "uploads_aborted": self.uploads_aborted, "young_left": self.young_left, "locked_left": self.locked_left,
                "damaged": self.damaged, "unrecorded_segments": self.unrecorded, "manifests": self.manifests,
                "wrong_tier": self.wrong_tier, "index_files_deleted": len(self.index_files_deleted),
                "index_files_young": self.index_files_young, "index_pointers": self.index_pointers, "dry_run": self.dry_run}


def scrub(store, rsm: RemoteStorageManager, *, deep: bool = False, grace_s: float = DEFAULT_GRACE_S,
          dry_run: bool = False, now: float | None = None, progress: Callable[[str], None] | None = None) -> ScrubReport:
    """One scrub of the whole tier (see the module docstring)."""
    now = time.time() if now is None else now
    report = ScrubReport(dry_run=dry_run)
    say = progress or (lambda _line: None)
    listing = list(rsm.list_objects())  # all of it before anything is acted on
    report.objects_listed = len(listing)
    say(f"listed {len(listing)} objects")
    sizes = {o.key: o.size for o in listing}
    by_segment: dict = {}
    for obj in listing:
        parsed = rsm.keys.parse(obj.key)
        if parsed is not None:
            by_segment.setdefault(parsed.segment_id, (parsed, []))[1].append(obj)
    for tip in store.partitions():
        finished = store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED})
        if not finished:
            continue
        found = inspect_finished_segments(rsm, tip, finished, listed=sizes,
                                          verify_crc_max_bytes=2**63 if deep else 0, compare_manifests=deep)
        report.segments_checked += len(finished)
        if found.none_present:  # another tier than the store's: not damage, nothing recorded
            report.wrong_tier.append(found.wrong_tier_line(rsm, tip))
            continue
        if deep and not dry_run:  # every byte checked: what was recorded before and is whole now was no damage here
            if found.clear_whole(store, tip, finished, f"kts scrub --deep: found whole in {rsm.location()}"):
                report.partitions_changed.add(tip.topic_partition)
        damaged = list(found.damaged)
        for md, problem in found.manifests_lost:
            objects_problem = None if deep else _objects_problem(rsm, md)  # deep: every object verified already
            if objects_problem is not None:
                damaged.append((md, [objects_problem]))
                report.manifests.append(f"{problem}; not written again: the segment's objects do not verify")
            else:
                report.manifests.append(_repair_manifest(store, rsm, md, problem, dry_run))
        for md, problems in damaged:
            report.damaged.append(f"{tip.topic_partition} segment {md.start_offset}..{md.end_offset}: {'; '.join(problems)}")
            if not dry_run:
                store.record_segment_damage(RemoteLogSegmentId(tip, md.segment_id.id), "; ".join(problems))
                report.partitions_changed.add(tip.topic_partition)
        say(f"{tip.topic_partition}: {len(finished)} finished segments checked, {len(damaged)} damaged, "
            f"{len(found.manifests_lost)} manifests missing or wrong")
    if report.wrong_tier:
        # Not the store's tier: its objects are not this store's orphans, and nothing is deleted.
        return report
    clock = SystemClock()
    known = _KnownOffsets(store)
    for segment_id, (parsed, objects) in by_segment.items():
        md = store.segment(segment_id)
        old = all(o.last_modified is not None and now - o.last_modified >= grace_s for o in objects)
        if md is None or md.state is S.DELETE_SEGMENT_FINISHED:
            if md is None and not old:
                report.young_left += len(objects)
                continue
            if md is None:
                kept = _why_kept(rsm, parsed, objects, known)
                if kept is not None:
                    report.unrecorded.append(kept)
                    continue
            keys = [o.key for o in objects]
            if not dry_run:
                rsm.delete_objects(keys)
            report.orphans_deleted += keys
        elif md.state is S.DELETE_SEGMENT_STARTED or (md.state is S.COPY_SEGMENT_STARTED and old):
            with store.try_partition_lock(parsed.topic_id_partition) as lock:
                if lock is None:
                    report.locked_left += 1
                    continue
                if not dry_run:
                    delete_remote_log_segment(store, rsm, md, clock)
                    report.partitions_changed.add(parsed.topic_id_partition.topic_partition)
                report.deletes_finished += 1
        elif md.state is S.COPY_SEGMENT_STARTED:
            report.young_left += len(objects)
    _scrub_index_files(rsm, listing, report, now=now, grace_s=grace_s, dry_run=dry_run)
    if not dry_run:
        report.uploads_aborted = rsm.abort_incomplete_uploads(grace_s)
    return report


def _scrub_index_files(rsm: RemoteStorageManager, listing: list[ObjectInfo], report: ScrubReport, *, now: float,
                       grace_s: float, dry_run: bool) -> None:
    """Each partition's remote log index files that no pointer names, past the grace period."""
    for tip, objects in index_tier.index_objects_by_partition(rsm, listing).items():
        try:
            unnamed = index_tier.unnamed_index_objects(rsm, tip, objects, now=now, grace_s=grace_s)
        except (index_tier.IndexPointerError, RemoteStorageError) as e:
            report.index_pointers.append(f"{e}; none of {tip.topic_partition}'s remote log index files deleted "
                                         "(the next index build writes the pointer again)")
            continue
        report.index_files_young += unnamed.young
        if unnamed.removable and not dry_run:
            rsm.delete_objects(unnamed.removable)
        report.index_files_deleted += unnamed.removable


# --- segments the store does not know ------------------------------------------------------------


class _KnownOffsets:
    """Per partition, what the store vouches for: its finished segments' offsets, its open lost
    ranges, whether it is being deleted (read once per partition)."""

    def __init__(self, store) -> None:
        self.store = store
        self._seen: dict = {}

    def of(self, tip):
        if tip not in self._seen:
            finished = self.store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED})
            self._seen[tip] = ([(md.start_offset, md.end_offset) for md in finished],
                               [(r.start_offset, r.end_offset) for r in self.store.lost_ranges(tip)],
                               self.store.partition_state(tip).delete_state is not None)
        return self._seen[tip]


def _why_kept(rsm: RemoteStorageManager, parsed: ParsedObjectKey, objects: list[ObjectInfo], known: _KnownOffsets) -> str | None:
    """None when a segment the store does not know is provably redundant (deleting it loses no
    record); else the line saying why its objects stay."""
    log_key = next((o.key for o in objects if rsm.keys.parse(o.key).suffix == LOG_SUFFIX), None)
    if log_key is None:
        return None  # index files, a snapshot, a manifest: no record is in them
    tip = parsed.topic_id_partition
    finished, lost, deleting = known.of(tip)
    if deleting:
        return None  # its topic was deleted: its data goes with it
    where = rsm.location(log_key)
    try:
        found = scan_log_object(rsm, log_key)
    except RemoteStorageError as e:
        return f"{e}; a segment object not in the store, kept"
    if found.problem is not None:
        return f"{found.problem_line(where)}; a segment object not in the store, kept (never deleted)"
    if found.last_offset is None:
        return None  # no batch: no record
    start, end = min(parsed.start_offset, found.first_offset), found.last_offset
    holes = uncovered(start, end, finished)
    open_lost = [r for r in lost if r[0] <= end and r[1] >= start]
    if not holes and not open_lost:
        return None  # every offset is in finished segments the store knows (a crashed copy, re-copied)
    why = (f"offsets {', '.join(f'{a}..{b}' for a, b in holes)} are in no finished segment" if holes else
           f"it covers the open lost range {open_lost[0][0]}..{open_lost[0][1]}")
    return f"{where}: segment {start}..{end} of {tip.topic_partition} is not in the store; run kts recover ({why}); kept"


# --- manifests -----------------------------------------------------------------------------------


def _objects_problem(rsm: RemoteStorageManager, md: RemoteLogSegmentMetadata) -> str | None:
    """The first object of the segment that does not have its recorded CRC-32C, or None."""
    for obj in stored_objects(md.custom_metadata).values():
        try:
            problem = object_checksum_problem(rsm, obj)
        except RemoteStorageError as e:
            problem = str(e)
        if problem is not None:
            return problem
    return None


def _repair_manifest(store, rsm: RemoteStorageManager, md: RemoteLogSegmentMetadata, problem: str, dry_run: bool) -> str:
    """Write a finished segment's manifest again from the store's row (its objects verified), under
    the partition lock so no expiry deletes the segment meanwhile; the line saying what was done."""
    if dry_run:
        return f"{problem}; would be written again from the store"
    tip = md.topic_id_partition
    with store.try_partition_lock(tip) as lock:
        if lock is None:
            return f"{problem}; not written again yet: a copy or an expiry holds the partition (the next scrub does it)"
        current = store.segment(md.segment_id)
        if current is None or current.state is not S.COPY_SEGMENT_FINISHED:
            return f"{problem}; not written again: the segment is no longer finished"
        try:
            entries = write_manifest(rsm, current, stored_objects(current.custom_metadata), manifest_context_for(store, tip))
        except (RemoteStorageError, ValueError) as e:
            return f"{problem}; not written again: {e}"
        store.forget_segment_manifest(current.segment_id, problem)
        store.record_segment_manifest(current.segment_id, entries)
    return f"{problem}; written again from the store"
