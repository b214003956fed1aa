"""``retention_state``: what retention takes from each partition, and taking it.

Spark plans every partition of the run (``kts_resources.spark.retention_job``: the rules of
``kts_resources.tiering.retention`` over the store's finished segments and the local segments; a run of
fewer than ``spark_plan_min_partitions`` is planned on the driver, where a Spark job's fixed cost
would be most of the step); the driver then carries out the plans with something to expire
(``kts_resources.tiering.expiry.expire_partition``: log start offset recorded first, remote segments
through the delete states, local segments in owned log dirs). In broker-owned log dirs the local part is reported only.
"""

from dataclasses import dataclass

import dagster as dg
from pydantic import Field

from kts_assets.asset_keys import RETENTION_STATE, tier_kind
from kts_assets.assets.copy import remote_segments
from kts_assets.assets.reporting import OWNERS, numbers_observations, observe_tier, record_run_totals, retention_metadata
from kts_assets.assets.steps import PIPELINE_STEP, PartitionFailed, PartitionStep, end_step, for_each_partition
from kts_assets.checks import RETENTION_CHECK_SPECS, checks_that_must_run, retention_checks
from kts_assets.partition_outcome import fail_if_no_partition_is_found, one_line
from kts_assets.run_hygiene import record_run_worker
from kts_assets.sizes import human_bytes
from kts_resources import settings
from kts_resources.tiering.expiry import ExpiryResult, PartitionRetention, expire_partition
from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.tiering.leadership import broker_replicas
from kts_resources.tiering.partition_numbers import PartitionNumbers, partition_numbers
from kts_resources.tiering.partition_view import partition_view
from kts_resources.tiering.partition_admin import RemoteDataDeletion, delete_on_disable_applies, delete_partition_remote_data
from kts_resources.tiering.quotas import SystemClock
from kts_resources.resources import KafkaLogDirsResource, KtsPySparkResource, MetadataStoreResource, RemoteTierResource
from kts_resources.spark.retention_job import SPARK_PLAN_MIN_PARTITIONS, PlanOutcome, plan_partitions
from kts_resources.tiering.tiers import locate_partitions, topic_id_partition

RETENTION_CODE_VERSION = "1"
RETENTION_STEP = PartitionStep("retention", failed_key="retention_failed", error_key="retention_error")


class RetentionStateConfig(dg.Config):
    """Run config of ``retention_state`` (sensor and schedule runs take the defaults)."""

    dry_run: bool = False  # True: plan and report, delete nothing
    spark_plan_min_partitions: int = Field(
        default=SPARK_PLAN_MIN_PARTITIONS, ge=0,
        description="From this many partitions in a run the plans are one Spark job; fewer are planned on the driver.")


