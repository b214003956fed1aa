"""The copy procedure: a partition's rolled, committed segments → the remote tier + metadata store.

Kafka's RLMCopyTask, as a plain function the pipeline calls. Per partition, under the metadata
store's partition lock: repair what a crashed run left behind, pick the candidates, then per
segment: verify every batch CRC → COPY_SEGMENT_STARTED → upload all its files → its manifest →
COPY_SEGMENT_FINISHED (so the tier alone describes every finished segment: ``kts recover``).
A failed upload is cleaned up by the one delete procedure, ``delete_remote_log_segments``
(DELETE_SEGMENT_STARTED → objects → DELETE_SEGMENT_FINISHED, a batch at a time), which expiry,
scrub and topic deletion share.
"""

from __future__ import annotations

import logging
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache

from kts_resources.kafka.checkpoints import EpochEntry, epochs_up_to, format_leader_epoch_checkpoint
from kts_resources.kafka.indexes import largest_timestamp
from kts_resources.kafka.logdir import LogDir, PartitionDir, SegmentFiles
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.errors import FileChangedError
from kts_resources.kafka.segment import verify_segment_file
from kts_resources.tiering.lineage import copy_start_offset, diverges_at, last_epoch
from kts_resources.tiering.segment_slice import SegmentSlice, SliceError, slice_segment
from kts_resources.tiering.lost_ranges import LOST_CAUSE, detect_lost_ranges
from kts_resources.metadata.store import RemoteLogMetadataStore, StaleTopicIdError
from kts_resources.tiering.quotas import Clock, RLMQuotaManager, SystemClock
from kts_resources.remote_log import (
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    TopicIdPartition,
    VerifiedChecksum,
)
from kts_resources.remote_storage.base import RemoteStorageManager, StoredObject, segment_custom_metadata, stored_objects
from kts_resources.remote_storage.keys import MANIFEST_SUFFIX
from kts_resources.remote_storage.manifest import SegmentManifest, encode_manifest
from kts_resources.tiering.partition_view import PartitionView, locked_partition, partition_view
from kts_resources.tiering.tiers import LocatedPartition, adopt_first_log_start_offset, copy_candidates, log_start_offset, partition_topic_id

log = logging.getLogger(__name__)


# --- leader epochs of a segment -----------------------------------------------------------------


def segment_leader_epochs(lineage: Sequence[EpochEntry], batch_epochs: Mapping[int, int], start_offset: int, end_offset: int) -> dict[int, int]:
    """Epoch → first offset of that epoch in [start_offset, end_offset] (never empty).

    From the partition's leader-epoch lineage, as Kafka does; where the lineage does not cover the
    segment (a truncated or missing checkpoint) the batches' own partition leader epochs say it
    (``batch_epochs``: epoch → base offset of its first batch, as ``verify_segment`` finds them).
    """
    epochs: dict[int, int] = {}
    covering = [e for e in epochs_up_to(lineage, end_offset)]
    if covering and covering[0].start_offset <= start_offset:
        for i, entry in enumerate(covering):
            next_start = covering[i + 1].start_offset if i + 1 < len(covering) else None
            if next_start is not None and next_start <= start_offset:
                continue  # this epoch ended before the segment begins
            epochs.setdefault(entry.epoch, max(entry.start_offset, start_offset))
        if epochs:
            return epochs
    for epoch, first_offset in batch_epochs.items():
        epochs.setdefault(epoch, max(first_offset, start_offset))
    return epochs or {0: start_offset}  # magic 0/1 data carries no epochs; Kafka treats it as epoch 0


# --- the one delete procedure --------------------------------------------------------------------


def delete_remote_log_segment(
    store: RemoteLogMetadataStore,
    storage: RemoteStorageManager,
    metadata: RemoteLogSegmentMetadata,
    clock: Clock,
) -> RemoteLogSegmentMetadata:
    """Delete one remote segment (``delete_remote_log_segments`` of one); returns its final metadata."""
    return delete_remote_log_segments(store, storage, [metadata], clock)[0]


# Segments per batch of delete bookkeeping: a transaction of this many rows stays short, and their
# objects (5-7 each) fill a handful of S3 DeleteObjects requests of up to 1,000 keys.
DELETE_BATCH_SEGMENTS = 500


