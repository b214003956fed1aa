"""Spark for the per-segment work: the session and the segment inventory scan.

Three kinds of session (``spark_mode``): by default a Spark Connect session on the embedded server
of ``KTS_HOME`` (``connect_server.py``); ``KTS_SPARK_REMOTE`` attaches to a cluster's Spark Connect
endpoint; ``KTS_SPARK_MASTER`` builds a classic in-process session. Jobs use DataFrame APIs only,
so they run unchanged on all three.

The scan runs kts's header-only reader inside Spark tasks, each over a group of segment files of
about equal bytes (``balanced_groups``), as many as the session runs at once, so a
partition's (or a whole log dir's) segments are read in parallel on every core or executor, and a
Python task's fixed cost (~50 ms here) is paid a few times rather than once per segment.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

from kts_resources import settings
from kts_resources.spark.conf import spark_conf
from kts_resources.spark.inventory import read_inventory_table
from kts_resources.kafka.logdir import PartitionDir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

CLASSIC = "classic"
REMOTE = "remote"
EMBEDDED = "embedded"


def spark_mode(master: str | None = None, remote: str | None = None) -> str:
    """Which session kts builds: an explicit ``master`` or ``KTS_SPARK_MASTER`` → a classic
    in-process session; ``remote`` or ``KTS_SPARK_REMOTE`` → that Spark Connect endpoint; neither →
    the embedded Spark Connect server of ``KTS_HOME``."""
    if master:
        return CLASSIC
    if remote:
        return REMOTE
    if settings.spark_classic_master():
        return CLASSIC
    return REMOTE if settings.spark_remote() else EMBEDDED


def build_spark_session(app_name: str = "kts", master: str | None = None, extra: dict[str, str] | None = None,
                        remote: str | None = None) -> "SparkSession":
    """The session of the mode ``spark_mode`` picks. A Connect session is one per endpoint and
    process (every step and run of a ``kts sync`` shares it); a classic one is the process's JVM."""
    mode = spark_mode(master, remote)
    if mode == CLASSIC:
        return _classic_session(app_name, master or settings.spark_classic_master(), extra)
    if mode == REMOTE:
        return connect_session(remote or settings.spark_remote(), embedded=False)
    from kts_resources.spark import connect_server as spark_connect

    return connect_session(spark_connect.ensure_running().session_url, embedded=True)


def _classic_session(app_name: str, master: str | None, extra: dict[str, str] | None) -> "SparkSession":
    from pyspark.sql import SparkSession

    if not _connect_sessions:
        # Inherited from a parent that used Spark Connect: PySpark would take this process for a
        # Connect client too (it allows one kind of session per process).
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    conf = spark_conf(master, extra)
    if conf["spark.master"].startswith("local"):
        # Local workers must run this interpreter (kts's virtualenv), not whatever python3 is on
        # PATH; PySpark's worker launch reads only the environment variable.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # A local JVM binds to loopback anyway (spark_conf); saying so spares the launcher's warning.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_connect_sessions: dict[str, "SparkSession"] = {}
_connect_lock = threading.Lock()


def connect_session(url: str, *, embedded: bool) -> "SparkSession":
    """A Spark Connect session on ``url``, made once per process and endpoint.

    A cluster's session (``embedded`` false) gets kts_resources as a Python artifact, so its
    executors import kts's per-segment code; the embedded server's workers run kts's own
    virtualenv and need nothing shipped. The embedded server is on loopback: when it stops
    answering it is gone (killed, stopped), so a call fails in seconds, not after the client's
    default ten minutes of retries, and the next run starts a fresh server."""
    from pyspark.sql import SparkSession

    with _connect_lock:
        session = _connect_sessions.get(url)
        if session is None or session.is_stopped:
            # create(), not getOrCreate(): the latter hands back any default session, whatever its endpoint.
            session = SparkSession.builder.remote(url).create()
            if embedded:
                from pyspark.sql.connect.client.retries import DefaultPolicy

                session.client.set_retry_policies([DefaultPolicy(max_retries=3, max_backoff=1000)])
                # The server-side session is every kts process's: `stop()` closes this client only.
                session.release_session_on_close = False
            else:
                artifact = _code_artifact()
                try:
                    session.addArtifacts(str(artifact), pyfile=True)
                finally:
                    artifact.unlink(missing_ok=True)
            # Reads must list files as they are now: kts replaces Parquet directories (inventories)
            # under the same paths, and a plan cached by an earlier identical read keeps the old
            # listing. A server may refuse the setting; the embedded one is started without the cache.
            try:
                session.conf.set("spark.connect.session.planCache.enabled", "false")
            except Exception:  # noqa: BLE001 - a server that does not know or allow it
                pass
            _connect_sessions[url] = session
        return session


