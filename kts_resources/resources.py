"""Dagster resources wrapping kts's outside world. The format code they use imports no Dagster."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from dagster_pyspark import PySparkResource

from kts_resources.kafka.logdir import Discovery, LogDir

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.quotas import QuotaConfig, RLMQuotaManager
    from kts_resources.remote_storage.base import RemoteStorageManager


class KafkaLogDirsResource(dg.ConfigurableResource):
    """The broker log dirs kts reads (``KTS_LOG_DIRS``), and which of them kts owns.

    kts never edits files in a dir a live broker owns; ``owned_log_dirs`` names the dirs it may
    apply local retention to (a stopped broker, a mirror, a staging area).
    """

    log_dirs: str
    owned_log_dirs: str = ""

    def paths(self) -> list[Path]:
        return [Path(p.strip()).expanduser() for p in self.log_dirs.split(",") if p.strip()]

    def owned_paths(self) -> set[Path]:
        return {Path(p.strip()).expanduser().resolve() for p in self.owned_log_dirs.split(",") if p.strip()}

    def is_owned(self, log_dir: Path) -> bool:
        return log_dir.resolve() in self.owned_paths()

    def discover(self) -> list[tuple[LogDir, Discovery]]:
        """Every existing log dir with the partitions found in it (missing dirs are skipped)."""
        found = []
        for path in self.paths():
            if path.is_dir():
                log_dir = LogDir(path)
                found.append((log_dir, log_dir.discover()))
        return found


# --- the metadata store ------------------------------------------------------------------------

_stores: dict[str, "RemoteLogMetadataStore"] = {}
_stores_lock = threading.Lock()


class MetadataStoreResource(dg.ConfigurableResource):
    """The remote log metadata store (``KTS_DATABASE_URL``; empty: the embedded PostgreSQL).

    One store (one connection pool, migrated once) per process and URL: every step and check of a
    run, and every run of an in-process ``kts sync``, shares it.
    """

    database_url: str = ""

    def url(self) -> str:
        from kts_resources.metadata.database import database_url, normalize_url

        return normalize_url(self.database_url) if self.database_url else database_url()

    def store(self) -> "RemoteLogMetadataStore":
        from kts_resources.metadata.store import RemoteLogMetadataStore

        url = self.url()
        with _stores_lock:
            store = _stores.get(url)
            if store is None:
                store = _stores[url] = RemoteLogMetadataStore.from_url(url, migrate=True)
            return store


# --- the remote tier ---------------------------------------------------------------------------


class RemoteTierResource(dg.ConfigurableResource):
    """The remote tier (``KTS_REMOTE_URI``: ``file:///path``, default ``KTS_HOME/remote``, or
    ``s3://bucket/prefix``; ``KTS_S3_ENDPOINT_URL`` for S3-compatible stores)."""

    remote_uri: str = ""
    s3_endpoint_url: str = ""

    def uri(self) -> str:
        from kts_resources.remote_storage.factory import default_remote_uri

        return self.remote_uri or default_remote_uri()

    def storage(self) -> "RemoteStorageManager":
        from kts_resources.remote_storage.factory import remote_storage_from_uri

        uri = self.uri()
        if not uri.startswith("s3://"):
            return remote_storage_from_uri(uri)
        from dagster_aws.s3 import S3Resource

        from kts_resources.remote_storage.s3 import S3RemoteStorage, parse_s3_uri

        bucket, prefix = parse_s3_uri(uri)
        endpoint = self.s3_endpoint_url or os.environ.get("KTS_S3_ENDPOINT_URL") or None
        client = S3Resource(endpoint_url=endpoint, max_attempts=3).get_client()
        return S3RemoteStorage(client, bucket, prefix)


# --- quotas ------------------------------------------------------------------------------------


class CopyQuotaResource(dg.ConfigurableResource):
    """KIP-956's copy quota (``remote.log.manager.copy.*``); -1 is unbounded, as Kafka's default.

    Samples live in the metadata store's database, so every run copying at once shares one rate.
    """

    copy_max_bytes_per_second: int = -1
    window_num: int = 11
    window_size_seconds: int = 1

    def config(self) -> "QuotaConfig":
        from kts_resources.quotas import (
            COPY_MAX_BYTES_PER_SECOND,
            COPY_QUOTA_WINDOW_NUM,
            COPY_QUOTA_WINDOW_SIZE_SECONDS,
            QuotaConfig,
        )

        props: dict[str, int] = {COPY_QUOTA_WINDOW_NUM: self.window_num, COPY_QUOTA_WINDOW_SIZE_SECONDS: self.window_size_seconds}
        if self.copy_max_bytes_per_second >= 0:
            props[COPY_MAX_BYTES_PER_SECOND] = self.copy_max_bytes_per_second
        return QuotaConfig.from_properties(props)

    def manager(self, engine: "Engine | None" = None) -> "RLMQuotaManager":
        from kts_resources.quotas import copy_quota_manager

        return copy_quota_manager(self.config(), engine)


# --- Spark -------------------------------------------------------------------------------------


class KtsPySparkResource(PySparkResource):
    """dagster-pyspark's session with kts's settings (``KTS_SPARK_MASTER``, no UI, quiet logs).

    ``getOrCreate`` keeps one JVM per process: every Spark step of a run shares it.
    """

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if str(self.spark_config.get("spark.master", "local")).startswith("local"):
            # Local workers must run this interpreter (kts's virtualenv), not python3 on PATH.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            # A local JVM binds to loopback anyway (spark_conf); saying so spares the launcher's warning.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        super().setup_for_execution(context)
        self.spark_session.sparkContext.setLogLevel("ERROR")


def spark_resource(master: str | None = None) -> KtsPySparkResource:
    from kts_resources.spark import spark_conf

    # spark.log.level quiets the driver from its first line, before setLogLevel could.
    return KtsPySparkResource(spark_config=spark_conf(master, {"spark.log.level": "ERROR"}))
