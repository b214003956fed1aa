"""A partition's leader-epoch lineage across its replicas, and what it makes of the remote tier
(Kafka's RemoteLogManager rules, for a tier that every replica's kts shares).

Every replica keeps a lineage (its leader-epoch-checkpoint: epoch → first offset). One leader writes
each epoch, and epochs only grow, so the record at an offset is fixed by the epoch it was written
in: two replicas agree wherever their lineages map the offset to the same epoch. After an unclean
election they disagree from the divergence point on, and the lineage whose newest epoch is higher —
the new leader's — is the partition's. From that:

* **Which lineage is current**: the store keeps the newest lineage any replica's kts saw
  (``metadata.lineage.current_lineage``, the store's own rule); a replica never replaces it with
  an older one.
* **Where copying starts**: Kafka's ``findHighestRemoteOffset`` over the replica's own lineage
  (:func:`copy_start_offset`), and a replica whose lineage is behind the current one copies
  only below its divergence point (:func:`diverges_at`).
* **What a reader reads**: each remote segment is readable only where its epochs agree with the
  current lineage; :func:`readable_spans` covers the offsets with as few segments as that allows,
  each offset served by exactly one of them. A segment no span uses is off the lineage or wholly
  covered by others: retention deletes it, and no byte of it counts towards ``retention.bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kts_resources.kafka.checkpoints import EpochEntry, epoch_for_offset


class LineageSegment(Protocol):
    """What the lineage rules ask of a remote segment (RemoteLogSegmentMetadata has it)."""

    start_offset: int
    end_offset: int
    segment_size_in_bytes: int
    segment_leader_epochs: Mapping[int, int]


def last_epoch(lineage: Sequence[EpochEntry]) -> int:
    return lineage[-1].epoch if lineage else -1


def diverges_at(own: Sequence[EpochEntry], current: Sequence[EpochEntry]) -> int | None:
    """The first offset (from ``own``'s first) where ``own`` maps to another epoch than
    ``current``, or None where they agree throughout. Both map offsets to epochs stepwise, so
    comparing at every step of either is enough."""
    if not own:
        return None
    floor = own[0].start_offset
    steps = sorted({e.start_offset for e in (*own, *current) if e.start_offset >= floor})
    for offset in steps:
        theirs = epoch_for_offset(current, offset)
        if theirs is not None and theirs != epoch_for_offset(own, offset):
            return offset
    return None


def copy_start_offset(lineage: Sequence[EpochEntry], log_end_offset: int,
                      highest_offset_for_epoch: Callable[[int], int | None]) -> int:
    """Where a replica with ``lineage`` starts copying: one past Kafka's findHighestRemoteOffset.
    From the newest epoch back, the first epoch with anything remote gives the highest remote
    offset, capped at the epoch's last offset in this lineage (another lineage may have carried the
    epoch further before it diverged); 0 when nothing of the lineage is remote."""
    for i in range(len(lineage) - 1, -1, -1):
        highest = highest_offset_for_epoch(lineage[i].epoch)
        if highest is None:
            continue
        epoch_end = lineage[i + 1].start_offset if i + 1 < len(lineage) else log_end_offset  # exclusive
        return min(highest, epoch_end - 1) + 1
    return 0


def epoch_ranges(segment: LineageSegment) -> list[tuple[int, int, int]]:
    """(epoch, first offset, last offset) of each epoch in ``segment``, ascending. The first epoch
    reaches down to the segment's start offset: offsets before its first batch (a segment whose
    file name is below its first batch's base offset) hold no record of any other epoch."""
    starts = sorted(segment.segment_leader_epochs.items(), key=lambda kv: kv[1])
    return [(epoch, segment.start_offset if i == 0 else start,
             (starts[i + 1][1] - 1) if i + 1 < len(starts) else segment.end_offset)
            for i, (epoch, start) in enumerate(starts)]