def delete_remote_log_segments(
    store: RemoteLogMetadataStore,
    storage: RemoteStorageManager,
    metadatas: Sequence[RemoteLogSegmentMetadata | uuid.UUID],
    clock: Clock,
    *,
    batch: int | None = None,
) -> list[RemoteLogSegmentMetadata]:
    """Delete remote segments as Kafka's RemoteLogManager.deleteRemoteLogSegment does, a batch
    (``DELETE_BATCH_SEGMENTS`` when None) at a time: DELETE_SEGMENT_STARTED for the batch (one
    store transaction) → every object of those segments (log, indexes, snapshot, epochs; the
    manifests first), in the tier's batched deletes → DELETE_SEGMENT_FINISHED (one transaction)
    for the segments whose objects are all gone. Returns every segment's final metadata, in the
    order given. Segment ids do as well as metadata: each segment's row is read by its STARTED step.

    The batches overlap: while one batch's objects are being deleted (in a worker thread), the
    store records the previous batch's FINISHED and the next batch's STARTED, so a pass costs
    about its deletes, not its deletes plus two transactions a batch. The order per segment stays
    STARTED (committed) → objects → FINISHED: no object is deleted before its segment is STARTED,
    no segment is FINISHED before all of its objects are gone.

    The one procedure every remote delete goes through: the copy's clean-up and repair, expiry,
    scrub and the deletion of a topic's partitions (``partition_admin``).
    Idempotent, so an interrupted delete is finished by calling it again: the state is the store's
    (not ``metadatas``', which may be stale), a segment already in DELETE_SEGMENT_STARTED continues,
    one already DELETE_SEGMENT_FINISHED is left as it is, and objects already gone are fine. A kill
    anywhere leaves each segment either as it was, or STARTED (unreadable, its objects partly or
    wholly gone): never FINISHED with an object left. A segment some of whose objects the tier
    would not delete stays STARTED, the rest of its batch (and of the batch already under way) is
    finished, no further batch is started, and RemoteStorageError names it (the next pass deletes
    it again). The caller holds the partition lock.
    RemoteResourceNotFoundError when the store has no such segment.
    """
    size = batch or DELETE_BATCH_SEGMENTS
    ids = [md if isinstance(md, uuid.UUID) else md.segment_id.id for md in metadatas]
    batches = [ids[i : i + size] for i in range(0, len(ids), size)]
    done: dict[uuid.UUID, RemoteLogSegmentMetadata] = {}
    failed: dict[uuid.UUID, str] = {}

    def finish(pending: list[RemoteLogSegmentMetadata], deleting: Future) -> None:
        failed.update(deleting.result())
        gone = [md for md in pending if md.segment_id.id not in failed]
        if gone:
            now = clock.now_ms()
            # The rows were read by the STARTED step: only their ids go to the store.
            store.finish_segment_deletes([md.segment_id.id for md in gone], now)
            done.update((md.segment_id.id, replace(md, state=RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, event_timestamp_ms=now))
                        for md in gone)

    if batches:
        # One worker: the batches' deletes go one after another; leaving the with-block waits for
        # the one under way, so nothing is still deleting when this returns or raises.
        with ThreadPoolExecutor(1, thread_name_prefix="kts-delete-batch") as tier:
            under_way: tuple[list[RemoteLogSegmentMetadata], Future] | None = None
            for id_batch in batches:
                started = store.update_remote_log_segments_delete_state(
                    id_batch, RemoteLogSegmentState.DELETE_SEGMENT_STARTED, clock.now_ms())
                # The store's current rows (custom metadata, state), not the caller's copies; finished ones are left.
                pending = [md for md in started if md.state is RemoteLogSegmentState.DELETE_SEGMENT_STARTED]
                done.update((md.segment_id.id, md) for md in started)
                submitted = (pending, tier.submit(storage.delete_segments_data, pending)) if pending else None
                if under_way is not None:
                    finish(*under_way)
                under_way = submitted
                if failed:
                    break
            if under_way is not None:
                finish(*under_way)
    if failed:
        first = next(iter(failed.values()))
        raise RemoteStorageError(first + (f" (and {len(failed) - 1} more segments left in DELETE_SEGMENT_STARTED)"
                                          if len(failed) > 1 else " (the segment stays in DELETE_SEGMENT_STARTED)"))
    return [done[sid] for sid in ids]


