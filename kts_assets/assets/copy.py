"""``remote_segments``: the copy procedure (Kafka's RLMCopyTask) for the run's partitions, under
the shared write quota, with each partition's remote-tier state as metadata."""

import dagster as dg

from kts_assets.asset_keys import REMOTE_SEGMENTS, tier_kind
from kts_assets.assets.reporting import OWNERS, observe_tier, record_run_totals, remote_metadata
from kts_assets.dagster_internals import add_partition_metadata
from kts_assets.assets.segments import local_segments
from kts_assets.assets.steps import PartitionFailed, PartitionStep, for_each_partition
from kts_assets.partition_outcome import fail_if_no_partition_is_found
from kts_assets.sizes import counted, human_bytes
from kts_resources import settings
from kts_resources.tiering.copier import PartitionCopyResult, copy_partition
from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.tiering.leadership import broker_replicas
from kts_resources.resources import CopyQuotaResource, KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource
from kts_resources.tiering.tiers import (
    LocatedPartition,
    locate_partitions,
    log_dir_partitions,
    topic_id_disagreements,
)
from kts_resources.tiering.batch_plans import partition_views
from kts_resources.tiering.partition_numbers import PartitionNumbers, partition_numbers


# Bumped when what a copy writes (objects, metadata) changes meaning.
COPY_CODE_VERSION = "1"


# The spec (key, lineage) of the copy; assets.tiering.local_and_remote_segments materialises it.
remote_segments = dg.AssetSpec(
    REMOTE_SEGMENTS,
    deps=[local_segments],
    kinds={"kafka", tier_kind(), "postgres"},  # segments to the tier, their metadata to the store's PostgreSQL
    group_name="tiering",
    owners=OWNERS,
    code_version=COPY_CODE_VERSION,
    description=(
        "Eligible segments (closed, wholly below min(high watermark, recovery point)) copied to the "
        "remote tier with their indexes, snapshot and epoch lineage, COPY_SEGMENT_FINISHED in the "
        "metadata store. Rx = remote_log_start_offset, Ry = remote_log_end_offset."
    ),
)


COPY_STEP = PartitionStep(
    "the copy pass", failed_key="copy_failed", error_key="copy_error", asset_key=remote_segments.key,
    unexpected=lambda e: PartitionFailed(f"copy pass failed: {type(e).__name__}: {e}", str(e)))


def copy_metadata(result: PartitionCopyResult, numbers: PartitionNumbers) -> dict[str, object]:
    """A partition's remote_segments metadata: what its copy did, and both tiers after it."""
    metadata: dict[str, object] = {
        "copied_segments": len(result.copied),
        "copied_bytes": result.copied_bytes,
        "repaired_segments": len(result.repaired),
        "recopied_segments": len(result.recopied),  # replacements of damaged remote segments
        "manifests_backfilled": result.manifests_backfilled,  # for segments copied before manifests existed
        "throttle_time_ms": result.throttle_ms,
        "copy_failed": 1 if result.stopped else 0,
        **remote_metadata(numbers),
    }
    metadata["size"] = (f"{human_bytes(int(metadata['remote_bytes']))} remote, {human_bytes(result.copied_bytes)} "
                        f"copied by this run, {human_bytes(int(metadata['copy_lag_bytes']))} waiting to be copied")
    if result.stopped:
        metadata["copy_error"] = result.stopped
    if result.skipped:
        metadata["skipped"] = result.skipped
    return metadata


