"""Spark's part of retention: each task plans some partitions (``expiry.plan_partition``: the
topic's configs, the store's finished segments, the local segments' sizes and largest timestamps;
the store's rows read a few queries a task, not a few a partition: ``batch_plans.retention_plans``)
and returns the plans (``PartitionRetention``, as its own JSON), so planning thousands of
partitions runs side by side and the driver carries out exactly what was planned.
DataFrame APIs only (``range`` + ``mapInArrow``): it runs on Spark Connect as on a classic session.

A run of few partitions is planned on the driver instead (``plan_partitions``): a partition's plan
takes milliseconds, a Spark job about a second of fixed cost, and a routine copy pass (a few
partitions, nothing due) would otherwise spend most of its retention step on that cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kts_resources.tiering.expiry import PartitionRetention

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kts_resources.metadata.store import RemoteLogMetadataStore

PLAN_COLUMNS = ("partition_key", "plan", "error")
# From this many partitions a run's plans are a Spark job; fewer are planned on the driver.
SPARK_PLAN_MIN_PARTITIONS = 33


@dataclass(frozen=True)
class PlanOutcome:
    """One partition's planning: its plan, or why there is none."""

    plan: PartitionRetention | None = None
    error: str | None = None  # planning failed

    @property
    def nothing_remote(self) -> bool:
        """The store knows no topic id for it: nothing was ever copied, so retention has nothing to plan."""
        return self.plan is None and self.error is None


def _plan_one(key: str, log_dirs: list[str], owned: list[str], database_url: str, now_ms: int, store_cache: dict) -> tuple[str | None, str | None]:
    from pathlib import Path

    from kts_resources.tiering.expiry import plan_partition
    from kts_resources.kafka.errors import error_line
    from kts_resources.kafka.partition import parse_topic_partition
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.remote_log import TopicIdPartition
    from kts_resources.tiering.tiers import locate_partitions, topic_id_partition

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
            return None, None  # nothing remote
        return plan_partition(loc, tip, store, now_ms=now_ms).to_json(), None
    except Exception as e:  # noqa: BLE001 - one partition's failure is its row's error
        return None, error_line(e)


def plan_partitions(spark: Callable[[], "SparkSession"], store: "RemoteLogMetadataStore", keys: list[str], *,
                    log_dirs: list[str], owned_log_dirs: list[str], database_url: str, now_ms: int,
                    spark_min_partitions: int = SPARK_PLAN_MIN_PARTITIONS) -> dict[str, PlanOutcome]:
    """partition key → its plan's outcome: a Spark job (``spark()`` gives the session) from
    ``spark_min_partitions`` partitions on, else on the driver with the driver's ``store``; the
    same ``_plan_many`` either way."""
    if len(keys) >= spark_min_partitions:
        return plan_partitions_job(spark(), keys, log_dirs=log_dirs, owned_log_dirs=owned_log_dirs,
                                   database_url=database_url, now_ms=now_ms)
    cache = {"store": store}
    return {key: _parsed(plan, error) for key, plan, error in _plan_many(keys, log_dirs, owned_log_dirs, database_url, now_ms, cache)}


def _plan_many(keys: list[str], log_dirs: list[str], owned: list[str], database_url: str, now_ms: int,
               store_cache: dict) -> list[tuple[str, str | None, str | None]]:
    """(key, plan, error) of each of ``keys``, as ``_plan_one`` gives them: the partitions found in
    a log dir planned from a few store queries for all of them (``batch_plans.retention_plans``),
    not a few per partition; one in no log dir on its own (its topic id by name)."""
    from pathlib import Path

    from kts_resources.kafka.errors import error_line
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.tiering.batch_plans import retention_plans
    from kts_resources.tiering.tiers import locate_partitions

    try:
        store = store_cache.get("store")
        if store is None:
            store = store_cache["store"] = RemoteLogMetadataStore.from_url(database_url, migrate=False)
        located, _missing = locate_partitions([Path(p) for p in log_dirs], keys, owned_log_dirs=[Path(p) for p in owned])
        outcomes = dict(retention_plans(located, store, now_ms=now_ms))
    except Exception as e:  # noqa: BLE001 - the store is away: every partition's row says so
        return [(key, None, error_line(e)) for key in keys]
    planned: list[tuple[str, str | None, str | None]] = []
    for key in keys:
        if key not in located:
            planned.append((key, *_plan_one(key, log_dirs, owned, database_url, now_ms, store_cache)))
            continue
        outcome = outcomes[key]
        if isinstance(outcome, Exception):
            planned.append((key, None, error_line(outcome)))
        else:
            planned.append((key, None if outcome is None else outcome.to_json(), None))
    return planned


def _parsed(plan: str | None, error: str | None) -> PlanOutcome:
    return PlanOutcome(None if plan is None else PartitionRetention.from_json(plan), error)


def plan_partitions_job(spark: "SparkSession", keys: list[str], *, log_dirs: list[str], owned_log_dirs: list[str],
                        database_url: str, now_ms: int) -> dict[str, PlanOutcome]:
    """partition key → its plan's outcome, one Spark job for all of them."""
    if not keys:
        return {}

    def run(batches):
        import pyarrow as pa

        cache: dict = {}
        try:
            for batch in batches:
                batch_keys = [keys[i] for i in batch.column(0).to_pylist()]
                rows = [{"partition_key": key, "plan": plan, "error": error}
                        for key, plan, error in _plan_many(batch_keys, log_dirs, owned_log_dirs, database_url, now_ms, cache)]
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
    return {r.partition_key: _parsed(r.plan, r.error) for r in frame.collect()}
