"""What the assets report beyond each partition's own metadata: who owns them, a run's totals, and
a partition's numbers (``partition_numbers``, which ``kts status`` prints) under the assets' metadata
names, again after any step changed them — in a run, or from a CLI command as runless events.

A ``MaterializeResult``'s metadata in a ranged (single-run backfill) step lands on every partition
of the range, so a run total written there would show on each partition's plot as if it were the
partition's own. Totals go to the run instead: one line of its log each step (``run totals:
name=value, …``), which ``run_totals`` reads back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import dagster as dg

from kts_assets.asset_keys import LOCAL_SEGMENTS, REMOTE_SEGMENTS, REMOTE_TIER, RETENTION_STATE
from kts_assets.sizes import human_bytes
from kts_resources.kafka.partition import TopicPartition
from kts_resources.tiering.partition_numbers import PartitionNumbers, partition_numbers
from kts_resources.tiering.partition_view import PartitionView, partition_view
from kts_resources.tiering.tiers import locate_partitions

OWNERS = ["team:kts"]
RUN_TOTALS_PREFIX = "run totals: "
# Both tiers' numbers on remote_segments (the copy's materialisation and every re-report; Lz is
# left out of the copy's, where it would cost a read of the active segment), under kts status's names.
TIER_METADATA = ("log_start_offset", "local_log_start_offset", "high_watermark", "remote_log_start_offset",
                 "remote_log_end_offset", "highest_copied_offset", "local_segments", "remote_segments",
                 "remote_bytes", "copy_lag_segments", "copy_lag_bytes", "damaged_remote_segments")
# The local log's on local_segments, under the names its inventory materialises them with
# (label → kts status's name; the eligible ones are what the copy rule takes now).
LOCAL_METADATA = {"segments": "local_segments", "local_bytes": "local_bytes", "log_start_offset": "log_start_offset",
                  "local_log_start_offset": "local_log_start_offset", "high_watermark": "high_watermark",
                  "log_end_offset": "log_end_offset", "eligible_segments": "eligible_segments",
                  "eligible_bytes": "eligible_bytes"}
# What retention_state says of a partition that changes without an expiry pass (DeleteRecords, …).
RETENTION_METADATA = ("log_start_offset", "delete_lag_segments", "delete_lag_bytes")


# Each asset's ``size``: the same numbers in words with their units, for the metadata list. Every
# report of the numbers carries it, so the words never stay behind the numbers they restate.
def remote_metadata(numbers: PartitionNumbers) -> dict[str, object]:
    """remote_segments' metadata of the partition's ``numbers``."""
    values = numbers.as_dict()
    return {"size": f"{human_bytes(numbers.tiers.remote_bytes)} remote, {human_bytes(numbers.tiers.copy_lag_bytes)} waiting to be copied",
            **{name: values[name] for name in TIER_METADATA}}


def local_metadata(numbers: PartitionNumbers) -> dict[str, object]:
    """local_segments' metadata of the partition's ``numbers`` (the inventory adds its scan's)."""
    values = numbers.as_dict()
    return {"size": f"{human_bytes(numbers.tiers.local_bytes)} local, {human_bytes(numbers.eligible_bytes)} eligible for the remote tier",
            **{label: values[name] for label, name in LOCAL_METADATA.items()}}


def partition_observations(view: PartitionView, *, changed_by: str, now_ms: int | None = None) -> list[dg.AssetObservation]:
    """The partition's numbers as ``kts status`` computes them (one function for both), as
    observations of remote_segments and local_segments, and with ``now_ms`` (its retention numbers
    changed too) of retention_state: a step that changed the partition without materialising those
    assets (DeleteRecords, recover, scrub, …) reports them again, so the UI never shows what is no
    longer true. A partition in no log dir (a deleted topic's) is reported as such."""
    numbers = partition_numbers(view, now_ms=now_ms)
    return numbers_observations(numbers, view.topic_partition.dir_name, in_log_dir=view.located is not None,
                                changed_by=changed_by, retention=now_ms is not None)


def numbers_observations(numbers: PartitionNumbers, key: str, *, in_log_dir: bool, changed_by: str,
                         retention: bool) -> list[dg.AssetObservation]:
    """:func:`partition_observations` of numbers already computed (``retention``: with the delete lag)."""
    gone = {} if in_log_dir else {"missing": True}
    observations = [
        dg.AssetObservation(asset_key=REMOTE_SEGMENTS, partition=key, metadata={**remote_metadata(numbers), "changed_by": changed_by}),
        dg.AssetObservation(asset_key=LOCAL_SEGMENTS, partition=key,
                            metadata={**local_metadata(numbers), **gone, "changed_by": changed_by})]
    if retention:
        observations.append(dg.AssetObservation(asset_key=RETENTION_STATE, partition=key,
                                                metadata={**retention_metadata(numbers), "changed_by": changed_by}))
    return observations


def retention_metadata(numbers: PartitionNumbers) -> dict[str, object]:
    """retention_state's numbers of a partition (its log start offset and delete lag, computed with ``now_ms``)."""
    values = numbers.as_dict()
    return {"size": f"{human_bytes(numbers.delete_lag_bytes or 0)} remote past retention, not yet deleted",
            **{name: values[name] for name in RETENTION_METADATA}}


def report_partitions(emit: Callable[[dg.AssetObservation], object], store, partitions: Iterable[TopicPartition], *,
                      log_dirs: Iterable[Path], owned_log_dirs: Iterable[Path] = (), changed_by: str,
                      now_ms: int | None = None) -> int:
    """Report ``partitions`` again (:func:`partition_observations`), each where it is in
    ``log_dirs`` or, in none, from the metadata store alone (one the store does not know either
    has nothing to report). ``emit``: the run's ``context.log_event``, or a Dagster instance's
    ``report_runless_asset_event`` for a change made outside any run (a CLI command). How many
    partitions were reported."""
    by_key = {tp.dir_name: tp for tp in partitions}
    located, missing = locate_partitions(log_dirs, sorted(by_key), owned_log_dirs=owned_log_dirs)
    views = [partition_view(loc, store) for loc in located.values()]
    views += [view for key in missing if (view := partition_view(None, store, topic_partition=by_key[key])).tip is not None]
    for view in views:
        for observation in partition_observations(view, changed_by=changed_by, now_ms=now_ms):
            emit(observation)
    return len(views)


def observe_tier(context: dg.AssetExecutionContext, store, metadata: Mapping[str, object]) -> None:
    """The run's part in the whole tier's story as an observation of ``remote_tier`` (the scrub's
    unpartitioned asset): one point per run on that asset's plots, over time, under keys that say
    their unit (``*_bytes``, ``*_ms``), beside a ``size`` text with units for the metadata list,
    and what the whole tier holds after the run (``tier_remote_bytes``, ``tier_remote_segments``)."""
    segments, size = store.tier_totals()
    context.log_event(dg.AssetObservation(asset_key=REMOTE_TIER, metadata={
        **metadata, "tier_remote_segments": segments, "tier_remote_bytes": size,
        "tier_size": f"{human_bytes(size)} in {segments:,} remote segment{'' if segments == 1 else 's'} in the whole tier"}))


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