# What a Spark Connect client's errors say when its server stopped answering (gRPC UNAVAILABLE,
# a refused or reset connection, the retries given up on).
_SERVER_GONE_SIGNS = ("RETRIES_EXCEEDED", "StatusCode.UNAVAILABLE", "failed to connect to all addresses",
                      "Connection refused", "Socket closed", "Connection reset")


def lost_connect_server(session: "SparkSession | None", error: BaseException) -> str | None:
    """One line when ``error`` (or its cause) says ``session``'s Spark Connect server stopped
    answering mid-job — killed, OOM, stopped by `kts services stop` — else None. The run fails
    either way; this says why in words a user acts on instead of a gRPC trace."""
    url = next((u for u, s in list(_connect_sessions.items()) if s is session), None)
    if url is None:
        return None
    seen, texts = set(), []
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    if any("SESSION_CLOSED" in text for text in texts):
        return (f"the shared session of the Spark Connect server at {url.split('/;')[0]} was closed by a client; "
                "this run failed — `kts spark stop`, and the next run starts a fresh server and session")
    if not any(sign in text for text in texts for sign in _SERVER_GONE_SIGNS):
        return None
    return (f"the Spark Connect server at {url.split('/;')[0]} stopped answering mid-job (killed, out of memory, or stopped); "
            "this run failed, and the next run starts a fresh embedded server (or waits for KTS_SPARK_REMOTE's) "
            "— `kts services` shows it")


def forget_connect_sessions() -> None:
    """Drop this process's Connect sessions and close their channels (no call to the server: one
    may be gone, and the client would retry it for minutes; the server expires idle sessions)."""
    with _connect_lock:
        for session in _connect_sessions.values():
            try:
                session.client.close()
            except Exception:  # a channel already closed has nothing left to close
                pass
        _connect_sessions.clear()


def _code_artifact() -> Path:
    """kts_resources as a zip a Spark Connect cluster puts on its executors' Python path."""
    import tempfile
    import zipfile

    import kts_resources

    package = Path(kts_resources.__file__).resolve().parent
    fd, name = tempfile.mkstemp(prefix="kts_resources-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, Path("kts_resources") / path.relative_to(package))
    return Path(name)


INVENTORY_COLUMNS = (
    "topic", "partition", "base_offset", "last_offset", "next_offset", "size_bytes", "batch_count",
    "record_count", "max_timestamp", "leader_epochs", "active", "health", "crc_failures",
    "invalid_bytes_position", "path", "mtime_ns",
)


def inventory_schema():
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("topic", T.StringType(), False),
        T.StructField("partition", T.IntegerType(), False),
        T.StructField("base_offset", T.LongType(), False),
        T.StructField("last_offset", T.LongType(), True),
        T.StructField("next_offset", T.LongType(), False),
        T.StructField("size_bytes", T.LongType(), False),
        T.StructField("batch_count", T.LongType(), False),
        T.StructField("record_count", T.LongType(), False),
        T.StructField("max_timestamp", T.LongType(), False),
        T.StructField("leader_epochs", T.ArrayType(T.IntegerType(), False), False),
        T.StructField("active", T.BooleanType(), False),
        T.StructField("health", T.StringType(), False),
        T.StructField("crc_failures", T.IntegerType(), False),
        T.StructField("invalid_bytes_position", T.LongType(), True),
        T.StructField("path", T.StringType(), False),
        # The file's modification time at the scan: with its size, what says a closed segment is
        # unchanged since (null in inventories written before the column existed).
        T.StructField("mtime_ns", T.LongType(), True),
    ])


