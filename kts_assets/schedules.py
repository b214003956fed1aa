"""Schedules: the periodic reconcile that copies whatever the roll sensor missed.

The roll sensor retries a failed copy itself, with backoff (``kts_assets.sensors.roll``); this is
the backstop for whatever it cannot see (a copy it never requested, runs finished while it was
stopped, segments the broker wrote without a roll it noticed). Every hour this schedule requests
``copy_job`` for every known partition, in the same few ranged runs as the sensor (copying is
idempotent: a partition with nothing new costs a listing, not an upload).
"""

from __future__ import annotations

import dagster as dg

from kts_assets.batching import batch_key_ranges, range_run_request
from kts_assets.partitions import NO_PARTITIONS_YET, topic_partitions
from kts_assets.jobs import COPY_JOB_NAME

# Every partition is wanted, so ranges have no gaps; larger runs than the sensor's are fine here.
RECONCILE_PARTITIONS_PER_RUN = 500


@dg.schedule(
    job_name=COPY_JOB_NAME,
    cron_schedule="15 * * * *",  # hourly, off the top of the hour when other schedules pile up
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Requests copy runs over every known partition, a few partition ranges at a time.",
)
def reconcile_schedule(context: dg.ScheduleEvaluationContext):
    """One ranged copy run per RECONCILE_PARTITIONS_PER_RUN known partitions."""
    keys = list(context.instance.get_dynamic_partitions(topic_partitions.name))
    if not keys:
        return dg.SkipReason(f"nothing to reconcile: {NO_PARTITIONS_YET}")
    batches = batch_key_ranges(keys, keys, max_partitions_per_run=RECONCILE_PARTITIONS_PER_RUN)
    context.log.info(f"reconciling {len(keys)} partitions in {len(batches)} runs")
    # Schedules scope run keys to the tick: a retried tick does not launch a range twice.
    return [range_run_request(b, tags={"kts/trigger": "reconcile"}, run_key=f"reconcile:{b.start}..{b.end}")
            for b in batches]