def copy_pass(
    context: dg.AssetExecutionContext,
    kafka_log_dirs: KafkaLogDirsResource,
    metadata_store: MetadataStoreResource,
    remote_tier: RemoteTierResource,
    copy_quota: CopyQuotaResource,
    parallel_partitions: int,
) -> set[str]:
    """The copy procedure over the run's partitions, each partition's outcome and both tiers as
    its metadata; dg.Failure when it failed for every one (the store or the bucket is down).
    Returns the partitions whose pass ended looking for lost ranges under their lock, as a pass
    does (the no_uncopied_segment_lost check need not look again right after)."""
    keys = list(context.partition_keys)
    located, missing = locate_partitions(kafka_log_dirs.paths(), keys, owned_log_dirs=kafka_log_dirs.owned_paths())
    fail_if_no_partition_is_found(keys, missing, kafka_log_dirs.paths())
    for key in missing:
        context.log.warning(f"{key}: in none of the log dirs; nothing copied")
    # A dir left from an earlier incarnation of its topic is not copied under either id.
    topics = {loc.partition.topic for loc in located.values()}
    disagreements = topic_id_disagreements(
        loc.partition for loc in log_dir_partitions(kafka_log_dirs.paths()) if loc.partition.topic in topics)
    for key, loc in list(located.items()):
        problem = disagreements.get(loc.partition.path)
        if problem is not None:
            # Not copied, and not a success either: an operator has to settle which id is the
            # topic's, so the partition's copy_completed check fails (and `kts sync` exits 1).
            context.log.warning(str(problem))
            add_partition_metadata(context, {"copy_failed": 1, "copy_error": str(problem), "skipped": str(problem)},
                                   asset_key=remote_segments.key, partition_key=key)
            del located[key]
    store = metadata_store.store()
    storage = remote_tier.storage()
    quota = copy_quota.manager(store.engine)  # one rate for the whole run, shared with other runs

    home = settings.kts_home()  # the remote log index cache: the copy hands it each segment's entries
    # Only the leader's kts copies (read from the broker's KRaft metadata log, once a run); without
    # one, every replica copies. An unreadable metadata log stops the run: nobody can say who leads.
    try:
        replicas = broker_replicas(kafka_log_dirs.paths(), settings.metadata_log_dir())
    except (KafkaFormatError, ValueError) as e:
        raise dg.Failure(f"who leads each partition is unknown: {e}; nothing was copied") from None

    def copy_one(_key: str, loc: LocatedPartition) -> PartitionCopyResult:
        return copy_partition(loc.partition, loc.log_dir, store, storage, quota=quota, index_cache_home=home,
                              broker_id=replicas.broker_id or 0,
                              not_leader=replicas.copy_refusal(loc.partition.topic_partition))

    copied_total = 0
    tier_totals = {"copied_bytes": 0, "throttle_time_ms": 0}  # the run's, for remote_tier's plots
    stopped: list[str] = []  # partitions whose pass a segment or an upload stopped (copy_completed fails them)

    looked: set[str] = set()

    def report(done: dict[str, tuple[LocatedPartition, PartitionCopyResult]]):
        nonlocal copied_total
        for key, (_loc, result) in done.items():
            if result.looked_for_lost_ranges:
                looked.add(key)
            if result.skipped:
                context.log.info(f"{key}: skipped: {result.skipped}")
            if result.stopped:
                stopped.append(key)
                context.log.error(f"{key}: copy stopped: {result.stopped}")
            for line in result.damaged_left:
                context.log.error(f"{key}: damaged remote segment: {line}")
            copied_total += len(result.copied)
            tier_totals["copied_bytes"] += result.copied_bytes
            tier_totals["throttle_time_ms"] += result.throttle_ms
        # Both tiers as `kts status` computes them (Lz's bound: the exact one costs a read), after
        # every copy: the store's rows of a chunk of partitions per query, not a few reads per partition.
        for key, view in partition_views({key: loc for key, (loc, _) in done.items()}, store, alarms=True):
            if isinstance(view, Exception):
                raise view  # an unreadable partition.metadata, as reading it here would have raised
            yield key, copy_metadata(done[key][1], partition_numbers(view, exact_log_end_offset=False))

    # Partitions copy side by side (each under its own partition lock); one partition's failure
    # (lock timeout, unreachable bucket, …) must not cost the others their copy.
    failed = for_each_partition(context, COPY_STEP, located, copy_one, report_together=report,
                                threads=max(1, parallel_partitions))
    failed_count = len(failed) + len(stopped)
    context.log.info(f"copied {counted(copied_total, 'segment')} over {counted(len(located), 'partition')} ({failed_count} failed)")
    # Run totals go on the run, not on every partition the run materialises; what the run did to the
    # tier goes on the tier's own plots.
    record_run_totals(context, {"partitions_in_run": len(keys), "partitions_failed": failed_count})
    observe_tier(context, store, {**tier_totals, "copied_segments": copied_total, "partitions": len(located),
                           "partitions_failed": failed_count,
                           "size": f"{human_bytes(tier_totals['copied_bytes'])} copied by this run over "
                                   f"{counted(len(located), 'partition')}, "
                                   f"{tier_totals['throttle_time_ms'] / 1000:,.1f} s waiting on the copy quota"})
    return looked
