"""A step reads its partitions' store rows a chunk of partitions per query, not a few reads per
partition (issue 33: a pass made ~50 store statements a partition, counted in-process): the
copy step's offset and bucket checks, the remote index check and the retention step (its plans on
the driver, its delete-on-disable test) send as many statements to the metadata store for 8
partitions as for 2. What a step still does per partition by design (the copy under its partition
lock, the lost-range check's look under it) is not run here."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from kts_assets.assets import local_and_remote_segments, remote_log_index, retention_state
from kts_assets.batching import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from kts_assets.checks import OFFSET_INVARIANTS, REMOTE_INDEX_COVERS, REMOTE_SEGMENTS_IN_BUCKET
from kts_assets.partitions import topic_partitions
from kts_resources.kafka.logdir import LogDir
from kts_resources.resources import (
    CopyQuotaResource,
    KafkaLogDirsResource,
    KtsPySparkResource,
    MetadataStoreResource,
    RemoteTierResource,
)
from tests.simulated_copies import copied_world

from .test_batch_plans import _store_statements


def _steps_statements(tmp_path, pg_url, store, partitions: int) -> dict[str, int]:
    topic = f"t{partitions}"
    log_dir = copied_world(tmp_path / topic, store, (topic,), partitions, copy_topics=(topic,))
    store.set_topic_config(topic, "retention.ms", -1)  # nothing due: the plans are made, nothing expires
    keys = sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions())
    resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir)), "metadata_store": MetadataStoreResource(database_url=pg_url),
                 "remote_tier": RemoteTierResource(remote_uri=(tmp_path / topic / "remote").as_uri()),
                 "copy_quota": CopyQuotaResource(), "pyspark": KtsPySparkResource(spark_config={})}  # no Spark job runs here
    tags = {PARTITION_RANGE_START_TAG: keys[0], PARTITION_RANGE_END_TAG: keys[-1]}
    runs = {
        "copy checks": dict(assets=[local_and_remote_segments],
                            selection=dg.AssetSelection.checks(OFFSET_INVARIANTS, REMOTE_SEGMENTS_IN_BUCKET)),
        "index check": dict(assets=[remote_log_index], selection=dg.AssetSelection.checks(REMOTE_INDEX_COVERS)),
        "retention": dict(assets=[retention_state], selection=dg.AssetSelection.assets(retention_state)),
    }
    counts = {}
    with dg.instance_for_test() as instance:  # Dagster's storage is its SQLite: only kts's store is counted
        instance.add_dynamic_partitions(topic_partitions.name, keys)
        for name, run in runs.items():
            def materialize():
                result = dg.materialize(run["assets"], selection=run["selection"], instance=instance,
                                        resources=resources, tags=tags, raise_on_error=False)
                evaluations = {e.partition for e in result.get_asset_check_evaluations()}
                materialized = {m.partition for m in result.asset_materializations_for_node("retention_state")} if name == "retention" else set()
                assert (evaluations or materialized) == set(keys), name

            counts[name] = _store_statements(pg_url, materialize)
    return counts


def test_the_steps_store_statements_do_not_grow_with_the_partitions_they_judge_and_plan(tmp_path, pg_url):
    store = MetadataStoreResource(database_url=pg_url).store()
    two, eight = (_steps_statements(tmp_path, pg_url, store, n) for n in (2, 8))
    store.close()
    assert two == eight, (two, eight)
