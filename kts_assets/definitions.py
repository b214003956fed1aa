"""The one ``Definitions`` of kts: everything Dagster loads is assembled here."""

from __future__ import annotations

import os

import dagster as dg

from kts_assets.sensors import partition_discovery_sensor
from kts_resources import settings
from kts_resources.resources import KafkaLogDirsResource


def _env_or_default(name: str, default: str):
    # EnvVar keeps the value out of the UI's config view; the default makes embedded runs work.
    return dg.EnvVar(name) if os.environ.get(name) else default


defs = dg.Definitions(
    sensors=[partition_discovery_sensor],
    resources={
        "kafka_log_dirs": KafkaLogDirsResource(
            log_dirs=_env_or_default("KTS_LOG_DIRS", ",".join(str(p) for p in settings.log_dirs())),
            owned_log_dirs=_env_or_default("KTS_OWNED_LOG_DIRS", ""),
        ),
    },
)
