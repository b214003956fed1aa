"""The one ``Definitions`` of kts: everything Dagster loads is assembled here."""

from __future__ import annotations

import os

import dagster as dg

from kts_assets.assets import local_segments, remote_segments
from kts_assets.checks import asset_checks
from kts_assets.jobs import jobs
from kts_assets.schedules import reconcile_schedule
from kts_assets.sensors import sensors
from kts_resources import settings
from kts_resources.resources import (
    CopyQuotaResource,
    KafkaLogDirsResource,
    MetadataStoreResource,
    RemoteTierResource,
    spark_resource,
)


def _env_or_default(name: str, default: str):
    # EnvVar keeps the value out of the UI's config view; the default makes embedded runs work.
    return dg.EnvVar(name) if os.environ.get(name) else default


def default_resources() -> dict[str, object]:
    """Resources from kts's environment contract, with embedded defaults for what is unset."""
    return {
        "kafka_log_dirs": KafkaLogDirsResource(
            log_dirs=_env_or_default("KTS_LOG_DIRS", ",".join(str(p) for p in settings.log_dirs())),
            owned_log_dirs=_env_or_default("KTS_OWNED_LOG_DIRS", ""),
        ),
        "metadata_store": MetadataStoreResource(database_url=_env_or_default("KTS_DATABASE_URL", "")),
        "remote_tier": RemoteTierResource(
            remote_uri=_env_or_default("KTS_REMOTE_URI", ""),
            s3_endpoint_url=_env_or_default("KTS_S3_ENDPOINT_URL", ""),
        ),
        "copy_quota": CopyQuotaResource(),
        "pyspark": spark_resource(),  # KTS_SPARK_MASTER, default local[*]
    }


defs = dg.Definitions(
    assets=[local_segments, remote_segments],
    asset_checks=asset_checks,
    jobs=jobs,
    sensors=sensors,
    schedules=[reconcile_schedule],
    resources=default_resources(),
)