def read_inventory(spark: "SparkSession", paths: Iterable[os.PathLike | str]) -> "DataFrame":
    """The stored inventories at ``paths`` as one frame, read with today's schema (columns an older
    inventory lacks come back null)."""
    return spark.read.schema(inventory_schema()).parquet(*map(str, paths))


def unreadable_row(topic: str, partition: int, path: str, base_offset: int, active: bool, mtime_ns: int | None,
                   problem: str) -> tuple:
    """The inventory row of a segment that could not be read: its health names why (one line), so
    that segment's partition is reported and fails alone while the job goes on with the rest."""
    return (topic, partition, base_offset, None, base_offset, 0, 0, 0, -1, [], active, f"unreadable: {problem}", 0,
            None, path, mtime_ns)


def _summarize(scan: tuple) -> tuple:
    """One inventory row from a scan task (topic, partition, path, base offset, active, mtime_ns)."""
    from kts_resources.kafka.errors import KafkaFormatError
    from kts_resources.kafka.segment import summarize_segment

    topic, partition, path, base_offset, active, mtime_ns = scan
    try:
        s = summarize_segment(path, base_offset, active=active)
    except (OSError, KafkaFormatError) as e:
        problem = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return unreadable_row(topic, partition, path, base_offset, active, mtime_ns, " ".join(problem.split()))
    return (
        topic, partition, s.base_offset, s.last_offset, s.next_offset, s.size_bytes, s.batch_count, s.record_count,
        s.max_timestamp, list(s.leader_epochs), s.active, s.health, len(s.crc_failures),
        None if s.invalid is None else s.invalid.position, s.path, mtime_ns,
    )


def _scanner(groups: list[list[tuple]]):
    """The ``mapInArrow`` function over ``range(len(groups))``: each task index names one group of
    scans, summarised one segment after another.

    Runs on an executor (classic or Spark Connect alike); the scan list rides in the closure, and
    kts_resources is imported there (the worker's Python, or the artifact shipped to a cluster)."""

    def scan_batches(batches):
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(inventory_schema())
        for batch in batches:
            rows = [_summarize(scan) for i in batch.column(0).to_pylist() for scan in groups[i]]
            if rows:
                yield pa.RecordBatch.from_pylist([dict(zip(INVENTORY_COLUMNS, r)) for r in rows], schema=schema)

    return scan_batches


# Tasks per slot the session runs at once: one, since the groups are balanced by bytes and each
# further wave of tasks cost ~0.15 s of hand-over between tasks here.
TASKS_PER_SLOT = 1
_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:,\d+)?\])?$")


def task_slots(spark: "SparkSession") -> int | None:
    """How many tasks ``spark`` runs at once: ``spark.default.parallelism`` when set, else a local
    master's threads (``local[*]``: this machine's CPUs, where the embedded server runs); None for
    a cluster that does not say (its executors can come and go)."""
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured and configured.isdigit() and int(configured) > 0:
        return int(configured)
    m = _LOCAL_MASTER.match(spark.conf.get("spark.master", None) or "")
    if m is None:
        return None
    threads = m.group(1) or "1"
    return (os.cpu_count() or 1) if threads == "*" else max(1, int(threads))


def scan_tasks(spark: "SparkSession", scans: int, *, beside_copy: bool = False) -> int:
    """How many tasks an inventory of ``scans`` segments runs as: the session's slots (a task per
    scan on a cluster that does not say). ``beside_copy``: a copy runs in this process meanwhile,
    so a local session (its tasks on this machine's cores) leaves it one core: on two cores, two
    scan tasks beside the copy's CRCs and writes made a 1 GiB copy step ~0.3 s slower than one task
    did (bench/README.md), and the scan still ends before the copy."""
    slots = task_slots(spark)
    if slots is None:
        return scans
    if beside_copy and slots > 1 and _LOCAL_MASTER.match(spark.conf.get("spark.master", None) or ""):
        slots -= 1
    return slots * TASKS_PER_SLOT


def balanced_groups(sizes: list[int], groups: int) -> list[list[int]]:
    """The indexes of ``sizes`` in at most ``groups`` groups of about equal total (largest first,
    each to the lightest group so far: within 4/3 of the best split), none empty."""
    import heapq

    heap = [(0, g) for g in range(max(1, min(groups, len(sizes))))]
    members: list[list[int]] = [[] for _ in heap]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        total, g = heapq.heappop(heap)
        members[g].append(i)
        heapq.heappush(heap, (total + sizes[i], g))
    return [sorted(m) for m in members if m]


