"""Topic deletion without the CLI: the remote data of a topic gone from every log dir for the grace
period goes, as Kafka's topic deletion would take it (``partition_admin.delete_topics_gone_from_log_dirs``).

``kts sync`` runs that deletion at the end of its pass; a deployment that runs only the Dagster
daemon gets it from ``topic_deletion_sensor``, which looks (reading only) for topics due to go
every few minutes and then requests a ``topic_deletion_job`` run. The run deletes through the same
function as ``kts sync`` — it marks the topics still present as seen and decides again, so a topic
that came back meanwhile is kept — and reports every deleted partition again (observations of
local_segments, remote_segments and retention_state), so the UI shows them empty.
"""

from collections.abc import Callable, Iterable
from pathlib import Path

import dagster as dg

from kts_assets.assets.reporting import report_partitions
from kts_resources import settings
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource
from kts_resources.tiering.partition_admin import delete_topics_gone_from_log_dirs, topics_gone_from_log_dirs
from kts_resources.tiering.quotas import SystemClock
from kts_resources.tiering.tiers import log_dir_partitions

TOPIC_DELETION_JOB_NAME = "topic_deletion_job"
# Not a tight loop: the grace period is days (kts.topic.absence.grace.ms), and a look is two queries.
LOOK_EVERY_S = 300
_IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def present_topics(log_dirs: Iterable[Path]) -> set[str]:
    """Every topic with a partition dir in ``log_dirs``."""
    return {loc.partition.topic for loc in log_dir_partitions(log_dirs)}


def delete_gone_topics_and_report(store, storage, log_dirs: list[Path], owned_log_dirs: list[Path],
                                  emit: Callable[[dg.AssetObservation], object], *, changed_by: str) -> list[str]:
    """Delete the remote data of the topics gone from the log dirs for the grace period (topics
    present in ``log_dirs`` marked seen first) and report their partitions again through ``emit``;
    the topics deleted. `kts sync` and ``topic_deletion_job`` both run this."""
    clock = SystemClock()
    gone = delete_topics_gone_from_log_dirs(store, storage, present_topics(log_dirs), clock=clock, home=settings.kts_home())
    ids = {topic: store.topic_id(topic) for topic in gone}
    deleted = [tip.topic_partition for tip in store.partitions() if tip.topic in ids and ids[tip.topic] == tip.topic_id]
    report_partitions(emit, store, deleted, log_dirs=log_dirs, owned_log_dirs=owned_log_dirs, changed_by=changed_by,
                      now_ms=clock.now_ms())
    return gone


@dg.op(description="Delete the remote data of the topics gone from every log dir for the grace period "
                   "(kts.topic.absence.grace.ms), through the partition delete states, and report their partitions.")
def delete_gone_topics(context: dg.OpExecutionContext, kafka_log_dirs: KafkaLogDirsResource,
                       metadata_store: MetadataStoreResource, remote_tier: RemoteTierResource) -> None:
    storage = remote_tier.storage()
    gone = delete_gone_topics_and_report(metadata_store.store(), storage, kafka_log_dirs.paths(), kafka_log_dirs.owned_paths(),
                                         context.log_event, changed_by=f"{TOPIC_DELETION_JOB_NAME} run {context.run_id}")
    context.log.info(f"remote data deleted of the topics gone from the log dirs: {', '.join(gone)}" if gone
                     else "no topic is gone from the log dirs for the grace period: nothing deleted")


@dg.job(name=TOPIC_DELETION_JOB_NAME, executor_def=dg.in_process_executor,
        description="Delete the remote data of topics gone from every log dir for the grace period, as `kts sync` "
                    "does at the end of its pass (requested by topic_deletion_sensor).")
def topic_deletion_job():
    delete_gone_topics()


@dg.sensor(
    job=topic_deletion_job,
    minimum_interval_seconds=LOOK_EVERY_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests a topic_deletion_job run when a topic known to the metadata store has been in none of the "
                "log dirs for the grace period (kts.topic.absence.grace.ms), so its remote data goes without kts sync.",
)
def topic_deletion_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource,
                          metadata_store: MetadataStoreResource):
    present = present_topics(kafka_log_dirs.paths())
    gone = topics_gone_from_log_dirs(metadata_store.store(), present, clock=SystemClock())
    if not gone:
        return dg.SkipReason(f"no topic has been gone from the log dirs for the grace period ({len(present)} topics "
                             "present); nothing to delete")
    running = context.instance.get_run_records(dg.RunsFilter(job_name=TOPIC_DELETION_JOB_NAME, statuses=_IN_FLIGHT), limit=1)
    if running:
        return dg.SkipReason(f"{', '.join(gone)}: gone from the log dirs; run {running[0].dagster_run.run_id} is deleting "
                             "their remote data")
    context.log.info(f"gone from the log dirs for the grace period: {', '.join(gone)}")
    return dg.RunRequest(tags={"kts/trigger": "topic_deletion"})
