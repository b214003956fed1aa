"""``scrub_job`` and its weekly schedule: ``kts scrub --deep`` as a Dagster run (kts_resources.scrub).

The scrub is tier-wide, not per partition, so it is an op job rather than a partitioned asset: its
numbers go on its output's metadata (the run's page plots them), and a damaged segment fails the
run, naming it — the next copy pass re-copies it while its local segment exists.
"""

import dagster as dg

from kts_resources.resources import MetadataStoreResource, RemoteTierResource
from kts_resources.scrub import DEFAULT_GRACE_S


class ScrubConfig(dg.Config):
    deep: bool = True  # the weekly run reads every object back
    grace_seconds: int = DEFAULT_GRACE_S  # objects younger than this are left alone (a copy may be in flight)


@dg.op(description="Reconcile the remote tier's listing with the metadata store: orphans and stale uploads removed, "
                   "interrupted deletes finished, missing or corrupt objects of finished segments recorded for re-copy.")
def scrub_remote_tier(context: dg.OpExecutionContext, config: ScrubConfig, metadata_store: MetadataStoreResource,
                      remote_tier: RemoteTierResource) -> dg.Output[int]:
    from kts_resources.scrub import scrub

    report = scrub(metadata_store.store(), remote_tier.storage(), deep=config.deep, grace_s=config.grace_seconds,
                   progress=context.log.info)
    metadata = {"objects_listed": report.objects_listed, "segments_checked": report.segments_checked,
                "orphans_deleted": len(report.orphans_deleted), "deletes_finished": report.deletes_finished,
                "uploads_aborted": report.uploads_aborted, "damaged_segments": len(report.damaged),
                "deep": config.deep}
    if report.damaged:
        raise dg.Failure(description="; ".join(report.damaged[:20]), metadata=metadata, allow_retries=False)
    return dg.Output(len(report.orphans_deleted), metadata=metadata)


@dg.job(description="kts scrub --deep as a run: the remote tier reconciled with the metadata store (weekly, scrub_schedule).")
def scrub_job():
    scrub_remote_tier()


scrub_schedule = dg.ScheduleDefinition(
    name="scrub_schedule",
    job=scrub_job,
    cron_schedule="30 3 * * 0",  # Sundays 03:30: it reads every object back
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Weekly deep scrub of the remote tier (scrub_job).",
)
