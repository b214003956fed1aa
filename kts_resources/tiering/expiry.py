"""Expiry: a partition's retention plan from its files and the store, and carrying it out.

Planning reads what :mod:`kts_resources.tiering.retention`'s rules need — the topic's configs, the
COPY_SEGMENT_FINISHED segments, the leader-epoch lineage, local segments' sizes and largest
timestamps (a closed segment's time index ends with its largest timestamp; without timestamps the
file's modification time stands in) — and asks them.

The plan is a value (``PartitionRetention``) made once — by a Spark task or on the driver — and
carried out as it is; it serialises itself for the trip back from Spark.

Carrying it out (Kafka's RemoteLogManager expiration and UnifiedLog.deleteOldSegments), under the
partition lock: the new log start offset is recorded first (so the data is unreadable at once), then the expired remote segments go through the one delete
procedure in batches (DELETE_SEGMENT_STARTED for a batch in one store transaction → their objects in the
tier's batched deletes → DELETE_SEGMENT_FINISHED for the batch; one batch's objects go while the
store records the batches either side of it). In owned log dirs kts
applies local retention itself, as a broker does: only segments a finished remote segment covers
(or all of them by policy when copying is disabled), never the active one, renamed to ``.deleted``
and then removed, with their producer snapshots; the log-start-offset-checkpoint follows a moved
log start offset. A crash anywhere leaves a state the next run converges from: a recorded log start
offset is re-applied, a started delete is finished, ``.deleted`` leftovers are removed.
In broker-owned log dirs nothing local is touched: the plan reports what the broker may delete.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.kafka.checkpoints import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint, write_offset_checkpoint
from kts_resources.kafka.indexes import segment_largest_timestamp
from kts_resources.kafka.logdir import SegmentFiles
from kts_resources.tiering.lineage import diverges_at, last_epoch, readable_spans
from kts_resources.tiering.lost_ranges import uncovered
from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.manifest import put_log_start_offset
from kts_resources.tiering.retention import (
    Expired,
    LocalPlan,
    ClosedSegment,
    RemotePlan,
    RetentionConfig,
    plan_local_retention,
    plan_remote_retention,
)
from kts_resources.tiering.partition_view import PartitionView, locked_partition, partition_view
from kts_resources.tiering.tiers import LocatedPartition

if TYPE_CHECKING:
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.tiering.quotas import Clock
    from kts_resources.remote_storage.base import RemoteStorageManager

log = logging.getLogger(__name__)

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETED_SUFFIX = ".deleted"


@dataclass(frozen=True)
class PartitionRetention:
    """A partition's retention plan in both tiers."""

    tip: TopicIdPartition
    config: RetentionConfig
    log_start_offset: int  # before the plan
    remote: RemotePlan
    local: LocalPlan
    owned: bool  # kts applies the local plan itself

    @property
    def new_log_start_offset(self) -> int:
        start = max(self.log_start_offset, self.remote.log_start_offset)
        if self.owned and not self.config.copy_enabled and self.local.expired:
            # Copying off (KIP-950, or tiering off): the local log keeps retention.*, and what it
            # deletes leaves the log, as UnifiedLog.deleteSegments moves the log start offset and
            # not only the local one. Copying on, local deletion never moves it (finding 1).
            start = max(start, self.local.expired[-1].end_offset + 1)
        return start

    @property
    def has_work(self) -> bool:
        return bool(self.remote.expired) or (self.owned and bool(self.local.expired)) or self.new_log_start_offset > self.log_start_offset

    def metadata(self) -> dict[str, int]:
        """Numbers for the retention_state asset: what is to expire per tier, the delete lag
        (Kafka's RemoteDeleteLagBytes / RemoteDeleteLagSegments) and the new log start offset."""
        return {
            "remote_bytes_to_expire": self.remote.bytes,
            "remote_segments_to_expire": len(self.remote.expired),
            "local_bytes_to_expire": self.local.bytes,
            "local_segments_to_expire": len(self.local.expired),
            "delete_lag_bytes": self.remote.bytes,
            "delete_lag_segments": len(self.remote.expired),
            "log_start_offset": self.new_log_start_offset,
            "oldest_retained_timestamp": self.remote.oldest_retained_timestamp,
        }

    def to_json(self) -> str:
        """The plan as text, for the trip from a Spark task to the driver (``from_json`` reads it back)."""
        def expired(plan: RemotePlan | LocalPlan) -> list[list]:
            return [[e.start_offset, e.end_offset, e.size_bytes, e.reason, None if e.segment_id is None else str(e.segment_id)]
                    for e in plan.expired]

        return json.dumps({
            "topic_id": str(self.tip.topic_id), "topic": self.tip.topic, "partition": self.tip.topic_partition.partition,
            "config": dataclasses.asdict(self.config), "log_start_offset": self.log_start_offset, "owned": self.owned,
            "remote": {"expired": expired(self.remote), "log_start_offset": self.remote.log_start_offset,
                       "oldest_retained_timestamp": self.remote.oldest_retained_timestamp},
            "local": {"expired": expired(self.local), "local_log_start_offset": self.local.local_log_start_offset},
        })

    @classmethod
    def from_json(cls, text: str) -> "PartitionRetention":
        fields = json.loads(text)

        def expired(rows: list[list]) -> list[Expired]:
            return [Expired(start, end, size, reason, None if sid is None else uuid.UUID(sid)) for start, end, size, reason, sid in rows]

        remote, local = fields["remote"], fields["local"]
        return cls(TopicIdPartition(uuid.UUID(fields["topic_id"]), TopicPartition(fields["topic"], fields["partition"])),
                   RetentionConfig(**fields["config"]), fields["log_start_offset"],
                   RemotePlan(expired(remote["expired"]), remote["log_start_offset"], remote["oldest_retained_timestamp"]),
                   LocalPlan(expired(local["expired"]), local["local_log_start_offset"]), owned=fields["owned"])