@dg.multi_asset(
    name="retention_state",
    specs=[dg.AssetSpec(
        RETENTION_STATE,
        deps=[remote_segments],
        kinds={"spark", tier_kind(), "postgres"},
        group_name="retention",
        owners=OWNERS,
        code_version=RETENTION_CODE_VERSION,
        description=(
            "What retention takes from each partition, in Kafka's order — remote: retention.bytes over local-only plus "
            "remote bytes, retention.ms on each segment's largest timestamp (KIP-33), the log start offset, segments "
            "left behind an unclean election; local: local.retention.* for segments already remote — and taking it: "
            "the log start offset recorded first, remote segments through DELETE_SEGMENT_STARTED → FINISHED, "
            "owned log dirs' local segments removed (broker-owned ones only reported)."
        ),
    )],
    check_specs=RETENTION_CHECK_SPECS,  # judged here once the asset is reported; can run alone
    **PIPELINE_STEP,  # one run per partition range, subsettable, in the spark pool, retried (assets/steps.py)
)
def retention_state(
    context: dg.AssetExecutionContext,
    pyspark: KtsPySparkResource,
    kafka_log_dirs: KafkaLogDirsResource,
    metadata_store: MetadataStoreResource,
    remote_tier: RemoteTierResource,
    config: RetentionStateConfig,
):
    record_run_worker(context)
    checks = checks_that_must_run(retention_checks(context, kafka_log_dirs), "retention_state")
    if RETENTION_STATE not in context.selected_asset_keys:  # its check, run alone
        yield from checks
        end_step(context)
        return
    keys = list(context.partition_keys)
    log_dirs, owned = kafka_log_dirs.paths(), kafka_log_dirs.owned_paths()
    located, missing = locate_partitions(log_dirs, keys, owned_log_dirs=owned)
    fail_if_no_partition_is_found(keys, missing, log_dirs)
    clock = SystemClock()
    store = metadata_store.store()
    with pyspark.server_loss_as_failure():
        plans = plan_partitions(lambda: pyspark.spark_session, store, keys, log_dirs=[str(p) for p in log_dirs],
                                owned_log_dirs=[str(p) for p in owned], database_url=metadata_store.url(),
                                now_ms=clock.now_ms(), spark_min_partitions=config.spark_plan_min_partitions)
    storage = remote_tier.storage()
    # The remote tier's retention is the leader's kts's (Kafka runs it on the leader only); without
    # a metadata log every replica's kts runs it. An unreadable metadata log stops the run.
    try:
        replicas = broker_replicas(log_dirs, settings.metadata_log_dir())
    except (KafkaFormatError, ValueError) as e:
        raise dg.Failure(f"who leads each partition is unknown: {e}; nothing was expired") from None
    totals = {"remote_segments_deleted": 0, "remote_bytes_deleted": 0, "local_segments_deleted": 0}
    changed_by = f"retention_state run {context.run.run_id}"  # on the partitions it reports again
    topic_configs = store.all_topic_configs()  # once for the run's partitions: the step changes none

    def take(key: str, outcome: PlanOutcome) -> _Taken:
        if outcome.error is not None:
            raise PartitionFailed(f"retention not planned: {outcome.error}", one_line(outcome.error))
        loc = located.get(key)
        tip = topic_id_partition(loc.partition, store) if loc is not None else None
        if tip is not None and not config.dry_run and delete_on_disable_applies(store, tip.topic, topic_configs=topic_configs):
            # remote.storage.enable=false with remote.log.delete.on.disable=true: the remote data goes.
            try:
                return _Taken(deleted_on_disable=delete_partition_remote_data(tip, store, storage, clock=clock,
                                                                              home=settings.kts_home()))
            except Exception as e:  # noqa: BLE001 - one partition's failure is its own
                raise PartitionFailed(f"deleting the remote data on disable failed: {e}", one_line(str(e))) from e
        plan = outcome.plan
        if plan is None or not plan.has_work or config.dry_run:
            return _Taken()
        try:
            if tip is None:
                raise RuntimeError("the partition's topic id is no longer known")
            leads = replicas.copy_refusal(loc.partition.topic_partition) is None
            return _Taken(expired=expire_partition(plan, loc, store, storage, clock=clock, remote=leads), leads=leads)
        except Exception as e:  # noqa: BLE001 - one partition's failure is its own
            raise PartitionFailed(f"expiry failed: {e}", one_line(str(e)), _planned(plan)) from e

    def numbers_now(key: str) -> PartitionNumbers:
        """The partition's numbers after what the pass took (the delete lag: what is past retention
        still), reported again on local_segments and remote_segments, as `kts status` shows them."""
        loc = located.get(key)
        numbers = partition_numbers(partition_view(loc, store), now_ms=clock.now_ms())
        for observation in numbers_observations(numbers, key, in_log_dir=loc is not None, changed_by=changed_by, retention=False):
            context.log_event(observation)
        return numbers

    def report(key: str, outcome: PlanOutcome, taken: _Taken) -> dict[str, object]:
        loc = located.get(key)
        if taken.deleted_on_disable is not None:
            totals["remote_segments_deleted"] += taken.deleted_on_disable.segments_deleted
            return {"retention_failed": 0, "remote_segments_deleted": taken.deleted_on_disable.segments_deleted,
                    **retention_metadata(numbers_now(key)),
                    "note": "tiering disabled with remote.log.delete.on.disable: remote data deleted"}
        plan = outcome.plan
        if plan is None:  # nothing remote
            return {"retention_failed": 0, "remote_segments_to_expire": 0, "local_segments_to_expire": 0,
                    "note": "nothing copied yet"}
        metadata = _planned(plan)
        result = taken.expired
        if result is not None:
            if not taken.leads:
                metadata["note"] = f"{replicas.role(loc.partition.topic_partition)}: the leader's kts expires the remote tier"
            metadata.update({"remote_segments_deleted": len(result.remote_deleted), "remote_bytes_deleted": result.remote_bytes_deleted,
                             "local_segments_deleted": len(result.local_deleted), "local_bytes_deleted": result.local_bytes_deleted})
            for line in result.local_kept:
                context.log.warning(f"{key}: {line}")
            totals["remote_segments_deleted"] += len(result.remote_deleted)
            totals["remote_bytes_deleted"] += result.remote_bytes_deleted
            totals["local_segments_deleted"] += len(result.local_deleted)
            # The log start offset and the delete lag (Kafka's RemoteDeleteLag*: what is past
            # retention and still remote) as they are now, the same numbers as the observations'.
            metadata.update(retention_metadata(numbers_now(key)))
        metadata["size"] = (f"{human_bytes(int(metadata['remote_bytes_to_expire']))} remote and "
                            f"{human_bytes(int(metadata['local_bytes_to_expire']))} local past retention; "
                            f"{human_bytes(int(metadata['remote_bytes_deleted']) + int(metadata['local_bytes_deleted']))} deleted")
        if not plan.owned and plan.local.expired:
            metadata["broker_may_delete"] = ", ".join(f"{e.start_offset}..{e.end_offset}" for e in plan.local.expired[:20])
        return metadata

    work = {key: plans.get(key, PlanOutcome(error="no plan came back")) for key in keys}
    failed = for_each_partition(context, RETENTION_STEP, work, take, report)
    context.log.info(f"retention: {totals['remote_segments_deleted']} remote and {totals['local_segments_deleted']} local "
                     f"segments deleted over {len(keys)} partitions ({len(failed)} failed)")
    record_run_totals(context, {"partitions_in_run": len(keys), "retention_partitions_failed": len(failed), **totals})
    if totals["remote_segments_deleted"]:  # a point on the tier's plots where it shrank
        observe_tier(context, store, {"remote_segments_deleted": totals["remote_segments_deleted"],
                                      "remote_bytes_deleted": totals["remote_bytes_deleted"],
                                      "size": f"{human_bytes(totals['remote_bytes_deleted'])} deleted from the tier by this run"})
    yield dg.MaterializeResult(asset_key=RETENTION_STATE)
    yield from checks  # judged once the pass is reported
    end_step(context)  # the run's last step fails it for the partitions that failed in it


@dataclass(frozen=True)
class _Taken:
    """What the pass took from one partition: its remote data on disable, or its plan's expiry
    (None: nothing was due, or a dry run)."""

    deleted_on_disable: RemoteDataDeletion | None = None
    expired: ExpiryResult | None = None
    leads: bool = True  # False: a follower's kts, which expired only the local part


def _planned(plan: PartitionRetention) -> dict[str, object]:
    """The plan's numbers as the partition's metadata, nothing deleted yet."""
    return {**plan.metadata(), "retention_failed": 0, "owned_log_dir": plan.owned, "remote_segments_deleted": 0,
            "remote_bytes_deleted": 0, "local_segments_deleted": 0, "local_bytes_deleted": 0}
