"""Jobs, and their names, for what sensors and schedules start. One run covers many partitions
(single-run backfill policy on both assets), so a busy tick starts one Spark JVM, not one per
partition. Partitioning (topic_partitions) comes from the assets; define_asset_job's
partitions_def is deprecated.
"""

import dagster as dg

from kts_assets.assets import local_segments, remote_segments

COPY_JOB_NAME = "copy_job"

copy_job = dg.define_asset_job(
    COPY_JOB_NAME,
    selection=[local_segments, remote_segments],
    description="Scan the partitions' local segments with Spark, then copy the eligible ones to the remote tier.",
    # All steps in the run worker's own process: one resource initialisation per run, so one Spark
    # session serves the inventory and its CRC check (which reads what that session wrote), as in
    # `kts sync`. The multiprocess default started a process and a Spark JVM per step: 40-49 s per
    # daemon run against 11 s for `kts sync` (issue 9). The steps are sequential anyway.
    executor_def=dg.in_process_executor,
)

jobs = [copy_job]
