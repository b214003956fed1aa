"""The scrub as an asset check, ``remote_tier_scrubbed``, its ``scrub_job`` and weekly schedule:
``kts scrub --deep`` as a Dagster run (kts_resources.maintenance.scrub).

The scrub is tier-wide, not per partition, so the check is not partitioned: its result sits on
``remote_segments`` beside the per-partition checks, with the scrub's numbers as metadata (the
check's history plots them). A damaged segment fails it, naming the segment — the next copy pass
re-copies it while its local segment exists.
"""

import dagster as dg

from kts_assets.assets import remote_segments
from kts_assets.assets.reporting import report_partitions
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource
from kts_resources.maintenance.scrub import DEFAULT_GRACE_S


class ScrubConfig(dg.Config):
    deep: bool = True  # the weekly run reads every object back
    grace_seconds: int = DEFAULT_GRACE_S  # objects younger than this are left alone (a copy may be in flight)


@dg.asset_check(asset=remote_segments.key,
                description="Scrub of the whole remote tier: its listing reconciled with the metadata store (orphans past a grace "
                            "period and stale multipart uploads removed, interrupted deletes finished); with `deep`, every "
                            "object read back and every batch CRC checked. Fails naming each finished segment whose objects are "
                            "missing or corrupt; the next copy pass re-copies those whose local segment exists.")
def remote_tier_scrubbed(context: dg.AssetCheckExecutionContext, config: ScrubConfig, metadata_store: MetadataStoreResource,
                         remote_tier: RemoteTierResource, kafka_log_dirs: KafkaLogDirsResource) -> dg.AssetCheckResult:
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
    return dg.AssetCheckResult(passed=report.clean, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
                               description=description)


scrub_job = dg.define_asset_job(
    "scrub_job", selection=dg.AssetSelection.checks(remote_tier_scrubbed),
    description="kts scrub --deep as a run: the remote tier reconciled with the metadata store (weekly, scrub_schedule).",
)

scrub_schedule = dg.ScheduleDefinition(
    name="scrub_schedule",
    job=scrub_job,
    cron_schedule="30 3 * * 0",  # Sundays 03:30: it reads every object back
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Weekly deep scrub of the remote tier (scrub_job).",
)
