"""Scrub: reconcile the remote tier's listing with the metadata store.

The whole tier is listed first; a listing that fails half-way raises before anything is touched.
Then, per segment the listed keys name (``keys.parse``; every other object — remote log index
files, log-start-offset records, another tool's keys — is never touched):

- a segment id the store does not know, whose objects are all older than the grace period: an
  orphan (a copy whose STARTED row was lost with a database, another kts's leftovers), deleted;
- a segment the store has as DELETE_SEGMENT_FINISHED: leftovers of its delete, deleted;
- DELETE_SEGMENT_STARTED, or COPY_SEGMENT_STARTED older than the grace period: the delete procedure
  finishes it (``copier.delete_remote_log_segment``), under the partition lock, skipped while a
  copy or an expiry holds it;
- COPY_SEGMENT_FINISHED: referenced, never deleted. Every finished segment of the store is checked
  against the listing (missing objects, wrong sizes; ``deep``: every object's CRC-32C, read in
  chunks) and what is found is recorded as damage, which the next copy pass re-copies from a local
  segment that still exists (``copier.recopy_damaged``).

Multipart uploads (S3) and temporary files (directory tier) older than the grace period are
aborted. ``dry_run`` reports what would be done and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kts_resources.copier import delete_remote_log_segment
from kts_resources.quotas import SystemClock
from kts_resources.remote_integrity import inspect_finished_segments
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentState
from kts_resources.remote_storage.base import RemoteStorageManager

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
    dry_run: bool = False

    @property
    def clean(self) -> bool:
        return not self.damaged

    def to_json(self) -> dict:
        return {"objects_listed": self.objects_listed, "segments_checked": self.segments_checked,
                "orphans_deleted": len(self.orphans_deleted), "deletes_finished": self.deletes_finished,
                "uploads_aborted": self.uploads_aborted, "young_left": self.young_left, "locked_left": self.locked_left,
                "damaged": self.damaged, "dry_run": self.dry_run}


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
    clock = SystemClock()
    for segment_id, (parsed, objects) in by_segment.items():
        md = store.segment(segment_id)
        old = all(o.last_modified is not None and now - o.last_modified >= grace_s for o in objects)
        if md is None or md.state is S.DELETE_SEGMENT_FINISHED:
            if md is None and not old:
                report.young_left += len(objects)
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
                report.deletes_finished += 1
        elif md.state is S.COPY_SEGMENT_STARTED:
            report.young_left += len(objects)
    for tip in store.partitions():
        finished = store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED})
        if not finished:
            continue
        found = inspect_finished_segments(rsm, tip, finished, listed=sizes,
                                          verify_crc_max_bytes=2**63 if deep else 0)
        report.segments_checked += len(finished)
        for md, problems in found.damaged:
            report.damaged.append(f"{tip.topic_partition} segment {md.start_offset}..{md.end_offset}: {'; '.join(problems)}")
            if not dry_run:
                store.record_segment_damage(RemoteLogSegmentId(tip, md.segment_id.id), "; ".join(problems))
        say(f"{tip.topic_partition}: {len(finished)} finished segments checked, {len(found.damaged)} damaged")
    if not dry_run:
        report.uploads_aborted = rsm.abort_incomplete_uploads(grace_s)
    return report
