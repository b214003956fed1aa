"""Spark's part of retention: each task plans some partitions (``expiry.plan_partition``: the
topic's configs, the store's finished segments, the local segments' sizes and largest timestamps)
and returns the plan's numbers, so planning thousands of partitions runs side by side.
DataFrame APIs only (``range`` + ``mapInArrow``): it runs on Spark Connect as on a classic session.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PLAN_COLUMNS = ("partition_key", "plan", "error")


def _plan_one(key: str, log_dirs: list[str], owned: list[str], database_url: str, now_ms: int, store_cache: dict) -> tuple[str | None, str | None]:
    from pathlib import Path

    from kts_resources.expiry import plan_partition
    from kts_resources.kafka.partition import parse_topic_partition
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.remote_log import TopicIdPartition
    from kts_resources.tiers import locate_partitions, topic_id_partition

    try:
        store = store_cache.get("store")
        if store is None:
            store = store_cache["store"] = RemoteLogMetadataStore.from_url(database_url, migrate=False)
        located, _missing = locate_partitions([Path(p) for p in log_dirs], [key], owned_log_dirs=[Path(p) for p in owned])
        loc = located.get(key)
        if loc is not None:
            tip = topic_id_partition(loc.partition, store)
        else:
            tp = parse_topic_partition(key)
            topic_id = store.topic_id(tp.topic)
            tip = TopicIdPartition(topic_id, tp) if topic_id is not None else None
        if tip is None:
            return json.dumps({"nothing_remote": True}), None
        plan = plan_partition(loc, tip, store, now_ms=now_ms)
        return json.dumps({**plan.metadata(), "has_work": plan.has_work, "owned": plan.owned,
                           "remote_expired": [[e.start_offset, e.end_offset, e.reason] for e in plan.remote.expired],
                           "local_expired": [[e.start_offset, e.end_offset, e.reason] for e in plan.local.expired]}), None
    except Exception as e:  # noqa: BLE001 - one partition's failure is its row's error
        return None, " ".join(str(e).split()) or type(e).__name__


def plan_partitions_job(spark: "SparkSession", keys: list[str], *, log_dirs: list[str], owned_log_dirs: list[str],
                        database_url: str, now_ms: int) -> dict[str, tuple[dict | None, str | None]]:
    """partition key → (the plan's numbers, or None; the error, or None)."""
    if not keys:
        return {}

    def run(batches):
        import pyarrow as pa

        cache: dict = {}
        try:
            for batch in batches:
                rows = []
                for i in batch.column(0).to_pylist():
                    plan, error = _plan_one(keys[i], log_dirs, owned_log_dirs, database_url, now_ms, cache)
                    rows.append({"partition_key": keys[i], "plan": plan, "error": error})
                if rows:
                    yield pa.RecordBatch.from_pylist(rows, schema=pa.schema(
                        [("partition_key", pa.string(), False), ("plan", pa.string()), ("error", pa.string())]))
        finally:
            if "store" in cache:
                cache["store"].close()

    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("partition_key", StringType(), False), StructField("plan", StringType(), True),
                         StructField("error", StringType(), True)])
    # Spark's default parallelism, at most 16 tasks (each holds one store connection): a task and
    # its connection cost as much as planning a few partitions.
    frame = spark.range(0, len(keys)).coalesce(16).mapInArrow(run, schema)
    return {r.partition_key: (None if r.plan is None else json.loads(r.plan), r.error) for r in frame.collect()}
