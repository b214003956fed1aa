"""One partition's two-tier view, gathered once per operation: what a read, ``kts status``, a
retention plan, DeleteRecords and a copy pass all start from.

It holds the inputs of the partition's log start offset (the broker's log-start-offset-checkpoint,
the local segments, the remote segments on the current leader-epoch lineage, the store's record)
and the offsets made from them by the rules in :mod:`kts_resources.tiering.tiers`, so every caller
answers the same: in particular the high watermark is clamped to the log end offset everywhere, as
a read clamps it (a replication-offset-checkpoint can run ahead of a truncated log).

Each input is read on first use and then kept: a copy pass never lists the remote segments it does
not need, and a partition's offsets are computed once however many callers ask. Plain paths and
the metadata store in, plain values out (no Dagster, no PySpark).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Iterator

from kts_resources.kafka.checkpoints import EpochEntry
from kts_resources.kafka.logdir import SegmentFiles
from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.metadata.lineage import current_lineage
from kts_resources.tiering.lineage import Span, readable_spans
from kts_resources.tiering.tiers import (
    FINISHED,
    LocatedPartition,
    PartitionTiers,
    active_log_end_offset,
    copy_lag_base_offsets,
    log_start_offset,
    segment_bytes,
    topic_id_partition,
)

if TYPE_CHECKING:
    from kts_resources.metadata.store import LostOffsetRange, PartitionLock, PartitionState, RemoteLogMetadataStore


class PartitionView:
    """A partition as of when each of its inputs was first read (see the module docstring).

    −1 stands for an unknown or absent offset, as in :class:`~kts_resources.tiering.tiers.PartitionTiers`.
    Build it with :func:`partition_view`.
    """

    def __init__(self, topic_partition: TopicPartition, located: LocatedPartition | None,
                 store: "RemoteLogMetadataStore | None", tip: TopicIdPartition | None,
                 segments: Sequence[SegmentFiles] | None, log_end_offset: int | None,
                 state: "PartitionState | None" = None, finished: Sequence[RemoteLogSegmentMetadata] | None = None,
                 lost_ranges: Sequence["LostOffsetRange"] | None = None, damaged_remote_segments: int | None = None) -> None:
        self.topic_partition = topic_partition
        self.located = located
        self.store = store
        self.tip = tip  # None: kts has never seen the topic (or there is no store), so nothing is remote
        if segments is not None:
            self.segments = list(segments)
        # The store's rows when the caller read them already (many partitions' in one query).
        if state is not None and tip is not None:
            self.state = state
        if finished is not None and tip is not None:
            self.finished = sorted(finished, key=lambda md: md.start_offset)
        if lost_ranges is not None and tip is not None:
            self.lost_ranges = tuple(lost_ranges)
        if damaged_remote_segments is not None and tip is not None:
            self.damaged_remote_segments = damaged_remote_segments
        self._known_log_end_offset = log_end_offset

    # --- the local tier: the broker's files ---

    @cached_property
    def segments(self) -> list[SegmentFiles]:
        """The local segments, ascending, the last one active: one listing for the whole operation."""
        return self.located.partition.segments() if self.located is not None else []

    @property
    def local_log_start_offset(self) -> int:
        """Lx: the first local segment's base offset."""
        return self.segments[0].base_offset if self.segments else -1

    @cached_property
    def checkpointed_log_start_offset(self) -> int | None:
        """The broker's log-start-offset-checkpoint entry (None: not checkpointed); it bounds the
        local log alone (:func:`tiers.log_start_offset`)."""
        return self.located.log_dir.log_start_offset(self.topic_partition) if self.located is not None else None

    @cached_property
    def checkpointed_high_watermark(self) -> int | None:
        """The replication-offset-checkpoint's entry as written (None: absent); see :attr:`high_watermark`."""
        return self.located.log_dir.high_watermark(self.topic_partition) if self.located is not None else None

    @cached_property
    def recovery_point(self) -> int | None:
        """The recovery-point-offset-checkpoint's entry (None: absent)."""
        return self.located.log_dir.recovery_point(self.topic_partition) if self.located is not None else None

    @cached_property
    def local_lineage(self) -> list[EpochEntry]:
        """This replica's leader-epoch-checkpoint (empty when it has none)."""
        return self.located.partition.leader_epochs() if self.located is not None else []

    # --- the remote tier: the store's rows ---

    @cached_property
    def state(self) -> "PartitionState | None":
        """The store's bookkeeping of the partition (None when nothing of it can be remote)."""
        return self.store.partition_state(self.tip) if self.store is not None and self.tip is not None else None

    @cached_property
    def finished(self) -> list[RemoteLogSegmentMetadata]:
        """The COPY_SEGMENT_FINISHED segments, by start offset."""
        if self.store is None or self.tip is None:
            return []
        return sorted(self.store.list_remote_log_segments(self.tip, states={FINISHED}), key=lambda md: md.start_offset)

    @cached_property
    def lost_ranges(self) -> tuple["LostOffsetRange", ...]:
        """The open lost ranges (offsets the broker deleted before kts copied them), by start offset."""
        return tuple(self.store.lost_ranges(self.tip)) if self.store is not None and self.tip is not None else ()

    @cached_property
    def damaged_remote_segments(self) -> int:
        """How many finished segments are recorded damaged in the tier."""
        return len(self.store.damaged_segments(self.tip)) if self.store is not None and self.tip is not None else 0

    @property
    def recorded_log_start_offset(self) -> int:
        """The log start offset kts recorded (its remote retention and DeleteRecords); −1: none."""
        return self.state.log_start_offset if self.state is not None else -1

    @property
    def highest_copied_offset(self) -> int:
        return self.state.highest_copied_offset if self.state is not None else -1

    @cached_property
    def lineage(self) -> list[EpochEntry]:
        """The partition's current leader-epoch lineage: the store's or this replica's, whichever
        is newer (:func:`lineage.current_lineage`)."""
        return current_lineage(self.state.lineage if self.state is not None else (), self.local_lineage)

    @cached_property
    def spans(self) -> list[Span]:
        """The remote tier as a reader sees it: the current lineage's offsets, each served by one
        finished segment (:func:`lineage.readable_spans`); a segment off the lineage, or covered
        by others, serves none."""
        return readable_spans(self.finished, self.lineage)

    @property
    def remote_log_start_offset(self) -> int:
        """Rx."""
        return self.spans[0].start_offset if self.spans else -1

    @property
    def remote_log_end_offset(self) -> int:
        """Ry."""
        return self.spans[-1].end_offset if self.spans else -1

    # --- the partition's offsets ---

    @cached_property
    def log_start_offset(self) -> int:
        """The partition's log start offset from every input (:func:`tiers.log_start_offset`)."""
        return log_start_offset(
            checkpointed=self.checkpointed_log_start_offset, local_log_start_offset=self.local_log_start_offset,
            remote_log_start_offset=self.remote_log_start_offset,
            # The store's record (DeleteRecords, remote retention) holds even with nothing remote left.
            recorded=self.recorded_log_start_offset)

    @cached_property
    def readable_spans(self) -> list[Span]:
        """:attr:`spans` from the log start offset on: what a read may serve."""
        return [span for span in self.spans if span.end_offset >= self.log_start_offset]

    @cached_property
    def log_end_offset(self) -> int:
        """Lz exactly (:func:`tiers.active_log_end_offset`, unless the caller knew it). A partition
        in no log dir ends where its readable remote offsets do."""
        if self.located is None:
            return (self.readable_spans[-1].end_offset if self.readable_spans else -1) + 1
        if self._known_log_end_offset is not None:
            return self._known_log_end_offset
        return active_log_end_offset(self.segments) if self.segments else -1

    @property
    def log_end_offset_bound(self) -> int:
        """Lz if the caller gave it, else the active segment's base offset: a lower bound that
        costs no read."""
        if self._known_log_end_offset is not None or self.located is None:
            return self.log_end_offset
        return self.segments[-1].base_offset if self.segments else -1

    @cached_property
    def high_watermark(self) -> int:
        """Ly, never past the log end offset (−1: not checkpointed). A partition in no log dir:
        its log end offset."""
        if self.located is None:
            return self.log_end_offset
        hw = self.checkpointed_high_watermark
        if hw is None:
            return -1
        if self.segments and hw <= self.segments[-1].base_offset:
            return hw  # the log ends at or after its active segment's base: no read needed to know
        return min(hw, self.log_end_offset)