# --- manifests ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestContext:
    """What a manifest records besides the segment: the topic's config overrides and the
    partition's log start offset in the store, as of the copy pass."""

    topic_configs: Mapping[str, str]
    log_start_offset: int


def manifest_context_for(store: RemoteLogMetadataStore, tip: TopicIdPartition) -> ManifestContext:
    """The partition's manifest context as the store has it now."""
    return ManifestContext(store.topic_configs(tip.topic).overrides, store.partition_state(tip).log_start_offset)


def write_manifest(storage: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, objects: Mapping[str, StoredObject],
                   context: ManifestContext) -> dict[str, str]:
    """Upload the segment's manifest (after its objects); returns its custom-metadata entries
    (``manifest.key``, ``manifest.size``, ``manifest.crc32c``) for the store."""
    manifest = SegmentManifest.of(metadata, objects, topic_configs=context.topic_configs,
                                  log_start_offset=context.log_start_offset)
    stored = storage.put_object(storage.keys.manifest_key(metadata.segment_id, metadata.start_offset), encode_manifest(manifest))
    return segment_custom_metadata({MANIFEST_SUFFIX: stored})


def backfill_manifests(store: RemoteLogMetadataStore, storage: RemoteStorageManager, tip: TopicIdPartition,
                       context: ManifestContext, *, batch: int = 1000) -> int:
    """Write the manifest of every finished segment the store has none recorded for (copied before
    manifests existed). The caller holds the partition lock. Cheap when there is nothing to do:
    one probe of an index that is then empty. Returns how many were written."""
    written = 0
    while True:
        missing = store.finished_segments_without_manifest(tip, limit=batch)
        done = 0
        for md in missing:
            try:
                manifest = write_manifest(storage, md, stored_objects(md.custom_metadata), context)
            except ValueError as e:  # its recorded objects cannot make a manifest: say so, never guess
                log.warning("%s: segment %d (%s) gets no manifest: %s", tip.topic_partition, md.start_offset, md.segment_id.id, e)
                continue
            store.record_segment_manifest(md.segment_id, manifest)
            done += 1
        written += done
        if len(missing) < batch or not done:  # a page of segments that cannot have one ends the pass
            return written


# --- the procedure -------------------------------------------------------------------------------


class CorruptSegmentError(Exception):
    """A segment that fails its CRC or holds invalid bytes: it is never copied."""


class EmptySegment(Exception):
    """A closed segment without a single batch: there is nothing to copy, and no end offset to
    record; its offsets are in neither tier (the lost-range rule judges them)."""


@dataclass
class PartitionCopyResult:
    """What one copy pass did for one partition."""

    topic_partition: TopicPartition
    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    repaired: list[uuid.UUID] = field(default_factory=list)  # leftovers of crashed runs, cleaned up
    manifests_backfilled: int = 0  # manifests written for segments copied before manifests existed
    skipped: str | None = None  # why the partition was not looked at (tiering off, no checkpoints…)
    stopped: str | None = None  # what stopped the pass early (a corrupt segment, a failed upload)
    lost: list[tuple[int, int]] = field(default_factory=list)  # offset ranges this pass found lost (lost_ranges.py)
    recopied: list[RemoteLogSegmentMetadata] = field(default_factory=list)  # replacements of damaged remote segments
    damaged_left: list[str] = field(default_factory=list)  # damaged remote segments that could not be re-copied, and why
    throttle_ms: int = 0
    # The offset this replica's lineage diverges from the partition's at (it copies only below).
    behind_lineage: int | None = None
    # The pass looked for lost ranges at its end, under the partition lock (detect_lost_ranges).
    looked_for_lost_ranges: bool = False

    @property
    def copied_bytes(self) -> int:
        return sum(md.segment_size_in_bytes for md in self.copied)


ProgressCallback = Callable[[TopicPartition, RemoteLogSegmentMetadata], None]


