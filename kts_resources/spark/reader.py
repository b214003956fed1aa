"""The tiered log as a Spark DataFrame, for backfills that should not touch the brokers.

    from kts_resources.spark.reader import read_tiered
    df = read_tiered(spark, "orders", [0, 1], start=0, end=None)                      # offsets
    df = read_tiered(spark, "orders", None, start=t0_ms, end=t1_ms, by="timestamp")    # every partition, by time

Columns: topic, partition, offset, timestamp, timestamp_type, key, value, headers
(array<struct<key, value>>), leader_epoch — what ``kts fetch`` returns, control batches and (with
``read_committed``) aborted transactions left out. The driver resolves the range of each partition
(timestamps through ListOffsets, KIP-33), then splits it into tasks along the remote segments'
remote log index entries (a few MiB of whole batches each) and the local segments, so executors
fetch chunks side by side, each through the same reader as ``kts fetch`` (one ranged GET per
chunk). DataFrame APIs only (``range`` + ``mapInArrow``): it runs on Spark Connect as on a
classic session.
"""

from __future__ import annotations

from collections.abc import Sequence
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.reading.reader import READ_COMMITTED, READ_UNCOMMITTED, PartitionReader, ReadError, TieredLogReader

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TASK_BYTES = 4 * 1024 * 1024  # a task reads about this much


@dataclass(frozen=True)
class ReaderConfig:
    """Where executors find the tiers: what ``TieredLogReader.from_environment`` resolves on the driver."""

    log_dirs: list[str]
    remote_uri: str
    s3_endpoint_url: str | None
    database_url: str
    home: str

    @classmethod
    def from_environment(cls) -> "ReaderConfig":
        from kts_resources import settings
        from kts_resources.metadata.database import database_url

        return cls([str(p) for p in settings.log_dirs()], settings.remote_uri(), settings.s3_endpoint_url(),
                   database_url(), str(settings.kts_home()))

    def reader(self) -> TieredLogReader:
        from kts_resources.metadata.store import RemoteLogMetadataStore
        from kts_resources.remote_storage.factory import remote_storage_from_uri

        store = RemoteLogMetadataStore.from_url(self.database_url, migrate=False)
        rsm = remote_storage_from_uri(self.remote_uri, endpoint_url=self.s3_endpoint_url)
        return TieredLogReader(log_dirs=[Path(p) for p in self.log_dirs], store=store, rsm=rsm, home=Path(self.home),
                               owned=[store, rsm])


@dataclass(frozen=True)
class ReadTask:
    """Offsets [start, end) of one partition: one task's fetch loop."""

    topic: str
    partition: int
    start: int
    end: int


def schema():
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    header = StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)])
    return StructType([
        StructField("topic", StringType(), False), StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False), StructField("timestamp", LongType(), False),
        StructField("timestamp_type", IntegerType(), False), StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True), StructField("headers", ArrayType(header), False),
        StructField("leader_epoch", IntegerType(), False),
    ])


def arrow_schema():
    """``schema()`` in Arrow's terms (what ``to_arrow_schema(schema())`` gives), built with pyarrow
    alone: PySpark's converter imports pandas, half a second in every fresh Python worker."""
    import pyarrow as pa

    from kts_resources.kafka.columnar import header_type

    return pa.schema([
        pa.field("topic", pa.string(), nullable=False), pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False), pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestamp_type", pa.int32(), nullable=False), pa.field("key", pa.binary()),
        pa.field("value", pa.binary()), pa.field("headers", header_type(), nullable=False),
        pa.field("leader_epoch", pa.int32(), nullable=False),
    ])


def plan_tasks(reader: TieredLogReader, topic: str, partitions: Sequence[int] | None, start: int, end: int | None, *,
               by: str = "offset", isolation: str = READ_UNCOMMITTED, task_bytes: int = TASK_BYTES) -> list[ReadTask]:
    """The tasks covering ``[start, end)`` (offsets, or timestamps with ``by="timestamp"``) of each
    partition, cut as ``PartitionReader.chunk_bounds`` cuts them."""
    if by not in ("offset", "timestamp"):
        raise ValueError(f"by={by!r}: expected 'offset' or 'timestamp'")
    if partitions is None:
        partitions = _partitions_of(reader, topic)
    tasks: list[ReadTask] = []
    for p in partitions:
        part = reader.partition(topic, p)
        limit = part.fetch_limit(isolation)
        if by == "timestamp":
            first = part.offsets(start, isolation).offset
            if first < 0:
                continue
            last = limit if end is None else part.offsets(end, isolation).offset
            lo, hi = first, limit if last < 0 else last
        else:
            lo, hi = max(start, part.log_start_offset), limit if end is None else min(end, limit)
        if lo >= hi:
            continue
        bounds = part.chunk_bounds(lo, hi, task_bytes)
        tasks += [ReadTask(topic, p, a, b) for a, b in zip(bounds, bounds[1:])]
    return tasks


