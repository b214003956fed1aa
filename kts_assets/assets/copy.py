"""``remote_segments``: the copy procedure (Kafka's RLMCopyTask) for the run's partitions, under
the shared write quota, with each partition's remote-tier state as metadata."""

from concurrent.futures import ThreadPoolExecutor, as_completed

import dagster as dg

from kts_assets.assets.segments import (
    LocatedPartition,
    local_offsets,
    local_segments,
    locate_partitions,
    segment_bytes,
)
from kts_assets.partition_outcome import fail_if_no_partition_is_found
from kts_assets.partitions import topic_partitions
from kts_resources.copier import PARALLEL_PARTITIONS, PartitionCopyResult, copy_partition
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from kts_resources.resources import CopyQuotaResource, KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


class RemoteSegmentsConfig(dg.Config):
    """Run config of ``remote_segments`` (sensor and schedule runs take the defaults)."""

    parallel_partitions: int = PARALLEL_PARTITIONS  # partitions copied at once in one run; the write quota is shared


def topic_id_partition(located: LocatedPartition, store: RemoteLogMetadataStore) -> TopicIdPartition | None:
    """The partition under its topic id (partition.metadata, else the id kts recorded); None when
    kts has never seen the topic, so nothing of it can be remote."""
    metadata = located.partition.metadata()
    topic_id = metadata.topic_id if metadata is not None else store.topic_id(located.partition.topic)
    return None if topic_id is None else TopicIdPartition(topic_id, located.partition.topic_partition)


def finished_segments(located: LocatedPartition, store: RemoteLogMetadataStore) -> tuple[TopicIdPartition | None, list[RemoteLogSegmentMetadata]]:
    tip = topic_id_partition(located, store)
    return tip, ([] if tip is None else store.list_remote_log_segments(tip, states={FINISHED}))


def tier_state(located: LocatedPartition, store: RemoteLogMetadataStore) -> dict[str, int]:
    """Offsets, bytes and segments per tier, and the copy lag as Kafka's RemoteCopyLagBytes /
    RemoteCopyLagSegments (KAFKA_FORMATS.md §7): the closed local segments not yet in the remote
    tier (base offset ≥ the highest offset in remote storage, as UnifiedLog's
    onlyLocalLogSegmentsSize counts them) — eligible or not; the active segment never counts."""
    tip, finished = finished_segments(located, store)
    segments = located.partition.segments()
    offsets = local_offsets(located, segments, None)
    partition = store.partition_state(tip) if tip is not None else None
    highest_copied = partition.highest_copied_offset if partition is not None else -1
    lag = [s for s in segments if not s.active and s.base_offset >= highest_copied]
    remote_start = min((md.start_offset for md in finished), default=-1)
    local_start = offsets.local_log_start_offset
    # The partition's log starts at its oldest data in either tier, but never below what the broker
    # checkpointed (DeleteRecords, the broker's own retention) or remote retention recorded.
    oldest = min(remote_start, local_start) if remote_start >= 0 and local_start >= 0 else max(remote_start, local_start)
    checkpointed = offsets.checkpointed_log_start_offset
    log_start = max(oldest, -1 if checkpointed is None else checkpointed,
                    partition.log_start_offset if partition is not None and finished else -1)
    return {
        "log_start_offset": log_start,
        "remote_segments": len(finished),
        "remote_bytes": sum(md.segment_size_in_bytes for md in finished),
        "remote_log_start_offset": remote_start,
        "remote_log_end_offset": max((md.end_offset for md in finished), default=-1),
        "highest_copied_offset": highest_copied,
        "copy_lag_segments": len(lag),
        "copy_lag_bytes": segment_bytes(lag),
        "local_segments": len(segments),
        "local_log_start_offset": local_start,
        "high_watermark": offsets.high_watermark,
    }


@dg.asset(
    partitions_def=topic_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[local_segments],
    retry_policy=dg.RetryPolicy(max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL),
    kinds={"kafka", "s3"},
    group_name="tiering",
    description=(
        "Eligible segments (closed, wholly below min(high watermark, recovery point)) copied to the "
        "remote tier with their indexes, snapshot and epoch lineage, COPY_SEGMENT_FINISHED in the "
        "metadata store. Rx = remote_log_start_offset, Ry = remote_log_end_offset."
    ),
)
def remote_segments(
    context: dg.AssetExecutionContext,
    kafka_log_dirs: KafkaLogDirsResource,
    metadata_store: MetadataStoreResource,
    remote_tier: RemoteTierResource,
    copy_quota: CopyQuotaResource,
    config: RemoteSegmentsConfig,
) -> dg.MaterializeResult:
    keys = list(context.partition_keys)
    located, missing = locate_partitions(kafka_log_dirs, keys)
    fail_if_no_partition_is_found(keys, missing, kafka_log_dirs.log_dirs)
    for key in missing:
        context.log.warning(f"{key}: in none of the log dirs; nothing copied")
    store = metadata_store.store()
    storage = remote_tier.storage()
    quota = copy_quota.manager(store.engine)  # one rate for the whole run, shared with other runs

    def copy_one(loc: LocatedPartition) -> PartitionCopyResult:
        return copy_partition(loc.partition, loc.log_dir, store, storage, quota=quota)

    failed: list[str] = []
    copied_total = 0
    # Partitions copy side by side (each under its own partition lock); metadata is added here, in
    # the step's own thread, as results come in.
    with ThreadPoolExecutor(max_workers=max(1, config.parallel_partitions), thread_name_prefix="kts-copy") as pool:
        futures = {pool.submit(copy_one, loc): (key, loc) for key, loc in located.items()}
        for future in as_completed(futures):
            key, loc = futures[future]
            # One partition's failure (lock timeout, unreachable bucket, …) must not cost the others their copy.
            try:
                result = future.result()
            except Exception as e:  # noqa: BLE001
                failed.append(key)
                context.log.error(f"{key}: copy pass failed: {type(e).__name__}: {e}")
                context.add_asset_metadata({"copy_failed": 1, "copy_error": str(e)}, partition_key=key)
                continue
            if result.skipped:
                context.log.info(f"{key}: skipped: {result.skipped}")
            if result.stopped:
                context.log.error(f"{key}: copy stopped: {result.stopped}")
            copied_total += len(result.copied)
            metadata: dict[str, object] = {
                "copied_segments": len(result.copied),
                "copied_bytes": result.copied_bytes,
                "repaired_segments": len(result.repaired),
                "throttle_time_ms": result.throttle_ms,
                "copy_failed": 1 if result.stopped else 0,
                **tier_state(loc, store),
            }
            if result.stopped:
                metadata["copy_error"] = result.stopped
            if result.skipped:
                metadata["skipped"] = result.skipped
            context.add_asset_metadata(metadata, partition_key=key)
    if located and len(failed) == len(located):
        # Nothing worked (the store or the bucket is down): fail, so the RetryPolicy tries again.
        raise dg.Failure(f"the copy pass failed for every partition of the run: {', '.join(failed[:20])}")
    context.log.info(f"copied {copied_total} segments over {len(located)} partitions ({len(failed)} failed)")
    return dg.MaterializeResult(metadata={"partitions_in_run": len(keys), "partitions_failed": len(failed)})