def copy_partition(
    partition: PartitionDir,
    log_dir: LogDir,
    store: RemoteLogMetadataStore,
    storage: RemoteStorageManager,
    *,
    quota: RLMQuotaManager | None = None,
    broker_id: int = 0,
    clock: Clock | None = None,
    lock_timeout_s: float | None = None,
    on_copied: ProgressCallback | None = None,
    index_cache_home: Path | None = None,
    not_leader: str | None = None,
) -> PartitionCopyResult:
    """Copy every eligible segment of one partition, oldest first, one at a time.

    ``not_leader``: why this broker's replica must not copy (``leadership.copy_refusal``: another
    broker leads, or none does); the partition is skipped with it.

    ``index_cache_home`` (KTS_HOME): each copied segment's remote log index entries, taken from the
    copy's own verification pass, go into that machine's index cache, so the index build need not
    read the segment again.

    Safe to run again at any point and concurrently with itself: the partition lock serialises
    writers, a fresh segment UUID per attempt means no two attempts share an object key, and a
    crash leaves STARTED rows that the next pass cleans up before it copies on.
    """
    clock = clock or SystemClock()
    tp = partition.topic_partition
    result = PartitionCopyResult(tp)
    try:
        tip = _topic_id_partition(partition, store)
    except StaleTopicIdError as e:
        # A dir left from an earlier incarnation of a re-created topic: its data is not the topic's now.
        result.skipped = f"{partition.path}: {e}; the partition is not copied"
        log.warning("%s", result.skipped)
        return result
    # A topic some kts still sees is not gone (partition_admin) — a follower's too: while no broker
    # leads, nobody copies, and the topic must not look deleted for it.
    store.mark_topics_seen([tp.topic])
    if not_leader is not None:
        result.skipped = not_leader
        return result
    config = store.topic_configs(tp.topic)
    if not config.copy_enabled(tp.topic):
        result.skipped = "tiering is off for this topic (internal, compacted, remote.storage.enable=false or remote.log.copy.disable=true)"
        return result
    deleted = store.partition_state(tip).delete_state
    if deleted is not None:
        # `kts topic delete` (or delete-on-disable) removed its remote data: copying it again would undo that.
        result.skipped = f"the partition's remote data was deleted ({deleted.name}); it is not copied again"
        return result
    # The partition as this pass sees it; what the checks here do not read is read under the lock.
    view = partition_view(LocatedPartition(tp.dir_name, log_dir, partition, owned=False), store, tip=tip)
    if view.checkpointed_high_watermark is None or view.recovery_point is None:
        missing = "replication-offset-checkpoint" if view.checkpointed_high_watermark is None else "recovery-point-offset-checkpoint"
        result.skipped = f"{log_dir.path / missing} has no entry for {tp}: what is committed is unknown, so nothing is copied"
        return result

    with locked_partition(store, tip, view.located, timeout_s=lock_timeout_s, view=view) as held:
        lock = held.lock
        result.repaired = _finish_interrupted(store, storage, tip, clock)
        # One listing for the whole pass: what is verified and copied is what was listed.
        segments = view.segments
        adopt_first_log_start_offset(store, tip, partition, log_dir, segments)  # before the manifests carry it
        manifest_context = manifest_context_for(store, tip)
        try:
            result.manifests_backfilled = backfill_manifests(store, storage, tip, manifest_context)
        except Exception as e:  # noqa: BLE001 — the next pass tries again; copying goes on
            log.warning("%s: manifests of earlier segments not written yet: %s", tp, e)
        try:
            recopy_damaged(partition, segments, store, storage, tip, result, quota=quota, broker_id=broker_id, clock=clock,
                           manifest_context=manifest_context)
        except (CorruptSegmentError, EmptySegment, FileChangedError, OSError) as e:
            result.stopped = str(e)
        except CopyFailed as e:  # as for a copy: this partition's pass stops, the next retries
            result.stopped = e.describe("re-copy of a damaged remote segment")
        if result.stopped is not None:
            log.error("%s: %s", tp, result.stopped)
            return result
        if segments:
            # Where kts's watch over the partition begins: older data was gone before it looked.
            store.observe_first_offset(tip, segments[0].base_offset)
        lineage = view.local_lineage
        from_offset, copy_limit = _where_to_copy(store, tip, lineage, view)
        candidates = copy_candidates(
            segments,
            high_watermark=view.high_watermark,
            recovery_point=view.recovery_point,
            # The local log's start alone (the broker's checkpoint bounds it), never below kts's
            # record, read again: adopting the first log start offset above may have moved it.
            log_start_offset=log_start_offset(checkpointed=view.checkpointed_log_start_offset,
                                              local_log_start_offset=view.local_log_start_offset,
                                              recorded=store.partition_state(tip).log_start_offset),
            highest_copied_offset=from_offset - 1,
            copy_limit=copy_limit,
        )
        if copy_limit is not None:
            result.behind_lineage = copy_limit
        # Segment n+1 is verified while segment n uploads: the upload waits on the kernel (or the
        # network) with the GIL released, and verifying only reads. It starts after n's
        # COPY_SEGMENT_STARTED, so that the store's round trips do not queue for the GIL behind it.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kts-copy-prepare") as prepare:
            def prepared(i: int) -> Future:
                return prepare.submit(_prepare, partition, candidates[i], tip, lineage, broker_id, clock,
                                      ri.DEFAULT_CHUNK_BYTES if index_cache_home is not None else None, from_offset)

            pending = prepared(0) if candidates else None
            for i, segment in enumerate(candidates):
                lock.assert_held()  # a lost lock means another run may be copying now: stop
                try:
                    md, data, chunks, cut = pending.result()
                except EmptySegment as e:
                    log.warning("%s: %s", tp, e)
                    pending = prepared(i + 1) if i + 1 < len(candidates) else None
                    continue
                except (CorruptSegmentError, FileChangedError, OSError) as e:
                    # A segment the broker deleted or truncated meanwhile, or a damaged one.
                    result.stopped = str(e)
                    log.error("%s: %s", tp, e)
                    break
                if md.end_offset < from_offset:
                    # Its last batch is below where copying starts: the next file's name overstated
                    # it (a segment vanished after it) and it is in the tier already.
                    pending = prepared(i + 1) if i + 1 < len(candidates) else None
                    continue
                if cut is not None:
                    log.info("%s: segment %d copied from offset %d on (its part below is in the tier already)",
                             tp, segment.base_offset, cut.base_offset)
                if quota is not None:
                    allowance = quota.window_allowance_bytes
                    if allowance is not None and md.segment_size_in_bytes > allowance:
                        log.warning("%s: segment %d (%d bytes) is larger than the copy quota's window allowance (%d bytes)",
                                    tp, segment.base_offset, md.segment_size_in_bytes, allowance)
                    result.throttle_ms += quota.acquire(md.segment_size_in_bytes)
                store.add_remote_log_segment_metadata(md)
                pending = prepared(i + 1) if i + 1 < len(candidates) else None
                try:
                    finished = _upload_and_finish(store, storage, md, data, clock, manifest_context)
                except CopyFailed as e:  # any failure of one upload stops this partition's pass
                    result.stopped = e.describe(f"copy of {segment.log}")
                    log.error("%s: %s", tp, result.stopped)
                    break
                finally:
                    if cut is not None:
                        cut.remove()
                result.copied.append(finished)
                if index_cache_home is not None and chunks is not None:
                    _cache_index_entries(index_cache_home, tip, storage, finished, chunks)
                if on_copied is not None:
                    on_copied(tp, finished)
        # After the copies, still under the lock: the local listing first, then the remote tier.
        result.lost = detect_lost_ranges(store, tip, partition.segments(), how_found="copy pass")
        result.looked_for_lost_ranges = True
        for start, end in result.lost:
            log.error("%s: offsets %d..%d %s", tp, start, end, LOST_CAUSE)
    return result