def partition_view(
    located: LocatedPartition | None,
    store: "RemoteLogMetadataStore | None",
    *,
    topic_partition: TopicPartition | None = None,
    tip: TopicIdPartition | None = None,
    segments: Sequence[SegmentFiles] | None = None,
    log_end_offset: int | None = None,
    state: "PartitionState | None" = None,
    finished: Sequence[RemoteLogSegmentMetadata] | None = None,
    lost_ranges: Sequence["LostOffsetRange"] | None = None,
    damaged_remote_segments: int | None = None,
) -> PartitionView:
    """The view of the partition at ``located`` (None: in no log dir; then ``topic_partition`` or
    ``tip`` names it). ``tip``: its topic id if the caller has settled it (the copier registers
    one); otherwise partition.metadata's, else the one the store recorded for the topic's name.
    ``segments``, ``log_end_offset``: the caller's listing and exact Lz, if it has them;
    ``state``, ``finished``, ``lost_ranges``, ``damaged_remote_segments``: the store's rows of
    ``tip``, if the caller read them (with ``tip``)."""
    if located is not None:
        tp = located.partition.topic_partition
    elif tip is not None:
        tp = tip.topic_partition
    elif topic_partition is not None:
        tp = topic_partition
    else:
        raise ValueError("partition_view needs a located partition, a topic id partition or a topic partition")
    if tip is None and store is not None:
        if located is not None:
            tip = topic_id_partition(located.partition, store)
        else:
            topic_id = store.topic_id(tp.topic)
            tip = TopicIdPartition(topic_id, tp) if topic_id is not None else None
    return PartitionView(tp, located, store, tip, segments, log_end_offset, state, finished, lost_ranges,
                         damaged_remote_segments)


