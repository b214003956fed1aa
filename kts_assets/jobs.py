"""Jobs, and their names, for what sensors and schedules start. One run covers many partitions
(single-run backfill policy on both assets), so a busy tick starts one Spark JVM, not one per
partition. Partitioning (topic_partitions) comes from the assets; define_asset_job's
partitions_def is deprecated. Every job runs in one process: the executor is the Definitions'
(kts_assets.definitions).
"""

import dagster as dg

from kts_assets.assets import hourly_record_counts, local_segments, remote_log_index, remote_segments, retention_state

COPY_JOB_NAME = "copy_job"
EXPIRY_JOB_NAME = "expiry_job"
INDEX_REBUILD_JOB_NAME = "index_rebuild_job"
# index_rebuild_job's run config: local indexes that are missing or torn rebuilt (owned log dirs),
# then every finished segment's remote index entries read again and the files laid out afresh.
REBUILD_CONFIG = {"ops": {"local_and_remote_segments": {"config": {"rebuild_indexes": True}},
                          "remote_log_index": {"config": {"rebuild": True}}}}

copy_job = dg.define_asset_job(
    COPY_JOB_NAME,
    selection=dg.AssetSelection.assets(local_segments.key, remote_segments.key, retention_state, remote_log_index),
    description="Scan the partitions' local segments with Spark while the eligible ones are copied to the remote tier, "
                "expire what retention takes, then bring the remote log index up to the finished segments.",
)

expiry_job = dg.define_asset_job(
    EXPIRY_JOB_NAME,
    selection=[retention_state, remote_log_index],
    description="Expire what retention takes from the partitions (both tiers), then roll the deleted segments out of "
                "the remote log index.",
)

index_rebuild_job = dg.define_asset_job(
    INDEX_REBUILD_JOB_NAME,
    selection=dg.AssetSelection.assets(local_segments.key, remote_log_index),
    description="Rebuild the partitions' indexes: closed local segments' .index / .timeindex that are missing or torn (in "
                "owned log dirs, by Kafka's recovery rule), and the remote log index from scratch (every finished segment "
                "read again, the files laid out afresh and shipped).",
    config=REBUILD_CONFIG,
)

backfill_job = dg.define_asset_job(
    "backfill_job",
    selection=[hourly_record_counts],
    description="Example backfill: per-hour record counts of partitions, read from both tiers with Spark (read_tiered).",
)

jobs = [copy_job, expiry_job, index_rebuild_job, backfill_job]