def _where_to_copy(store: RemoteLogMetadataStore, tip: TopicIdPartition, lineage: Sequence[EpochEntry],
                   view: PartitionView) -> tuple[int, int | None]:
    """(the first offset to copy, the first offset not to copy or None) for a replica with
    ``lineage``, as Kafka's RemoteLogManager decides (kts_resources/tiering/lineage.py): the replica's
    lineage becomes the partition's if it is newer; copying starts one past findHighestRemoteOffset
    over the replica's own lineage; a replica behind the partition's lineage (an old leader not
    truncated yet, a follower that has not fetched the new epoch) copies only below where it
    diverges. Without a lineage (no leader-epoch checkpoint, magic 0/1 data) copying goes on
    from the highest offset copied."""
    current = store.record_lineage(tip, lineage)
    if not lineage:
        return store.partition_state(tip).highest_copied_offset + 1, None
    start = copy_start_offset(lineage, max(view.log_end_offset, lineage[-1].start_offset),
                              lambda epoch: store.highest_finished_offset_for_epoch(tip, epoch))
    behind = last_epoch(lineage) < last_epoch(current)
    return start, diverges_at(lineage, current) if behind else None


def recopy_damaged(
    partition: PartitionDir,
    segments: Sequence[SegmentFiles],
    store: RemoteLogMetadataStore,
    storage: RemoteStorageManager,
    tip: TopicIdPartition,
    result: PartitionCopyResult,
    *,
    quota: RLMQuotaManager | None,
    broker_id: int,
    clock: Clock,
    manifest_context: ManifestContext,
) -> None:
    """Replace each finished remote segment recorded damaged (``record_segment_damage``) by a new
    copy of its local segment, when the local segment is still the one that was copied (same base
    and end offset, same size): a new segment id through COPY_SEGMENT_STARTED → FINISHED, which
    takes over the old one's place in the leader-epoch offset map, then the old one through the
    delete procedure. The new copy comes first, so the range is never without a readable segment;
    a crash in between leaves the old one finished but replaced, and the next pass deletes it.
    Caller holds the partition lock."""
    damaged = store.damaged_segments(tip)
    if not damaged:
        return
    still_damaged = _damage_in_this_tier(store, storage, tip, damaged, result)
    if still_damaged is None:
        return
    by_base = {s.base_offset: s for s in segments}
    lineage = partition.leader_epochs()
    for md, problem in damaged:
        first_epoch = min(md.segment_leader_epochs)
        current = store.remote_log_segment_metadata(tip, first_epoch, md.segment_leader_epochs[first_epoch])
        if current is not None and current.segment_id != md.segment_id and current.end_offset == md.end_offset:
            delete_remote_log_segment(store, storage, md, clock)  # replaced before a crash: finish the job
            continue
        if md.segment_id not in still_damaged:  # whole in this tier: the damage was seen elsewhere
            store.clear_segment_damage(md.segment_id, f"found whole in {storage.location()} before a re-copy")
            continue
        # The local segment holding its start (a remote segment copied from inside one, after a
        # leader change, is cut from it again the same way).
        local = by_base.get(md.start_offset) or next(
            (s for s in by_base.values() if s.base_offset < md.start_offset and s.next_base_offset is not None
             and md.start_offset < s.next_base_offset), None)
        if local is None or local.next_base_offset is None or local.next_base_offset <= md.end_offset:
            result.damaged_left.append(f"segment {md.start_offset}..{md.end_offset} ({problem}): "
                                       "its local segment is gone, so it cannot be re-copied")
            continue
        replacement, data, _chunks, cut = _prepare(partition, local, tip, lineage, broker_id, clock, from_offset=md.start_offset)
        try:
            if (replacement.segment_size_in_bytes, replacement.end_offset) != (md.segment_size_in_bytes, md.end_offset):
                result.damaged_left.append(f"segment {md.start_offset}..{md.end_offset} ({problem}): the local segment is "
                                           f"{replacement.segment_size_in_bytes} bytes ending at offset {replacement.end_offset}, "
                                           f"the remote one was {md.segment_size_in_bytes} bytes; not re-copied")
                continue
            if quota is not None:
                result.throttle_ms += quota.acquire(replacement.segment_size_in_bytes)
            store.add_remote_log_segment_metadata(replacement)
            finished = _upload_and_finish(store, storage, replacement, data, clock, manifest_context)
        finally:
            if cut is not None:
                cut.remove()
        delete_remote_log_segment(store, storage, md, clock)
        result.recopied.append(finished)
        log.warning("%s: re-copied damaged remote segment %d..%d (%s) as %s", tip.topic_partition, md.start_offset,
                    md.end_offset, problem, finished.segment_id.id)
    for line in result.damaged_left:
        log.error("%s: %s", tip.topic_partition, line)


