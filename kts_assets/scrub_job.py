"""The whole remote tier as an asset, ``remote_tier``, its scrub check ``remote_tier_scrubbed``,
``scrub_job`` and the weekly schedule: ``kts scrub --deep`` as a Dagster run
(kts_resources.maintenance.scrub).

The scrub is tier-wide, not per partition, so it is an unpartitioned asset of its own, not a check
on ``remote_segments``: there an unpartitioned check showed "Not evaluated" on every partition, and
came along with every Materialize of a partition (Dagster's asset job runs all of an asset's
checks), reading the whole tier for one partition's copy. ``remote_tier`` is materialised only by
the scrub (scrub_job, or Materialize on its own page), its numbers as metadata (the asset's plots),
and the check is evaluated in the same step: its result shows where it was evaluated. A damaged
segment fails it, naming the segment — the next copy pass re-copies it while its local segment
exists.
"""

import dagster as dg

from kts_assets.asset_keys import REMOTE_SEGMENTS, REMOTE_TIER, tier_kind
from kts_assets.assets.reporting import OWNERS, report_partitions
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource
from kts_resources.maintenance.scrub import DEFAULT_GRACE_S

REMOTE_TIER_SCRUBBED = dg.AssetCheckKey(REMOTE_TIER, "remote_tier_scrubbed")


class ScrubConfig(dg.Config):
    deep: bool = True  # the weekly run reads every object back
    grace_seconds: int = DEFAULT_GRACE_S  # objects younger than this are left alone (a copy may be in flight)


@dg.asset(
    key=REMOTE_TIER,
    deps=[REMOTE_SEGMENTS],  # the tier holds every partition's remote segments
    kinds={tier_kind(), "postgres"},
    group_name="tiering",
    owners=OWNERS,
    code_version="1",
    description="The whole remote tier, reconciled with the metadata store by the scrub (scrub_job, weekly by "
                "scrub_schedule; `kts scrub` does the same from the CLI). Its metadata is the latest scrub's numbers.",
    check_specs=[dg.AssetCheckSpec(
        REMOTE_TIER_SCRUBBED.name, asset=REMOTE_TIER,
        description="Scrub of the whole remote tier: its listing reconciled with the metadata store (orphans past a grace "
                    "period and stale multipart uploads removed, interrupted deletes finished); with `deep`, every "
                    "object read back and every batch CRC checked. Fails naming each finished segment whose objects are "
                    "missing or corrupt; the next copy pass re-copies those whose local segment exists.")],
)
def remote_tier_asset(context: dg.AssetExecutionContext, config: ScrubConfig, metadata_store: MetadataStoreResource,
                      remote_tier: RemoteTierResource, kafka_log_dirs: KafkaLogDirsResource):
    from kts_resources.maintenance.scrub import scrub

    store = metadata_store.store()
    report = scrub(store, remote_tier.storage(), deep=config.deep, grace_s=config.grace_seconds, progress=context.log.info)
    # The partitions whose damage was recorded or cleared (or deletes finished), shown again as `kts status` has them.
    report_partitions(context.op_execution_context.log_event, store, report.partitions_changed, log_dirs=kafka_log_dirs.paths(),
                      owned_log_dirs=kafka_log_dirs.owned_paths(), changed_by=f"scrub_job run {context.run.run_id}")
    metadata = {"objects_listed": report.objects_listed, "segments_checked": report.segments_checked,
                "orphans_deleted": len(report.orphans_deleted), "deletes_finished": report.deletes_finished,
                "uploads_aborted": report.uploads_aborted, "damaged_segments": len(report.damaged),
                "unrecorded_segments": len(report.unrecorded), "manifests_missing_or_wrong": len(report.manifests),
                "index_files_deleted": len(report.index_files_deleted), "index_pointers_damaged": len(report.index_pointers),
                "deep": config.deep}
    for line in report.problems:
        context.log.error(line)
    description = ("; ".join(report.problems[:20]) + ("; damaged segments are re-copied by the next copy pass while their "
                                                      "local segments exist" if report.damaged else "")
                   if report.problems else f"{report.segments_checked} finished segments intact, "
                                           f"{len(report.orphans_deleted)} orphaned objects removed")
    # The tier is reported either way (the scrub did its work on it); the check says whether it is whole.
    yield dg.MaterializeResult(metadata=metadata)
    yield dg.AssetCheckResult(check_name=REMOTE_TIER_SCRUBBED.name, passed=report.clean,
                              severity=dg.AssetCheckSeverity.ERROR, metadata=metadata, description=description)


scrub_job = dg.define_asset_job(
    "scrub_job", selection=dg.AssetSelection.assets(remote_tier_asset),
    description="kts scrub --deep as a run: the remote tier reconciled with the metadata store (weekly, scrub_schedule).",
)

scrub_schedule = dg.ScheduleDefinition(
    name="scrub_schedule",
    job=scrub_job,
    cron_schedule="30 3 * * 0",  # Sundays 03:30: it reads every object back
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Weekly deep scrub of the remote tier (scrub_job).",
)
