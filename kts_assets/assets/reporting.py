"""What the assets report beyond each partition's own metadata: who owns them, a run's totals, and
a partition's tiers again after a step changed them.

A ``MaterializeResult``'s metadata in a ranged (single-run backfill) step lands on every partition
of the range, so a run total written there would show on each partition's plot as if it were the
partition's own. Totals go to the run instead: one line of its log each step (``run totals:
name=value, …``), which ``run_totals`` reads back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import dagster as dg

from kts_assets.asset_keys import LOCAL_SEGMENTS, REMOTE_SEGMENTS, REMOTE_TIER
from kts_resources.tiering.partition_view import partition_tiers
from kts_resources.tiering.tiers import LocatedPartition, active_log_end_offset

OWNERS = ["team:kts"]
RUN_TOTALS_PREFIX = "run totals: "
# Both tiers' numbers on remote_segments (the copy's materialisation and every re-report; Lz is
# left out of the copy's, where it would cost a read of the active segment).
TIER_METADATA = ("log_start_offset", "local_log_start_offset", "high_watermark", "remote_log_start_offset",
                 "remote_log_end_offset", "highest_copied_offset", "local_segments", "remote_segments",
                 "remote_bytes", "copy_lag_segments", "copy_lag_bytes")
# The local log's on local_segments, under the names its inventory materialises them with.
_LOCAL_METADATA = {"segments": "local_segments", "local_bytes": "local_bytes", "log_start_offset": "log_start_offset",
                   "local_log_start_offset": "local_log_start_offset", "high_watermark": "high_watermark",
                   "log_end_offset": "log_end_offset"}


def tier_observations(loc: LocatedPartition, store, *, changed_by: str) -> list[dg.AssetObservation]:
    """The partition's numbers as ``kts status`` computes them, as observations of local_segments
    and remote_segments: a step that changed the partition without materialising those assets
    (expiry, DeleteRecords, …) reports them again, so the UI never shows what is no longer true."""
    segments = loc.partition.segments()
    numbers = dataclasses.asdict(partition_tiers(loc, store, segments=segments, log_end_offset=active_log_end_offset(segments)))
    remote = {name: numbers[name] for name in TIER_METADATA}
    local = {label: numbers[name] for label, name in _LOCAL_METADATA.items()}
    return [dg.AssetObservation(asset_key=REMOTE_SEGMENTS, partition=loc.key, metadata={**remote, "changed_by": changed_by}),
            dg.AssetObservation(asset_key=LOCAL_SEGMENTS, partition=loc.key, metadata={**local, "changed_by": changed_by})]


def observe_tier(context: dg.AssetExecutionContext, metadata: Mapping[str, object]) -> None:
    """The run's part in the whole tier's story as an observation of ``remote_tier`` (the scrub's
    unpartitioned asset): one point per run on that asset's plots, over time, under keys that say
    their unit (``*_bytes``, ``*_ms``), beside a ``size`` text with units for the metadata list."""
    context.log_event(dg.AssetObservation(asset_key=REMOTE_TIER, metadata=dict(metadata)))


def record_run_totals(context: dg.AssetExecutionContext, totals: Mapping[str, int]) -> None:
    """``totals`` as one line of the run's log, ``run totals: name=value, …`` (``run_totals`` reads
    them back). Not run tags: a run's tags are what its runs-list row shows, and a dozen counters
    there left room for three runs a screen."""
    context.log.info(RUN_TOTALS_PREFIX + ", ".join(f"{name}={value}" for name, value in totals.items()))


def run_totals(instance: dg.DagsterInstance, run_id: str) -> dict[str, int]:
    """Every step's ``record_run_totals`` of the run, merged (a name two steps both say, such as
    partitions_in_run, has one value)."""
    totals: dict[str, int] = {}
    for entry in instance.all_logs(run_id):
        if entry.is_dagster_event or not entry.user_message.startswith(RUN_TOTALS_PREFIX):
            continue
        for item in entry.user_message[len(RUN_TOTALS_PREFIX):].split(", "):
            name, _, value = item.partition("=")
            totals[name] = int(value)
    return totals