def _damage_in_this_tier(store: RemoteLogMetadataStore, storage: RemoteStorageManager, tip: TopicIdPartition,
                         damaged: Sequence[tuple[RemoteLogSegmentMetadata, str]],
                         result: PartitionCopyResult) -> set | None:
    """The ids of the recorded-damaged segments that are damaged in this tier, every byte read
    (damage recorded against another tier, a wrong KTS_REMOTE_URI, must not stick: issue 34).
    None, with a line in ``damaged_left``, when the tier holds no object of any of the partition's
    finished segments: another tier, where nothing is re-copied."""
    from kts_resources.maintenance.remote_integrity import inspect_finished_segments, tier_holds_any, wrong_tier_line

    listed = {o.key: o.size for o in storage.list_objects(storage.keys.partition_prefix(tip))}
    finished = store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
    if not tier_holds_any(finished, listed):
        result.damaged_left.append(wrong_tier_line(storage, tip, len(finished)))
        return None
    found = inspect_finished_segments(storage, tip, [md for md, _ in damaged], listed=listed, verify_crc_max_bytes=2**63)
    return {md.segment_id for md, _ in found.damaged}


def _topic_id_partition(partition: PartitionDir, store: RemoteLogMetadataStore) -> TopicIdPartition:
    """The partition's topic id from partition.metadata; a topic that predates topic ids keeps
    the one kts recorded for it, or gets a new one."""
    topic_id = partition_topic_id(partition, store) or uuid.uuid4()
    store.ensure_topic(partition.topic, topic_id)
    return TopicIdPartition(topic_id, partition.topic_partition)


