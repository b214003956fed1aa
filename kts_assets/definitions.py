"""The one ``Definitions`` of kts: everything Dagster loads is assembled here."""

from __future__ import annotations

import dagster as dg

from kts_assets.assets import hourly_record_counts, local_and_remote_segments, remote_log_index, retention_state
from kts_assets.jobs import jobs
from kts_assets.schedules import reconcile_schedule
from kts_assets.scrub_job import remote_tier_asset, scrub_job, scrub_schedule
from kts_assets.sensors import sensors
from kts_resources.resources import (
    CopyQuotaResource,
    KafkaLogDirsResource,
    MetadataStoreResource,
    RemoteTierResource,
    spark_resource,
)


def default_resources() -> dict[str, object]:
    """Resources from kts's environment contract. Their fields are left empty: each resource asks
    ``kts_resources.settings`` when used, as the CLI does, so `kts sync` and `dagster dev` get the
    same values and defaults from one place. (Not ``dg.EnvVar``: it reads the environment itself,
    without settings' defaults and normalisation, and would make a second road to each value; an
    empty field keeps secrets such as a database URL's password out of the run config just as well.)"""
    return {
        "kafka_log_dirs": KafkaLogDirsResource(),
        "metadata_store": MetadataStoreResource(),
        "remote_tier": RemoteTierResource(),
        "copy_quota": CopyQuotaResource(),
        "pyspark": spark_resource(),  # Spark Connect (embedded or KTS_SPARK_REMOTE), classic with KTS_SPARK_MASTER
    }


defs = dg.Definitions(
    # The assets' checks are check specs of the steps that materialise them (kts_assets.checks, scrub_job).
    assets=[local_and_remote_segments, retention_state, remote_log_index, hourly_record_counts, remote_tier_asset],
    jobs=[*jobs, scrub_job],
    sensors=sensors,
    schedules=[reconcile_schedule, scrub_schedule],
    resources=default_resources(),
    # Every job runs its steps in one process, the jobs here and Dagster's implicit asset job (what
    # Materialize on an asset page launches) alike: the Spark steps share one Spark session, and a
    # run does not pay a Python process with Dagster and kts imported per step (the multiprocess
    # default made a Materialize of one partition ~3x slower than copy_job over the same one, and
    # daemon runs ~4x slower than `kts sync`). A copy parallelises partitions in threads anyway.
    executor=dg.in_process_executor,
)
