"""Jobs, and their names, for what sensors and schedules start. One run covers many partitions
(single-run backfill policy on both assets), so a busy tick starts one Spark JVM, not one per
partition. Partitioning (topic_partitions) comes from the assets; define_asset_job's
partitions_def is deprecated.
"""

import dagster as dg

from kts_assets.assets import hourly_record_counts, local_segments, remote_log_index, remote_segments, retention_state

COPY_JOB_NAME = "copy_job"
EXPIRY_JOB_NAME = "expiry_job"
INDEX_REBUILD_JOB_NAME = "index_rebuild_job"
# index_rebuild_job's run config: every finished segment read again, the files laid out afresh.
REBUILD_CONFIG = {"ops": {"remote_log_index": {"config": {"rebuild": True}}}}

copy_job = dg.define_asset_job(
    COPY_JOB_NAME,
    selection=[local_segments, remote_segments, retention_state, remote_log_index],
    description="Scan the partitions' local segments with Spark, copy the eligible ones to the remote tier, expire what "
                "retention takes, then bring the remote log index up to the finished segments.",
    # One process per run, as `kts sync` runs it: the inventory step and its CRC check share one
    # Spark session (each step process of the multiprocess executor started a JVM of its own, which
    # made daemon runs ~4x slower than `kts sync`); the copy parallelises partitions in threads anyway.
    executor_def=dg.in_process_executor,
)

expiry_job = dg.define_asset_job(
    EXPIRY_JOB_NAME,
    selection=[retention_state, remote_log_index],
    description="Expire what retention takes from the partitions (both tiers), then roll the deleted segments out of "
                "the remote log index.",
    executor_def=dg.in_process_executor,
)

index_rebuild_job = dg.define_asset_job(
    INDEX_REBUILD_JOB_NAME,
    selection=[remote_log_index],
    description="Rebuild the partitions' remote log index from scratch (every finished segment read again, the files laid "
                "out afresh and shipped): for an index found missing, damaged or behind the store.",
    config=REBUILD_CONFIG,
    executor_def=dg.in_process_executor,
)

backfill_job = dg.define_asset_job(
    "backfill_job",
    selection=[hourly_record_counts],
    description="Example backfill: per-hour record counts of partitions, read from both tiers with Spark (read_tiered).",
    executor_def=dg.in_process_executor,
)

jobs = [copy_job, expiry_job, index_rebuild_job, backfill_job]
