"""``hourly_record_counts``: an example backfill over the tiered log with Spark.

It reads each partition's whole log — the remote tier's part too, never the brokers — through
``kts_resources.spark.reader.read_tiered`` and counts records per hour, as a team would start a
replay or a historical aggregate. Not part of the tiering jobs: it runs in ``backfill_job``.
"""

import dagster as dg

from kts_assets import broker_scope
from kts_assets.asset_keys import HOURLY_RECORD_COUNTS
from kts_assets.assets.reporting import OWNERS
from kts_assets.assets.segments import table_schema
from kts_assets.partition_outcome import fail_if_no_partition_is_found
from kts_assets.partitions import topic_partitions
from kts_assets.run_hygiene import record_run_worker
from kts_resources import settings
from kts_resources.spark.inventory import key_digest
from kts_resources.kafka.partition import parse_topic_partition
from kts_resources.resources import KafkaLogDirsResource, KtsPySparkResource, MetadataStoreResource, RemoteTierResource
from kts_resources.tiering.tiers import locate_partitions

HOUR_MS = 3_600_000


@dg.asset(
    key=HOURLY_RECORD_COUNTS,
    partitions_def=topic_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    pool=broker_scope.current().pool,
    kinds={"spark", "parquet"},
    group_name="backfills",
    owners=OWNERS,
    code_version="1",
    description=(
        "Example backfill: records per hour of each partition's whole log, read from both tiers with "
        "`read_tiered` (the remote tier's part fetched by executors in parallel, one ranged GET per chunk), "
        "stored as Parquet under `KTS_HOME/backfill/hourly_record_counts/`."
    ),
)
def hourly_record_counts(
    context: dg.AssetExecutionContext,
    pyspark: KtsPySparkResource,
    kafka_log_dirs: KafkaLogDirsResource,
    metadata_store: MetadataStoreResource,
    remote_tier: RemoteTierResource,
) -> dg.MaterializeResult:
    from pyspark.sql import functions as F

    from kts_resources.spark.reader import ReaderConfig, read_tiered

    record_run_worker(context)
    keys = list(context.partition_keys)
    _located, missing = locate_partitions(kafka_log_dirs.paths(), keys)
    fail_if_no_partition_is_found(keys, missing, kafka_log_dirs.paths())
    config = ReaderConfig([str(p) for p in kafka_log_dirs.paths()], remote_tier.uri(), remote_tier.endpoint_url(),
                          metadata_store.url(), str(settings.kts_home()))
    spark = pyspark.spark_session
    root = settings.kts_home() / "backfill" / "hourly_record_counts"
    for key in keys:
        tp = parse_topic_partition(key)
        records = read_tiered(spark, tp.topic, [tp.partition], 0, None, config=config)
        counts = (records.groupBy((F.floor(F.col("timestamp") / HOUR_MS) * HOUR_MS).alias("hour_start_ms"))
                  .agg(F.count("*").alias("records"), F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"))
                  .orderBy("hour_start_ms"))
        path = root / key_digest(key)
        counts.write.mode("overwrite").parquet(str(path))
        rows = counts.collect()
        context.add_asset_metadata({
            "dagster/row_count": len(rows),
            "dagster/column_schema": table_schema(counts.schema),
            "records": sum(r.records for r in rows),
            "hours": len(rows),
            "path": dg.MetadataValue.path(str(path)),
        }, partition_key=key)
    return dg.MaterializeResult()