def _partitions_of(reader: TieredLogReader, topic: str) -> list[int]:
    from kts_resources.tiering.tiers import log_dir_partitions

    found = {loc.partition.partition for loc in log_dir_partitions(reader.log_dirs) if loc.partition.topic == topic}
    if reader.store is not None:
        found.update(tip.partition for tip in reader.store.partitions() if tip.topic == topic)
    return sorted(found)


class _WorkerReader:
    """What a Python worker keeps between the tasks of one ``read_tiered`` call: one reader (one
    store connection, one tier client) and each partition's reader, opened once. Spark reuses its
    Python workers, and opening these per task cost more than reading a task's few MiB. Only the
    latest call's are kept (a new call's tasks must see the partitions as they are now)."""

    def __init__(self, call_id: str, reader: TieredLogReader) -> None:
        self.call_id, self.reader = call_id, reader
        self.partitions: dict[tuple[str, int], PartitionReader] = {}

    def partition(self, topic: str, partition: int) -> PartitionReader:
        part = self.partitions.get((topic, partition))
        if part is None:
            part = self.partitions[(topic, partition)] = self.reader.partition(topic, partition)
        return part


_worker_state: list[_WorkerReader] = []


def _worker_reader(call_id: str, plain: dict) -> _WorkerReader:
    if _worker_state and _worker_state[0].call_id == call_id:
        return _worker_state[0]
    while _worker_state:
        _worker_state.pop().reader.close()
    _worker_state.append(_WorkerReader(call_id, ReaderConfig(**plain).reader()))
    return _worker_state[0]


def read_task(reader: "TieredLogReader | _WorkerReader", task: ReadTask, isolation: str, max_bytes: int = TASK_BYTES):
    """The records of one task as an Arrow record batch of ``schema()`` (what an executor does),
    or None when the range holds none. The task's batches are fetched first, then decoded at once
    into columns (``kafka.columnar``): per-record objects cost more than the reading."""
    import numpy as np
    import pyarrow as pa

    from kts_resources.kafka.columnar import decode_columns

    part = reader.partition(task.topic, task.partition)
    kept = []
    position = task.start
    while position < task.end:
        result = part.fetch(position, max_bytes, isolation, end=task.end)
        if result.throttled:
            raise RuntimeError(f"{task.topic}-{task.partition}: the remote fetch quota holds reads back at offset {position}")
        kept += [(b.header, b.buffer) for b in result.kept(until=task.end)]
        if result.next_offset <= position:
            # The task's range was planned below the fetchable end: ending it here would drop the
            # rest of its records without a word.
            raise ReadError(f"{task.topic}-{task.partition}: offsets [{position}, {task.end}) could not be read: "
                            f"a fetch at {position} returned nothing (the fetchable end is now {result.high_watermark})")
        position = result.next_offset
    columns = decode_columns(kept)
    n = len(columns)
    arrow = arrow_schema()
    batch = pa.RecordBatch.from_arrays([
        pa.array([task.topic] * n, type=pa.string()), pa.array(np.full(n, task.partition, np.int32)),
        pa.array(columns.offset), pa.array(columns.timestamp), pa.array(columns.timestamp_type),
        columns.key, columns.value, columns.headers, pa.array(columns.leader_epoch),
    ], schema=arrow)
    # The first batch may begin before the task, the last run past it.
    inside = (columns.offset >= task.start) & (columns.offset < task.end)
    if not inside.all():
        batch = batch.filter(pa.array(inside))
    return batch if batch.num_rows else None


def read_tiered(spark: "SparkSession", topic: str, partitions: Sequence[int] | None, start: int, end: int | None = None, *,
                by: str = "offset", isolation: str = READ_UNCOMMITTED, config: ReaderConfig | None = None,
                task_bytes: int = TASK_BYTES) -> "DataFrame":
    """The records of ``topic``'s ``partitions`` (None: all) in ``[start, end)`` as a DataFrame
    (see the module docstring). ``config``: where the tiers are (default: this process's
    environment, as `kts fetch` resolves it)."""
    if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise ValueError(f"isolation {isolation!r}: expected {READ_UNCOMMITTED} or {READ_COMMITTED}")
    config = config or ReaderConfig.from_environment()
    with config.reader() as reader:
        tasks = plan_tasks(reader, topic, partitions, start, end, by=by, isolation=isolation, task_bytes=task_bytes)
    if not tasks:
        return spark.createDataFrame([], schema())
    plain = asdict(config)
    task_tuples = [(t.topic, t.partition, t.start, t.end) for t in tasks]
    call_id = uuid.uuid4().hex

    def run(batches):
        for batch in batches:
            for i in batch.column(0).to_pylist():
                task = ReadTask(*task_tuples[i])
                records = read_task(_worker_reader(call_id, plain), task, isolation, task_bytes)
                if records is not None:
                    yield records

    # Spark's default parallelism decides how many Spark tasks share the read tasks (consecutive
    # ones each, and one reader per worker): a Spark task costs tens of milliseconds of its own, as
    # much as reading a few MiB.
    return spark.range(0, len(tasks)).mapInArrow(run, schema())
