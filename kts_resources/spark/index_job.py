"""Spark's part of the remote log index: one task per remote segment whose entries are not cached,
reading the segment's batch headers (from its local copy while it is still there, else the remote
object) and returning its encoded remoteLogIndex entries. DataFrame APIs only (``range`` +
``mapInArrow``), so it runs on Spark Connect as on a classic session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENTRY_COLUMNS = ("task", "segment_id", "entries", "error")


@dataclass(frozen=True)
class EntriesTask:
    """One remote segment to index: enough to read it on an executor."""

    segment_id: str
    start_offset: int
    end_offset: int
    size_bytes: int
    key: str  # the .log object's key
    local_log: str | None  # the local copy, if the segment is still in a log dir
    # The .log object's CRC-32C as the store records it: a local file at the segment's base offset
    # is read instead only when it has these bytes (another replica's file, rolled or diverged
    # differently, must not describe the object every broker's readers use).
    log_crc32c: int | None = None


def _schema():
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    return StructType([StructField("task", LongType(), False), StructField("segment_id", StringType(), False),
                       StructField("entries", BinaryType(), True), StructField("error", StringType(), True)])


def _entries_of(task: EntriesTask, remote_uri: str, endpoint_url: str | None, chunk_bytes: int) -> tuple[bytes | None, str | None]:
    import uuid
    from pathlib import Path

    from kts_resources.kafka.crc import crc32c

    from kts_resources.kafka.errors import error_line
    from kts_resources.kafka.partition import TopicPartition
    from kts_resources.reading.remote_index_cache import encode_segment_entries, segment_entries_from_bytes
    from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    storage = remote_storage_from_uri(remote_uri, endpoint_url=endpoint_url)
    # Only the fields entries need: the segment id, the size and where its bytes are.
    tip = TopicIdPartition(uuid.UUID(int=0), TopicPartition("_", 0))
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, uuid.UUID(task.segment_id)), task.start_offset, task.end_offset,
                                  max_timestamp_ms=-1, broker_id=0, event_timestamp_ms=0,
                                  segment_size_in_bytes=task.size_bytes, segment_leader_epochs={0: task.start_offset})
    try:
        if task.local_log is not None:
            path = Path(task.local_log)
            try:
                if path.stat().st_size == task.size_bytes:
                    data = path.read_bytes()
                    if task.log_crc32c is None or crc32c(data) == task.log_crc32c:
                        entries = segment_entries_from_bytes(data, md, task.key, chunk_bytes=chunk_bytes, where=str(path))
                        return encode_segment_entries(entries), None
            except OSError:
                pass  # gone since listed: the remote copy has the bytes
        data = storage.fetch_range(task.key, 0, None)
        entries = segment_entries_from_bytes(data, md, task.key, chunk_bytes=chunk_bytes, where=storage.location(task.key))
        return encode_segment_entries(entries), None
    except Exception as e:  # noqa: BLE001 - one segment's failure is its row's error, not the job's
        return None, error_line(e)
    finally:
        storage.close()


def segment_entries_job(spark: "SparkSession", tasks: list[EntriesTask], *, remote_uri: str, endpoint_url: str | None,
                        chunk_bytes: int) -> list[tuple[int, str, bytes | None, str | None]]:
    """(task index, segment id, encoded entries or None, error or None) for every task."""
    if not tasks:
        return []

    def run(batches):
        import pyarrow as pa

        for batch in batches:
            rows = []
            for i in batch.column(0).to_pylist():
                entries, error = _entries_of(tasks[i], remote_uri, endpoint_url, chunk_bytes)
                rows.append({"task": i, "segment_id": tasks[i].segment_id, "entries": entries, "error": error})
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=pa.schema([
                    ("task", pa.int64(), False), ("segment_id", pa.string(), False),
                    ("entries", pa.binary()), ("error", pa.string())]))

    frame = spark.range(0, len(tasks), 1, numPartitions=min(len(tasks), 64)).mapInArrow(run, _schema())
    return [(r.task, r.segment_id, None if r.entries is None else bytes(r.entries), r.error) for r in frame.collect()]


def rebuild_local_indexes_job(spark: "SparkSession", log_paths: list[str]) -> list[tuple[str, str | None]]:
    """Rebuild the ``.index`` and ``.timeindex`` of each closed local segment in ``log_paths`` by
    Kafka's recovery rule, one task per segment, each file replaced atomically: (path, error or
    None) for every one. The caller picks the segments (``local_indexes.segments_to_reindex``) and
    passes only those of log dirs kts owns."""
    if not log_paths:
        return []

    def run(batches):
        import pyarrow as pa

        from kts_resources.kafka.errors import error_line
        from kts_resources.kafka.indexes import rebuild_segment_indexes

        for batch in batches:
            rows = []
            for i in batch.column(0).to_pylist():
                try:
                    rebuild_segment_indexes(log_paths[i], closed=True)
                    error = None
                except Exception as e:  # noqa: BLE001 - reported per segment; the others go on
                    error = error_line(e)
                rows.append({"task": i, "error": error})
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=pa.schema([("task", pa.int64(), False), ("error", pa.string())]))

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("task", LongType(), False), StructField("error", StringType(), True)])
    frame = spark.range(0, len(log_paths), 1, numPartitions=min(len(log_paths), 64)).mapInArrow(run, schema)
    return [(log_paths[r.task], r.error) for r in frame.collect()]