def _finish_interrupted(store: RemoteLogMetadataStore, storage: RemoteStorageManager, tip: TopicIdPartition, clock: Clock) -> list[uuid.UUID]:
    """Clean up what a crashed run left: a STARTED copy is abandoned (its objects may be partial),
    an unfinished delete is completed. Runs under the partition lock, so nobody else is mid-way."""
    states = {RemoteLogSegmentState.COPY_SEGMENT_STARTED, RemoteLogSegmentState.DELETE_SEGMENT_STARTED}
    interrupted = store.list_remote_log_segments(tip, states=states)
    delete_remote_log_segments(store, storage, interrupted, clock)
    return [md.segment_id.id for md in interrupted]


def _prepare(
    partition: PartitionDir,
    segment: SegmentFiles,
    tip: TopicIdPartition,
    lineage: Sequence[EpochEntry],
    broker_id: int,
    clock: Clock,
    index_chunk_bytes: int | None = None,
    from_offset: int = 0,
) -> tuple[RemoteLogSegmentMetadata, LogSegmentData, list | None, SegmentSlice | None]:
    """Check every batch of the segment, then describe it for the metadata store and the upload;
    with ``index_chunk_bytes``, also its remote log index chunks (``SegmentVerification.chunks``).

    The segment ends at its last batch's last offset, never at the next file's base offset - 1:
    what lies between (a segment that vanished, offsets a truncation took) is in neither tier, and
    the lost-range rule must see it so. The file is read, not mapped: the broker may truncate it
    meanwhile, which raises FileChangedError (one line) instead of killing the process (SIGBUS)."""
    assert segment.next_base_offset is not None
    st = os.stat(segment.log)
    found = verify_segment_file(segment.log, chunk_bytes=index_chunk_bytes)
    if found.problem is not None:
        position, problem = found.problem
        raise CorruptSegmentError(f"{segment.log}: byte {position}: {problem}; the segment is not copied")
    if found.last_offset is None:
        raise EmptySegment(f"{segment.log}: holds no batch; nothing to copy")
    if found.last_offset >= segment.next_base_offset or found.last_offset < segment.base_offset:
        raise CorruptSegmentError(
            f"{segment.log}: byte {found.last_position}: offset {found.last_offset} is outside the segment's "
            f"{segment.base_offset}..{segment.next_base_offset - 1} (its base offset to the next segment's)"
        )
    end_offset = found.last_offset
    # Without timestamps (magic 0) the file's modification time stands in (LogSegment.largestTimestamp).
    max_timestamp = largest_timestamp(found.max_timestamp, st.st_mtime_ns)
    files, size, epochs, chunks = segment, found.size, found.epochs, found.chunks
    checksum = VerifiedChecksum(found.crc32c, found.size, st.st_mtime_ns)
    cut = None
    if segment.base_offset < from_offset <= end_offset:
        # The copy starts inside it (after a leader change the tier holds its first part): only its
        # part from the first batch reaching from_offset goes up, as a segment of its own
        # (kts_resources/tiering/segment_slice.py), so no offset goes up twice.
        try:
            cut = slice_segment(segment, from_offset)
        except SliceError as e:
            raise CorruptSegmentError(f"{e}; the segment is not copied") from None
        files, size, epochs, chunks = cut.files, cut.size, cut.epochs, None
        checksum = VerifiedChecksum(cut.crc32c, cut.size, cut.mtime_ns)
        max_timestamp = largest_timestamp(cut.max_timestamp, st.st_mtime_ns)
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
        start_offset=files.base_offset,
        end_offset=end_offset,
        max_timestamp_ms=max_timestamp,
        broker_id=broker_id,
        event_timestamp_ms=clock.now_ms(),
        segment_size_in_bytes=size,
        segment_leader_epochs=segment_leader_epochs(lineage, epochs, files.base_offset, end_offset),
    )
    snapshot = partition.producer_snapshot_path(end_offset + 1)  # the producer state after its last batch
    data = LogSegmentData(
        log_segment=files.log,
        offset_index=files.offset_index,
        time_index=files.time_index,
        transaction_index=files.txn_index,
        producer_snapshot=snapshot if snapshot.exists() else None,
        leader_epoch_index=format_leader_epoch_checkpoint(epochs_up_to(lineage, end_offset)),
        log_segment_checksum=checksum,
    )
    return metadata, data, chunks, cut