def local_segments(segments: Sequence[SegmentFiles]) -> tuple[list[ClosedSegment], int]:
    """(the closed segments as retention sees them, the active segment's size)."""
    closed = []
    for s in segments:
        if s.active or s.next_base_offset is None:
            continue
        try:
            size = s.log.stat().st_size
        except FileNotFoundError:
            continue  # deleted since listed
        closed.append(ClosedSegment(s.base_offset, s.next_base_offset - 1, size, segment_largest_timestamp(s)))
    active = segments[-1] if segments and segments[-1].active else None
    try:
        active_size = active.log.stat().st_size if active else 0
    except FileNotFoundError:
        active_size = 0
    return closed, active_size


def plan_partition(
    located: LocatedPartition | None,
    tip: TopicIdPartition,
    store: "RemoteLogMetadataStore",
    *,
    now_ms: int,
    segments: Sequence[SegmentFiles] | None = None,
    view: PartitionView | None = None,
    config: RetentionConfig | None = None,
) -> PartitionRetention:
    """The partition's retention plan now (``located``: None when it is in no log dir), from its
    ``view`` (one is read when the caller has none) and its topic's retention ``config`` (read
    from the store when the caller has none)."""
    view = view if view is not None else partition_view(located, store, tip=tip, segments=segments)
    if config is None:
        config = RetentionConfig.from_topic_config(store.topic_configs(tip.topic), tip.topic, store.broker_configs())
    start, lineage, spans = view.log_start_offset, view.lineage, view.spans
    local_epochs = view.local_lineage
    closed, active_size = local_segments(view.segments)
    # What a reader can read from the tier (the lineage's, not an old leader's copy): the bound
    # for local retention, and where the local-only bytes begin.
    highest_copied = spans[-1].end_offset if spans else -1
    # UnifiedLog.onlyLocalLogSegmentsSize: segments from the highest copied offset on, the active one
    # included — of the partition's log: a replica behind the lineage (an old leader not truncated
    # yet) counts only what lies below where it diverged, its other records being no longer the log's.
    diverged = diverges_at(local_epochs, lineage) if last_epoch(local_epochs) < last_epoch(lineage) else None
    only_local = sum(s.size_bytes for s in closed if s.base_offset >= highest_copied and (diverged is None or s.end_offset < diverged))
    only_local += active_size if diverged is None else 0
    remote = plan_remote_retention(view.finished, log_start_offset=start, lineage=lineage,
                                   only_local_bytes=only_local, config=config, now_ms=now_ms)
    local = plan_local_retention(closed, active_size_bytes=active_size, high_watermark=view.high_watermark,
                                 highest_copied_offset=highest_copied, log_start_offset=max(start, remote.log_start_offset),
                                 config=config, now_ms=now_ms)
    return PartitionRetention(tip, config, start, remote, local, owned=located is not None and located.owned)


@dataclass
class ExpiryResult:
    """What one expiry pass over a partition did."""

    tip: TopicIdPartition
    log_start_offset: int
    remote_deleted: list[int] = field(default_factory=list)  # start offsets
    remote_bytes_deleted: int = 0
    local_deleted: list[int] = field(default_factory=list)  # base offsets
    local_bytes_deleted: int = 0
    local_kept: list[str] = field(default_factory=list)  # why a planned local deletion did not happen