def tiers_of(view: PartitionView, *, exact_log_end_offset: bool = True) -> PartitionTiers:
    """The view as both tiers' offsets, bytes and segments (``kts status``'s row numbers).

    ``exact_log_end_offset=False``: Lz is :attr:`PartitionView.log_end_offset_bound` (the high
    watermark is still clamped to the exact Lz, read only when it lies past the active segment's
    base offset).

    Copy lag: the closed local segments not yet in the remote tier (base offset ≥ the highest
    copied offset, as UnifiedLog's onlyLocalLogSegmentsSize counts them) — eligible or not; the
    active segment never counts.
    """
    segments = view.segments
    spans = view.spans
    lagging = set(copy_lag_base_offsets([s.base_offset for s in segments], view.highest_copied_offset))
    lag = [s for s in segments if s.base_offset in lagging]
    return PartitionTiers(
        log_start_offset=view.log_start_offset,
        local_log_start_offset=view.local_log_start_offset,
        high_watermark=view.high_watermark,
        log_end_offset=view.log_end_offset if exact_log_end_offset else view.log_end_offset_bound,
        recovery_point=-1 if view.recovery_point is None else view.recovery_point,
        remote_log_start_offset=view.remote_log_start_offset,
        remote_log_end_offset=view.remote_log_end_offset,
        highest_copied_offset=view.highest_copied_offset,
        local_bytes=segment_bytes(segments),
        local_segments=len(segments),
        remote_bytes=sum(span.size_bytes for span in spans),
        remote_segments=len({id(span.segment) for span in spans}),
        copy_lag_bytes=segment_bytes(lag),
        copy_lag_segments=len(lag),
    )


def with_listing(view: PartitionView, segments: Sequence[SegmentFiles], log_end_offset: int | None) -> PartitionView:
    """``view`` with the caller's listing of the local segments and exact Lz, keeping the store
    rows it holds (read for many partitions at once: ``batch_plans.partition_views``)."""
    known = view.tip is not None
    read = view.__dict__  # what the view holds already (cached_property keeps it there); the rest stays unread
    return PartitionView(view.topic_partition, view.located, view.store, view.tip, segments, log_end_offset,
                         view.state if known else None, view.finished if known else None,
                         read.get("lost_ranges"), read.get("damaged_remote_segments"))


def partition_tiers(
    located: LocatedPartition,
    store: "RemoteLogMetadataStore | None" = None,
    *,
    segments: Sequence[SegmentFiles] | None = None,
    log_end_offset: int | None = None,
) -> PartitionTiers:
    """Both tiers of a located partition (the local one alone without a ``store``); ``segments``
    and ``log_end_offset`` as :func:`partition_view` takes them, Lz otherwise standing in as
    :func:`tiers_of` says with ``exact_log_end_offset=False``."""
    return tiers_of(partition_view(located, store, segments=segments, log_end_offset=log_end_offset),
                    exact_log_end_offset=False)


@dataclass
class LockedPartition:
    """A partition under the metadata store's partition lock, and its view read under it."""

    lock: "PartitionLock"
    view: PartitionView


@contextmanager
def locked_partition(store: "RemoteLogMetadataStore", tip: TopicIdPartition, located: LocatedPartition | None, *,
                     timeout_s: float | None, view: PartitionView | None = None) -> Iterator[LockedPartition]:
    """Hold the partition lock of ``tip`` (every writer of the partition's remote tier and log
    start offset takes it; PartitionLockTimeout after ``timeout_s``, None waits) with the
    partition's view: ``view`` if the caller read one to decide whether to go on at all (what it
    has not read yet is read under the lock), else a new one. What the holder decides from under
    the lock is then what no other kts writer changes meanwhile."""
    with store.partition_lock(tip, timeout_s=timeout_s) as lock:
        yield LockedPartition(lock, view if view is not None else partition_view(located, store, tip=tip))
