"""How the pipeline's three steps run (``local_and_remote_segments``, ``retention_state``,
``remote_log_index``), in one place: each is a multi_asset over topic-partitions that

- covers a whole partition range in one run (single-run backfills: one Spark session, not one per partition);
- runs any subset of its assets and checks alone (``can_subset``: the UI's "execute check", a job that
  selects one asset of the copy step);
- takes a slot of the ``spark`` pool (dagster.yaml), so a busy tick never runs two Spark steps at once
  on a host; beside a cluster the pool is the broker's (``spark_broker_<id>``, kts_assets.broker_scope),
  so no broker's run waits for another broker's slot;
- retries a failure twice (5 s, then 10 s): a store or bucket that was briefly away. A check that
  cannot run fails without a retry (``kts_assets.checks.checks_that_must_run``).
"""

import dagster as dg

from kts_assets import broker_scope
from kts_assets.partitions import topic_partitions

PIPELINE_STEP = dict(
    partitions_def=topic_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    can_subset=True,
    pool=broker_scope.current().pool,
    retry_policy=dg.RetryPolicy(max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL),
)