def expire_partition(
    plan: PartitionRetention,
    located: LocatedPartition | None,
    store: "RemoteLogMetadataStore",
    storage: "RemoteStorageManager",
    *,
    clock: "Clock",
    lock_timeout_s: float | None = None,
    remote: bool = True,
) -> ExpiryResult:
    """Carry out ``plan``, the partition's retention plan (``plan_partition``; see the module docstring).

    ``remote=False``: only the local part (a follower's kts in a cluster whose leadership is known:
    the remote tier's retention is the leader's kts's, as Kafka runs RemoteLogManager's expiration
    on the leader only — a follower counts its own uncopied bytes, which lag, as the log's)."""
    from kts_resources.tiering.copier import delete_remote_log_segments

    tip = plan.tip
    with locked_partition(store, tip, located, timeout_s=lock_timeout_s) as held:
        if located is not None and located.owned:
            remove_deleted_leftovers(located.partition.path)
        # Deletes an earlier pass started and did not finish (killed, or the tier failed) go first.
        delete_remote_log_segments(store, storage, store.list_remote_log_segments(
            tip, states={RemoteLogSegmentState.DELETE_SEGMENT_STARTED}), clock)
        # The plan was made before the lock was taken (in a Spark task, perhaps): what another
        # writer did since is re-checked here, cheaply, and never re-planned. A remote segment the
        # plan names that is no longer COPY_SEGMENT_FINISHED (another expiry, a re-copy of a damaged
        # segment, topic deletion took it) is not deleted or counted again; a partition whose remote
        # data was deleted since gets no log start offset or manifest written into the emptied tier.
        # Local deletion re-checks its own safety rule under the lock (``_apply_local``).
        # The view was read under the lock: its store rows are the ones this pass acts on.
        if not remote or held.view.state.delete_state is not None:
            plan = dataclasses.replace(plan, remote=RemotePlan(log_start_offset=plan.log_start_offset))
        elif plan.remote.expired:
            # Only the planned segments' states: their rows are read once, by the delete's STARTED step.
            states_now = store.segment_states(e.segment_id for e in plan.remote.expired)
            plan = dataclasses.replace(plan, remote=dataclasses.replace(
                plan.remote, expired=[e for e in plan.remote.expired if states_now.get(e.segment_id) is FINISHED]))
        result = ExpiryResult(tip, plan.new_log_start_offset)
        if plan.new_log_start_offset > plan.log_start_offset or plan.remote.expired:
            # First: the data below it is unreadable from now on, whatever happens next; the tier
            # records it too, before any object goes, so that `kts recover` restores it.
            result.log_start_offset = store.update_log_start_offset(tip, plan.new_log_start_offset)
            if result.log_start_offset > 0:
                put_log_start_offset(storage, tip, result.log_start_offset)
        # Then the expired segments, a batch at a time through the delete states (copier's procedure).
        delete_remote_log_segments(store, storage, [e.segment_id for e in plan.remote.expired], clock)
        result.remote_deleted.extend(e.start_offset for e in plan.remote.expired)
        result.remote_bytes_deleted += sum(e.size_bytes for e in plan.remote.expired)
        if located is not None and located.owned:
            _apply_local(located, tip, store, plan, result, held.view)
    return result


def _apply_local(located: LocatedPartition, tip: TopicIdPartition, store: "RemoteLogMetadataStore",
                 plan: PartitionRetention, result: ExpiryResult, view: PartitionView) -> None:
    partition = located.partition
    segments = {s.base_offset: s for s in partition.segments()}
    # The tier as it is after this pass's remote deletions (the view's listing is from before them).
    finished = store.list_remote_log_segments(tip, states={FINISHED})
    # Held in the tier means readable there: on the partition's lineage, not merely in some segment.
    held = [(span.start_offset, span.end_offset) for span in readable_spans(finished, view.lineage)]
    for expired in plan.local.expired:
        segment = segments.get(expired.start_offset)
        if segment is None or segment.active:
            continue
        below_start = expired.end_offset < result.log_start_offset  # no longer part of the log
        covered = not uncovered(expired.start_offset, expired.end_offset, held)
        if plan.config.copy_enabled and not covered and not below_start:
            # Never delete what is not provably in the remote tier.
            result.local_kept.append(f"{segment.log}: no finished remote segment holds offsets "
                                     f"{expired.start_offset}..{expired.end_offset}; kept")
            break
        delete_local_segment(partition, segment)
        result.local_deleted.append(expired.start_offset)
        result.local_bytes_deleted += expired.size_bytes
    tp = partition.topic_partition
    checkpoint = located.log_dir.path / LOG_START_OFFSET_CHECKPOINT
    if checkpoint.exists():
        offsets = read_offset_checkpoint(checkpoint)
        if offsets.get(tp, -1) < result.log_start_offset:
            offsets[tp] = result.log_start_offset
            write_offset_checkpoint(checkpoint, offsets)


def delete_local_segment(partition, segment: SegmentFiles) -> None:
    """Kafka's way: every file of the segment renamed to ``.deleted`` first (the log no longer
    lists it), then removed; with the producer snapshot at its base offset."""
    files = [segment.log, segment.offset_index, segment.time_index, segment.txn_index,
             partition.producer_snapshot_path(segment.base_offset)]
    renamed = []
    for path in files:
        if path is None:
            continue
        target = path.with_name(path.name + DELETED_SUFFIX)
        try:
            os.replace(path, target)
        except FileNotFoundError:
            continue
        renamed.append(target)
    for path in renamed:
        path.unlink(missing_ok=True)


def remove_deleted_leftovers(partition_path: Path) -> int:
    """``.deleted`` files an interrupted local deletion left behind."""
    removed = 0
    for path in partition_path.glob(f"*{DELETED_SUFFIX}"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
