"""A partition's numbers, computed in one place for everyone who shows them: ``kts status``'s row
and the metadata of the assets (the inventory's and the copy's materialisations, and the
observations a step that changed the partition reports), so the Dagster UI and ``kts status
--json`` say the same of a partition.

The numbers come from one :class:`~kts_resources.tiering.partition_view.PartitionView`: both tiers'
offsets, bytes, segments and copy lag (:func:`partition_view.tiers_of`), the segments the copy rule
allows, the open lost ranges, the damaged remote segments and, when asked for
(it needs the retention plan, which reads the topic's configs and every closed segment's largest
timestamp), the delete lag. Plain values out; neither Dagster nor PySpark is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kts_resources.tiering.expiry import plan_partition
from kts_resources.tiering.partition_view import PartitionView, tiers_of
from kts_resources.tiering.tiers import PartitionTiers, copy_candidates, segment_bytes

if TYPE_CHECKING:
    from kts_resources.metadata.store import LostOffsetRange


@dataclass(frozen=True)
class PartitionNumbers:
    """One partition's numbers (−1: an unknown or absent offset, as in PartitionTiers)."""

    tiers: PartitionTiers
    # Closed local segments the copy rule allows (wholly below min(high watermark, recovery point)),
    # from the log start offset on, copied or not: the copy lag counts those not copied yet.
    eligible_segments: int
    eligible_bytes: int
    lost_ranges: "tuple[LostOffsetRange, ...]"  # the open ones
    damaged_remote_segments: int  # found damaged in the tier and not yet re-copied (copier.recopy_damaged)
    # Kafka's RemoteDeleteLagSegments / RemoteDeleteLagBytes: remote segments past retention now
    # and not yet deleted (None: not asked for).
    delete_lag_segments: int | None = None
    delete_lag_bytes: int | None = None

    def as_dict(self) -> dict[str, object]:
        """Every number by its name (lost ranges as [start, end] pairs; the delete lag only when known)."""
        numbers: dict[str, object] = {
            **dataclasses.asdict(self.tiers), "eligible_segments": self.eligible_segments,
            "eligible_bytes": self.eligible_bytes, "lost_ranges": [[r.start_offset, r.end_offset] for r in self.lost_ranges],
            "damaged_remote_segments": self.damaged_remote_segments}
        if self.delete_lag_segments is not None:
            numbers.update(delete_lag_segments=self.delete_lag_segments, delete_lag_bytes=self.delete_lag_bytes)
        return numbers


def partition_numbers(view: PartitionView, *, exact_log_end_offset: bool = True, now_ms: int | None = None) -> PartitionNumbers:
    """The numbers of the partition ``view`` shows. ``exact_log_end_offset``: as :func:`tiers_of`
    takes it. ``now_ms``: the delete lag too, from the partition's retention plan at that time."""
    tiers = tiers_of(view, exact_log_end_offset=exact_log_end_offset)
    eligible = copy_candidates(view.segments, high_watermark=tiers.high_watermark, recovery_point=tiers.recovery_point,
                               log_start_offset=tiers.log_start_offset, highest_copied_offset=-1)
    known = view.store is not None and view.tip is not None
    lag_segments = lag_bytes = None
    if now_ms is not None:
        lag_segments = lag_bytes = 0
        if known and view.finished:
            remote = plan_partition(view.located, view.tip, view.store, now_ms=now_ms, view=view).remote
            lag_segments, lag_bytes = len(remote.expired), remote.bytes
    return PartitionNumbers(
        tiers=tiers,
        eligible_segments=len(eligible),
        eligible_bytes=segment_bytes(eligible),
        lost_ranges=view.lost_ranges,
        damaged_remote_segments=view.damaged_remote_segments,
        delete_lag_segments=lag_segments,
        delete_lag_bytes=lag_bytes,
    )
