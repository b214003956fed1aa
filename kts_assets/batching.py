"""Few runs for many partitions: contiguous ranges of ``topic_partitions`` keys, one run per range.

Every copy run starts a Spark JVM, so a tick that finds work in 500 partitions must ask for a
handful of runs, not 500. Dagster runs one job over many partitions of a dynamic partitions
definition when the run carries the range tags ``dagster/asset_partition_range_start`` / ``_end``
and every selected asset has ``BackfillPolicy.single_run()``: it is the shape Dagster's own
backfill daemon and declarative automation build for single-run assets
(``_build_run_request_for_partition_key_range`` in
``dagster/_core/definitions/automation_tick_evaluation_context.py``), the run storage records such
a range over a ``DynamicPartitionsDefinition`` compactly (``KeyRangesPartitionsSubset`` in
``dagster/_core/instance/runs/run_domain.py``), and the assets see it as ``context.partition_keys``.

A range is contiguous in the definition's key order (the order partitions were added), so the
keys that need work are rarely adjacent. Rather than one run per contiguous stretch (what a
backfill would do), a range may span keys that need nothing: copying those is an idempotent no-op,
far cheaper than another JVM. ``max_partitions_per_run`` bounds the span, gaps included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import dagster as dg

# Dagster's run tags for a partition key range (dagster._core.storage.tags, spelled out here
# because that module is private; a test checks they still agree).
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"

# One Spark application per run; 200 partitions keep a run's inventory and copy in minutes.
MAX_PARTITIONS_PER_RUN = 200


@dataclass(frozen=True, slots=True)
class KeyRangeBatch:
    """One run's worth: the inclusive key range, and the keys in it that asked for work."""

    start: str
    end: str
    keys: tuple[str, ...]  # the wanted keys inside the range, in key order
    span: int  # how many partitions the range covers, wanted or not

    @property
    def key_range(self) -> dg.PartitionKeyRange:
        return dg.PartitionKeyRange(self.start, self.end)


def batch_key_ranges(
    ordered_keys: Sequence[str],
    wanted: Iterable[str],
    *,
    max_partitions_per_run: int = MAX_PARTITIONS_PER_RUN,
) -> list[KeyRangeBatch]:
    """The fewest ranges of ``ordered_keys`` that cover every ``wanted`` key, none spanning more
    than ``max_partitions_per_run`` keys. Wanted keys not in ``ordered_keys`` are ignored.

    Greedy from the lowest wanted position, each range as long as the cap allows: for covering
    points on a line with fixed-length intervals that is optimal.
    """
    if max_partitions_per_run < 1:
        raise ValueError(f"max_partitions_per_run must be at least 1, not {max_partitions_per_run}")
    wanted_set = set(wanted)
    positions = [i for i, key in enumerate(ordered_keys) if key in wanted_set]
    batches: list[KeyRangeBatch] = []
    i = 0
    while i < len(positions):
        first = positions[i]
        j = i
        while j + 1 < len(positions) and positions[j + 1] - first < max_partitions_per_run:
            j += 1
        last = positions[j]
        batches.append(KeyRangeBatch(
            start=ordered_keys[first],
            end=ordered_keys[last],
            keys=tuple(ordered_keys[p] for p in positions[i:j + 1]),
            span=last - first + 1,
        ))
        i = j + 1
    return batches


def range_run_request(batch: KeyRangeBatch, *, tags: Mapping[str, str] | None = None,
                      run_key: str | None = None, run_config: Mapping | None = None) -> dg.RunRequest:
    """A request for one run of the target job over ``batch``'s whole key range."""
    return dg.RunRequest(
        run_key=run_key,
        run_config=dict(run_config or {}),
        tags={
            **(tags or {}),
            PARTITION_RANGE_START_TAG: batch.start,
            PARTITION_RANGE_END_TAG: batch.end,
            "kts/partitions_requested": str(len(batch.keys)),
            "kts/partitions_in_range": str(batch.span),
        },
    )