@dataclass
class InventoryScanPlan:
    """What an inventory must scan, and what it may keep (see :func:`plan_inventory_scan`)."""

    scans: list[tuple]  # (topic, partition, path, base offset, active, mtime_ns): a segment to scan each
    sizes: list[int]  # bytes of each scan's file when planned (what the tasks are balanced by)
    kept_rows: list[tuple]  # previous rows of segments that cannot have changed
    unreadable: list[tuple]  # rows made on the driver for segments it could not even stat

    @property
    def unchanged(self) -> bool:
        """Nothing to scan and nothing unreadable: every row is a kept one."""
        return not self.scans and not self.unreadable


def plan_inventory_scan(partitions: Iterable[PartitionDir], previous: Mapping[str, "Row"] | None = None) -> InventoryScanPlan:
    """Which segments an inventory scans. ``previous`` (path → inventory row of an earlier scan)
    spares rescanning what cannot have changed: a segment of the same size and modification time,
    closed then and now (Kafka never rewrites a rolled segment in place) or active then and now
    (appends move both; a preallocated active segment keeps its size but not its mtime)."""
    previous = previous or {}
    plan = InventoryScanPlan([], [], [], [])
    for p in partitions:
        for s in p.segments():
            try:
                st = os.stat(s.log)
            except OSError as e:  # gone since listed, a dangling link: that segment's row says so
                plan.unreadable.append(unreadable_row(p.topic, p.partition, str(s.log), s.base_offset, s.active, None,
                                                      e.strerror or str(e)))
                continue
            row = previous.get(str(s.log))
            if row is not None and row.active == s.active and (row.size_bytes, row.mtime_ns) == (st.st_size, st.st_mtime_ns):
                plan.kept_rows.append(tuple(row[c] for c in INVENTORY_COLUMNS))
            else:
                plan.scans.append((p.topic, p.partition, str(s.log), s.base_offset, s.active, st.st_mtime_ns))
                plan.sizes.append(st.st_size)
    return plan


def segment_inventory(spark: "SparkSession", partitions: Iterable[PartitionDir],
                      previous: Mapping[str, "Row"] | None = None, *, beside_copy: bool = False) -> tuple["DataFrame", int]:
    """One row per segment of the given partitions: header-only scan with every CRC checked,
    except what :func:`plan_inventory_scan` keeps from ``previous``. Returns the rows and how many
    were kept. ``beside_copy``: see :func:`scan_tasks`.

    DataFrame APIs only (``range`` + ``mapInArrow``, no RDD or ``sparkContext``), so the job runs
    the same on a classic session and on Spark Connect.
    """
    plan = plan_inventory_scan(partitions, previous)
    schema = inventory_schema()
    kept = spark.createDataFrame(plan.kept_rows + plan.unreadable, schema)
    if not plan.scans:
        return kept, len(plan.kept_rows)
    # range's partitions are the tasks, each index naming its group of scans.
    groups = balanced_groups(plan.sizes, scan_tasks(spark, len(plan.scans), beside_copy=beside_copy))
    tasks = [[plan.scans[i] for i in group] for group in groups]
    scanned = spark.range(0, len(tasks), 1, numPartitions=len(tasks)).mapInArrow(_scanner(tasks), schema)
    return (scanned.unionByName(kept) if plan.kept_rows or plan.unreadable else scanned), len(plan.kept_rows)


def previous_inventory_rows(paths: Iterable[os.PathLike | str]) -> dict[str, "Row"]:
    """path → row of the stored inventories at ``paths``, read on the driver with pyarrow: a row per
    segment, too small to be worth a Spark job. Columns an older inventory lacks come back None."""
    from pyspark.sql import Row

    rows: dict[str, Row] = {}
    for path in paths:
        for record in read_inventory_table(path).to_pylist():
            row = Row(**{c: record.get(c) for c in INVENTORY_COLUMNS})
            rows[row.path] = row
    return rows