def on_lineage(segment: LineageSegment, lineage: Sequence[EpochEntry]) -> list[tuple[int, int]]:
    """The runs of ``segment``'s offsets (first, last) whose epoch is the lineage's epoch there:
    what it may serve. Each run is contiguous, so a read that starts in one may go on to its end.

    Below the lineage's first offset (a lineage truncated at a log start offset, or kept only from
    where a replica's checkpoint began) nothing contradicts a segment whose epoch there is not
    newer than the lineage's first: it is taken as it is. With no lineage at all (data without
    leader epochs) every segment is whole."""
    if not lineage:
        return [(segment.start_offset, segment.end_offset)]
    first_epoch, first_offset = lineage[0].epoch, lineage[0].start_offset
    bounds = {e.epoch: (e.start_offset, lineage[i + 1].start_offset - 1 if i + 1 < len(lineage) else None)
              for i, e in enumerate(lineage)}
    runs: list[tuple[int, int]] = []
    for epoch, first, last in epoch_ranges(segment):
        if epoch == first_epoch:
            lo, hi = None, bounds[epoch][1]
        elif epoch in bounds:
            lo, hi = bounds[epoch]
        elif epoch < first_epoch:
            lo, hi = None, first_offset - 1
        else:
            continue
        first = first if lo is None else max(first, lo)
        last = last if hi is None else min(last, hi)
        if first > last:
            continue
        if runs and runs[-1][1] + 1 == first:
            runs[-1] = (runs[-1][0], last)
        else:
            runs.append((first, last))
    return runs


@dataclass(frozen=True, slots=True)
class Span:
    """Offsets ``start_offset``..``end_offset`` (inclusive) of the lineage, served by ``segment``."""

    start_offset: int
    end_offset: int
    segment: Any  # a LineageSegment

    @property
    def size_bytes(self) -> int:
        """The span's share of its segment's bytes, by offsets (a segment's records are alike in
        size far more often than not; the exact split would need every batch's position)."""
        seg = self.segment
        offsets = seg.end_offset - seg.start_offset + 1
        return seg.segment_size_in_bytes * (self.end_offset - self.start_offset + 1) // max(1, offsets)


def readable_spans(segments: Iterable[LineageSegment], lineage: Sequence[EpochEntry],
                   log_start_offset: int = -1) -> list[Span]:
    """The lineage's offsets in the remote tier, ascending and disjoint, each span served by one
    segment: from each offset the segment reaching furthest on the lineage (the classic greedy
    interval cover: fewest segments, and each offset in exactly one span). Offsets below
    ``log_start_offset`` are not readable. Ties go to the earlier start, then the segment id, so
    every kts computes the same spans."""
    runs = sorted(((max(first, log_start_offset), last, seg) for seg in segments for first, last in on_lineage(seg, lineage)
                   if last >= log_start_offset),
                  key=lambda r: (r[0], -r[1], str(getattr(r[2], "segment_id", ""))))
    spans: list[Span] = []
    i, best = 0, None
    at = runs[0][0] if runs else 0
    while True:
        while i < len(runs) and runs[i][0] <= at:
            if best is None or runs[i][1] > best[1]:
                best = runs[i]
            i += 1
        if best is None or best[1] < at:
            if i >= len(runs):
                return spans
            at, best = runs[i][0], None  # a hole: nothing on the lineage holds ``at``
            continue
        if spans and spans[-1].segment is best[2] and spans[-1].end_offset + 1 == at:
            spans[-1] = Span(spans[-1].start_offset, best[1], best[2])
        else:
            spans.append(Span(at, best[1], best[2]))
        at = best[1] + 1


def span_index(spans: Sequence[Span], offset: int) -> int | None:
    """The index of the span holding ``offset``, or None."""
    import bisect

    i = bisect.bisect_right([s.start_offset for s in spans], offset) - 1
    return i if i >= 0 and spans[i].end_offset >= offset else None


def unused_segments(segments: Iterable[LineageSegment], spans: Sequence[Span],
                    lineage: Sequence[EpochEntry]) -> tuple[list[Any], list[Any]]:
    """(segments off the lineage, segments the lineage's spans cover without them)."""
    used = {id(s.segment) for s in spans}
    off, covered = [], []
    for seg in segments:
        if id(seg) in used:
            continue
        (covered if on_lineage(seg, lineage) else off).append(seg)
    return off, covered
