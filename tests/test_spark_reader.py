"""``read_tiered``: the tiered log as a Spark DataFrame (on the session's Spark Connect server)
equals the sequential fetch loop's records — both isolation levels, by offsets and by timestamps —
with the remote part split along the remote log index entries."""

from __future__ import annotations

import pytest

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.reading.reader import READ_COMMITTED, READ_UNCOMMITTED
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.spark.session import build_spark_session
from kts_resources.spark.reader import ReaderConfig, arrow_schema, plan_tasks, read_tiered, schema
from .partition_steps import copy_each_partition

pytestmark = pytest.mark.spark
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.fixture
def spark(spark_connect_url):
    return build_spark_session("kts-tests")


@pytest.fixture
def tiered(tmp_path, metadata_store, pg_url):
    """orders-0 and orders-1, each with its older half only remote and its remote log index built."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=21, topics=("orders",), partitions=2, total_bytes=400 * 1024, segment_bytes=32 * 1024,
                                    transactional_ratio=0.4, abort_ratio=0.5))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_each_partition(LogDir(root), metadata_store, storage)
    home = tmp_path / "home"
    for tip in metadata_store.partitions():
        finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda m: m.start_offset)
        directory = index_cache.cache_directory(home, tip)
        index_cache.build_partition_index(directory, finished,
                                          lambda md: index_cache.read_segment_entries(storage, md, chunk_bytes=4096))
        for md in finished[: len(finished) // 2]:
            for f in (root / tip.topic_partition.dir_name).glob(f"{md.start_offset:020d}.*"):
                f.unlink()
    config = ReaderConfig([str(root)], (tmp_path / "remote").as_uri(), None, pg_url, str(home))
    return config


def fetch_loop(config: ReaderConfig, partition: int, start: int, end: int, isolation: str) -> list[tuple]:
    with config.reader() as reader:
        part = reader.partition("orders", partition)
        out, position = [], start
        while position < end:
            result = part.fetch(position, 64 * 1024, isolation)
            out += [(partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in result.records if r.offset < end]
            position = result.next_offset
    return out


@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
def test_the_dataframe_equals_the_sequential_fetch_loop(spark, tiered, isolation):
    config = tiered
    with config.reader() as reader:
        limits = {p: reader.partition("orders", p).fetch_limit(isolation) for p in (0, 1)}
        tasks = plan_tasks(reader, "orders", None, 0, None, isolation=isolation, task_bytes=16 * 1024)
    assert len(tasks) > 8  # split along index entries and segments
    frame = read_tiered(spark, "orders", None, 0, None, isolation=isolation, config=config, task_bytes=16 * 1024)
    got = sorted((r.partition, r.offset, r.timestamp, r.key, r.value, tuple((h.key, h.value) for h in r.headers))
                 for r in frame.collect())
    want = sorted(fetch_loop(config, 0, 0, limits[0], isolation) + fetch_loop(config, 1, 0, limits[1], isolation))
    assert got == want and got


def test_a_timestamp_range_reads_what_listoffsets_bounds(spark, tiered):
    config = tiered
    with config.reader() as reader:
        part = reader.partition("orders", 1)
        records = fetch_loop(config, 1, part.log_start_offset, part.high_watermark, READ_UNCOMMITTED)
    t0, t1 = records[len(records) // 4][2], records[3 * len(records) // 4][2]
    frame = read_tiered(spark, "orders", [1], t0, t1, by="timestamp", config=config)
    with config.reader() as reader:
        first = reader.offsets("orders", 1, t0).offset
        last = reader.offsets("orders", 1, t1).offset
    offsets = sorted(r.offset for r in frame.select("offset").collect())
    assert offsets == [r[1] for r in records if first <= r[1] < last]


def test_the_example_backfill_counts_records_per_hour_from_both_tiers(tiered, kts_home_env, pg_url):
    import dagster as dg

    from kts_assets.assets import hourly_record_counts
    from kts_assets.partitions import topic_partitions
    from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource, spark_resource

    config = tiered
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, ["orders-0"])
        result = dg.materialize([hourly_record_counts], partition_key="orders-0", instance=instance, resources={
            "pyspark": spark_resource(), "kafka_log_dirs": KafkaLogDirsResource(log_dirs=config.log_dirs[0]),
            "metadata_store": MetadataStoreResource(database_url=pg_url), "remote_tier": RemoteTierResource(remote_uri=config.remote_uri)})
    assert result.success
    [m] = result.asset_materializations_for_node("hourly_record_counts")
    with config.reader() as reader:
        part = reader.partition("orders", 0)
        total = len(fetch_loop(config, 0, part.log_start_offset, part.high_watermark, READ_UNCOMMITTED))
    assert m.metadata["records"].value == total and m.metadata["dagster/row_count"].value >= 1


@pytest.fixture
def kts_home_env(tiered, monkeypatch):
    monkeypatch.setenv("KTS_HOME", tiered.home)
    return tiered.home


def test_the_arrow_schema_executors_build_is_the_one_spark_expects():
    # Executors build it with pyarrow alone (PySpark's converter imports pandas in every worker);
    # mapInArrow rejects batches whose schema differs from the DataFrame's.
    from pyspark.sql.pandas.types import to_arrow_schema

    assert arrow_schema() == to_arrow_schema(schema())
