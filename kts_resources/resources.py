"""Dagster resources wrapping kts's outside world. The format code they use imports no Dagster."""

from __future__ import annotations

import contextlib

import functools
import threading
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from kts_resources import settings
from kts_resources.kafka.logdir import Discovery, LogDir
from kts_resources.remote_storage.factory import S3_MAX_ATTEMPTS, remote_storage_from_uri, s3_client

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.metadata.quota_config import QuotaConfig
    from kts_resources.tiering.quotas import RLMQuotaManager
    from kts_resources.remote_storage.base import RemoteStorageManager


def _split_paths(raw: str) -> list[Path]:
    return [Path(p.strip()).expanduser() for p in raw.split(",") if p.strip()]


# Every resource's fields are overrides (tests, a deployment's own Definitions); an empty field
# means settings.py's value, read when the resource is used: the CLI and `dagster dev` agree.
# A resource class's docstring is its description in the Dagster UI, rendered as markdown: single
# backticks there, and no <angle brackets>.


class KafkaLogDirsResource(dg.ConfigurableResource):
    """The broker log dirs kts reads (`KTS_LOG_DIRS`), and which of them kts owns
    (`KTS_OWNED_LOG_DIRS`); empty fields take `settings.log_dirs()` / `settings.owned_log_dirs()`.

    kts never edits files in a dir a live broker owns; `owned_log_dirs` names the dirs it may
    apply local retention to (a stopped broker, a mirror, a staging area).
    """

    log_dirs: str = ""
    owned_log_dirs: str = ""

    def paths(self) -> list[Path]:
        return _split_paths(self.log_dirs) if self.log_dirs.strip() else settings.log_dirs()

    def owned_paths(self) -> set[Path]:
        owned = _split_paths(self.owned_log_dirs) if self.owned_log_dirs.strip() else settings.owned_log_dirs()
        return {p.resolve() for p in owned}

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
    """The remote log metadata store; an empty `database_url` takes `KTS_DATABASE_URL` (through
    `settings`), else the embedded PostgreSQL. Left empty in the Definitions, a URL's password never
    shows in the run config.

    One store (one connection pool, migrated once) per process and URL: every step and check of a
    run, and every run of an in-process `kts sync`, shares it.
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


@functools.cache
def kts_s3_resource_class() -> type:
    """``KtsS3Resource`` (also importable by that name), made on first use: importing dagster-aws
    costs seconds, and only an S3 tier needs it."""
    from dagster_aws.s3 import S3Resource

    class KtsS3Resource(S3Resource):
        """dagster-aws's ``S3Resource`` whose client comes from kts's one builder
        (``remote_storage.factory.s3_client``): the pipeline's client has the CLI's timeouts, retries
        and addressing style. ``max_attempts`` defaults to kts's, not dagster-aws's."""

        max_attempts: int = Field(default=S3_MAX_ATTEMPTS, description="Attempts per request in all, the first included.")

        def get_client(self) -> Any:
            return s3_client(
                self.endpoint_url,
                max_attempts=self.max_attempts,
                region_name=self.region_name,
                profile_name=self.profile_name,
                use_ssl=self.use_ssl,
                verify=self.verify,
                aws_access_key_id=self.aws_access_key_id,
                aws_secret_access_key=self.aws_secret_access_key,
                aws_session_token=self.aws_session_token,
            )

    KtsS3Resource.__qualname__ = "KtsS3Resource"
    return KtsS3Resource


def __getattr__(name: str) -> Any:
    if name == "KtsS3Resource":
        return kts_s3_resource_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RemoteTierResource(dg.ConfigurableResource):
    """The remote tier (`KTS_REMOTE_URI`: `file:///path`, default `KTS_HOME/remote`, or
    `s3://bucket/prefix`; `KTS_S3_ENDPOINT_URL` for S3-compatible stores); empty fields take
    `settings.remote_uri()` / `settings.s3_endpoint_url()`."""

    remote_uri: str = ""
    s3_endpoint_url: str = ""

    def uri(self) -> str:
        return self.remote_uri or settings.remote_uri()

    def endpoint_url(self) -> str | None:
        return self.s3_endpoint_url or settings.s3_endpoint_url()

    def s3(self) -> Any:
        """The tier's ``KtsS3Resource`` (dagster-aws's S3Resource over kts's client builder)."""
        return kts_s3_resource_class()(endpoint_url=self.endpoint_url())

    def storage(self) -> "RemoteStorageManager":
        # The S3 client through dagster-aws, made only for an S3 tier (importing it costs seconds).
        return remote_storage_from_uri(self.uri(), endpoint_url=self.endpoint_url(),
                                       make_s3_client=lambda _endpoint_url: self.s3().get_client())


# --- quotas ------------------------------------------------------------------------------------


class CopyQuotaResource(dg.ConfigurableResource):
    """KIP-956's copy quota (`remote.log.manager.copy.*`); -1 is unbounded, as Kafka's default.

    Samples live in the metadata store's database, so every run copying at once shares one rate.
    """

    copy_max_bytes_per_second: int = -1
    window_num: int = 11
    window_size_seconds: int = 1

    def config(self) -> "QuotaConfig":
        from kts_resources.metadata.quota_config import (
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
        from kts_resources.tiering.quotas import copy_quota_manager

        return copy_quota_manager(self.config(), engine)


# --- Spark -------------------------------------------------------------------------------------


class KtsPySparkResource(PySparkResource):
    """dagster-pyspark's resource with kts's session: Spark Connect by default (the embedded server
    of `KTS_HOME`, or `KTS_SPARK_REMOTE`), a classic in-process session when a master is set
    (`spark_config["spark.master"]` or `KTS_SPARK_MASTER`); see `kts_resources.spark.session.spark_mode`.

    A Connect session is one per process and endpoint, a classic one is the process's JVM: every
    Spark step of a run, and every run of an in-process `kts sync`, shares it. The session is made
    when a step first asks for it, not when the run starts: a run with nothing for Spark to do (a
    copy pass with nothing new) neither attaches nor imports the Connect client.
    """

    spark_remote: str = Field(default="", description="A Spark Connect endpoint (sc://host:port); empty takes KTS_SPARK_REMOTE.")
    _session_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._spark_session = None

    @property
    def spark_session(self) -> Any:
        with self._session_lock:
            if self._spark_session is None:
                self._spark_session = self.build_session()
            return self._spark_session

    def build_session(self) -> Any:
        """The Spark session this resource's configuration names (see ``spark_mode``)."""
        from kts_resources.spark.session import build_spark_session

        config = {key: str(value) for key, value in self.spark_config.items()}
        master = config.pop("spark.master", None)
        return build_spark_session("kts", master=master, extra=config, remote=self.spark_remote or None)

    @contextlib.contextmanager
    def server_loss_as_failure(self) -> Iterator[None]:
        """Around a step's Spark work: a Spark Connect server that stops answering fails the step
        with one line saying so (and that the next run starts a fresh one), not a gRPC trace."""
        from kts_resources.spark.session import lost_connect_server

        try:
            yield
        except Exception as e:
            lost = lost_connect_server(self._spark_session, e)
            if lost is None:
                raise
            raise dg.Failure(description=lost, allow_retries=True) from e


def spark_resource(master: str | None = None, remote: str | None = None) -> KtsPySparkResource:
    """The resource; without arguments the session's kind is settled when a run uses it (settings)."""
    # spark.log.level quiets a classic driver from its first line, before setLogLevel could.
    config: dict[str, str] = {"spark.log.level": "ERROR"}
    if master:
        config["spark.master"] = master
    return KtsPySparkResource(spark_config=config, spark_remote=remote or "")
