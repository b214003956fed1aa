"""Spark for the per-segment work: a local-or-cluster session and the segment inventory scan.

The scan runs kts's header-only reader inside Spark tasks, one task per segment file, so a
partition's (or a whole log dir's) segments are read in parallel on every core or executor.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Iterable, Mapping

from kts_resources import settings
from kts_resources.kafka.logdir import PartitionDir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

# What a shared-nothing local session needs: no UI port to collide on, few shuffle partitions.
_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def spark_conf(master: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"spark.master": master or settings.spark_master(), **_DEFAULT_CONF, **(extra or {})}


def build_spark_session(app_name: str = "kts", master: str | None = None, extra: dict[str, str] | None = None) -> "SparkSession":
    from pyspark.sql import SparkSession

    conf = spark_conf(master, extra)
    if conf["spark.master"].startswith("local"):
        # Local workers must run this interpreter (kts's virtualenv), not whatever python3 is on
        # PATH; PySpark's RDD path reads only the environment variable.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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


def _summarize(task: tuple) -> tuple:
    # Runs on an executor: imports stay inside so the closure ships only the task tuple.
    # A task is ("row", the row kept from the last scan) or ("scan", what to scan).
    kind, payload = task
    if kind == "row":
        return payload
    from kts_resources.kafka.segment import summarize_segment

    topic, partition, path, base_offset, active, mtime_ns = payload
    s = summarize_segment(path, base_offset, active=active)
    return (
        topic, partition, s.base_offset, s.last_offset, s.next_offset, s.size_bytes, s.batch_count, s.record_count,
        s.max_timestamp, list(s.leader_epochs), s.active, s.health, len(s.crc_failures),
        None if s.invalid is None else s.invalid.position, s.path, mtime_ns,
    )


def segment_inventory(spark: "SparkSession", partitions: Iterable[PartitionDir],
                      previous: Mapping[str, "Row"] | None = None) -> tuple["DataFrame", int]:
    """One row per segment of the given partitions: header-only scan with every CRC checked.

    ``previous`` (path → inventory row of an earlier scan) spares rescanning what cannot have
    changed: a segment closed then and now, of the same size and modification time — Kafka
    never rewrites a rolled segment in place. Returns the rows and how many were kept that way.
    """
    previous = previous or {}
    tasks = []
    kept = 0
    for p in partitions:
        for s in p.segments():
            st = os.stat(s.log)
            row = previous.get(str(s.log))
            if (row is not None and not s.active and not row.active
                    and (row.size_bytes, row.mtime_ns) == (st.st_size, st.st_mtime_ns)):
                tasks.append(("row", tuple(row)))
                kept += 1
            else:
                tasks.append(("scan", (p.topic, p.partition, str(s.log), s.base_offset, s.active, st.st_mtime_ns)))
    if not tasks:
        return spark.createDataFrame([], inventory_schema()), 0
    # Scans one segment per task; kept rows ride along in few slices (they cost nothing).
    slices = max(1, len(tasks) - kept)
    rdd = spark.sparkContext.parallelize(tasks, numSlices=slices).map(_summarize)
    return spark.createDataFrame(rdd, inventory_schema()), kept
