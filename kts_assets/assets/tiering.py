"""``local_segments`` and ``remote_segments`` in one step: the Spark inventory scans while the
copy uploads.

The copy does not read the inventory (it picks and verifies its segments itself), so the two need
not wait for each other: the scan runs on Spark's workers, the copy in this process, mostly waiting
on writes. As two steps, a 1 GiB sync spent the inventory's ~1.5 s before the copy's first byte
(bench/sync_bench.py); side by side, the scan is done before the copy. Each asset is still its own
materialisation, selectable alone (the index rebuild job takes the inventory only), with
``local_segments → remote_segments`` as its lineage. Their checks (kts_assets.checks,
SEGMENTS_CHECK_SPECS) are judged here once both are reported, and can be run alone.
"""

from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from kts_assets.assets.copy import copy_pass, remote_segments
from kts_assets.assets.segments import discard_staging, local_segments, prepare_inventory, report_inventory, scan_inventory
from kts_assets.assets.steps import PIPELINE_STEP, end_step
from kts_assets.checks import SEGMENTS_CHECK_SPECS, checks_that_must_run, segments_checks
from kts_assets.run_hygiene import record_run_worker
from kts_resources.tiering.copier import PARALLEL_PARTITIONS
from kts_resources.resources import (
    CopyQuotaResource,
    KafkaLogDirsResource,
    KtsPySparkResource,
    MetadataStoreResource,
    RemoteTierResource,
)


class SegmentsConfig(dg.Config):
    """Run config of ``local_and_remote_segments`` (sensor and schedule runs take the defaults)."""

    # local_segments: closed segments unchanged (size, modification time) since the last inventory
    # keep their row; True rescans them too: a scrub for bit rot, which leaves both as they were.
    rescan_unchanged: bool = False
    # local_segments: True (index_rebuild_job) first rebuilds, in owned log dirs, the .index /
    # .timeindex of closed segments whose files are missing or torn (kts_resources.maintenance.local_indexes),
    # by Kafka's recovery rule — before any copy starts, since a copy ships them.
    rebuild_indexes: bool = False
    # remote_segments: partitions copied at once in one run; the write quota is shared.
    parallel_partitions: int = PARALLEL_PARTITIONS


@dg.multi_asset(
    name="local_and_remote_segments",
    specs=[local_segments, remote_segments],
    check_specs=SEGMENTS_CHECK_SPECS,
    **PIPELINE_STEP,  # one run per partition range, subsettable, in the spark pool, retried (assets/steps.py)
    description="Scan the partitions' local segments with Spark (local_segments) while the eligible ones are "
                "copied to the remote tier (remote_segments), then check both.",
)
def local_and_remote_segments(
    context: dg.AssetExecutionContext,
    pyspark: KtsPySparkResource,
    kafka_log_dirs: KafkaLogDirsResource,
    metadata_store: MetadataStoreResource,
    remote_tier: RemoteTierResource,
    copy_quota: CopyQuotaResource,
    config: SegmentsConfig,
):
    record_run_worker(context)  # so a dead worker's run is failed and its slots freed
    selected = context.selected_asset_keys
    plan = scan = None
    failure: BaseException | None = None
    looked_for_lost_ranges: set[str] = set()  # partitions whose copy pass just looked, under their lock
    # Dagster's context is used in this thread only: the scan thread touches Spark and files.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kts-inventory") as background:
        if local_segments.key in selected:
            plan = prepare_inventory(context, pyspark, kafka_log_dirs, config.rescan_unchanged, config.rebuild_indexes)
            # A scrub's rescan is the bigger job: it keeps every core.
            beside_copy = remote_segments.key in selected and not config.rescan_unchanged
            scan = background.submit(scan_inventory, pyspark, plan, beside_copy=beside_copy)
        if remote_segments.key in selected:
            try:
                looked_for_lost_ranges = copy_pass(context, kafka_log_dirs, metadata_store, remote_tier, copy_quota,
                                                   config.parallel_partitions)
            except Exception as e:  # noqa: BLE001 - raised below, once the inventory is reported
                failure = e
        if scan is not None:
            try:
                inventory = scan.result()  # a lost Spark server is already a dg.Failure saying so
            except Exception:
                discard_staging(plan)
                if failure is None and remote_segments.key in selected:
                    yield dg.MaterializeResult(asset_key=remote_segments.key)  # the copy did its part
                elif failure is not None:  # the step fails with the inventory's error: say the copy's too
                    context.log.error(f"the copy failed as well: {type(failure).__name__}: {failure}")
                raise
            report_inventory(context, plan, inventory, metadata_store)
            yield dg.MaterializeResult(asset_key=local_segments.key)
    if failure is not None:
        raise failure
    if remote_segments.key in selected:
        yield dg.MaterializeResult(asset_key=remote_segments.key)
    yield from checks_that_must_run(segments_checks(context, kafka_log_dirs, metadata_store, remote_tier,
                                                    looked_for_lost_ranges=looked_for_lost_ranges),
                                    "local_segments and remote_segments")
    end_step(context)  # the run's last step fails it for the partitions that failed in it