def _cache_index_entries(home: Path, tip: TopicIdPartition, storage: RemoteStorageManager,
                         md: RemoteLogSegmentMetadata, chunks: list) -> None:
    """A just-copied segment's remote log index entries into the index cache under ``home``. They
    describe the bytes uploaded: the upload checked its checksum against the verified one. Failing
    here costs only the index build's own read of the segment."""
    try:
        key = storage.segment_object_keys(md)["log"]
        entries = [ri.RemoteLogIndexEntry(first, last, first_ts, last_ts, length, ri.RemoteDataId(md.segment_id.id, position, key))
                   for first, last, first_ts, last_ts, position, length in chunks]
        index_cache.store_segment_entries(index_cache.cache_directory(home, tip), md.segment_id.id,
                                          index_cache.encode_segment_entries(entries))
    except (OSError, ValueError) as e:
        log.warning("%s: remote log index entries of segment %d not cached (the index build reads it): %s",
                    tip.topic_partition, md.start_offset, e)


def _upload_and_finish(
    store: RemoteLogMetadataStore,
    storage: RemoteStorageManager,
    metadata: RemoteLogSegmentMetadata,
    data: LogSegmentData,
    clock: Clock,
    manifest_context: ManifestContext | None = None,
) -> RemoteLogSegmentMetadata:
    """After COPY_SEGMENT_STARTED: upload → manifest → FINISHED; on failure DELETE_STARTED →
    delete (the manifest first) → DELETE_FINISHED, and CopyFailed says whether that clean-up went
    through. The manifest goes up only once every object is there, and FINISHED only once the
    manifest is: no finished segment lacks one."""
    try:
        custom_metadata = storage.copy_log_segment_data(metadata, data)
        context = manifest_context or manifest_context_for(store, metadata.topic_id_partition)
        custom_metadata.update(write_manifest(storage, metadata, stored_objects(custom_metadata), context))
        return store.update_remote_log_segment_metadata(
            metadata.segment_id, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, clock.now_ms(), custom_metadata=custom_metadata
        )
    except Exception as e:
        raise CopyFailed(e, cleaned_up=_abandon(store, storage, metadata, clock)) from e
    except BaseException:
        _abandon(store, storage, metadata, clock)
        raise


class CopyFailed(Exception):
    """One segment's upload (or its COPY_SEGMENT_FINISHED) failed; ``cleaned_up``: its partial
    objects and STARTED row went through the delete procedure (else the next pass's repair does it)."""

    def __init__(self, cause: Exception, *, cleaned_up: bool):
        super().__init__(str(cause))
        self.cause = cause
        self.cleaned_up = cleaned_up

    def describe(self, what: str) -> str:
        done = "was cleaned up" if self.cleaned_up else "could not be cleaned up now (the next pass does it)"
        return f"{what} failed and {done}: {self.cause}"


def _abandon(store: RemoteLogMetadataStore, storage: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, clock: Clock) -> bool:
    """Clean up a failed copy; if the clean-up fails too, the next pass finishes it. True when done."""
    try:
        delete_remote_log_segment(store, storage, metadata, clock)
        return True
    except Exception as e:  # noqa: BLE001
        log.warning("clean-up of failed copy %s deferred to the next pass: %s", metadata.segment_id.id, e)
        return False


# Partitions the copy step (``remote_segments``) copies side by side by default: while one waits on its upload or the store, another
# verifies a segment, and one partition's first segment is never verified ahead of time.
PARALLEL_PARTITIONS = 4
