"""``retention_state`` and ``expiry_job`` through Dagster, and the retention sensor: a copied
partition whose two oldest segments pass retention.ms loses them from the remote tier (and, in an
owned log dir, locally), with the plan's numbers as metadata; the sensor asks for runs only where
there is something to expire, and a tick after which nothing changed plans nothing."""

from __future__ import annotations

import dagster as dg
import pytest

from kts_assets.assets import local_and_remote_segments, local_segments, remote_log_index, remote_segments, retention_state
from kts_assets.checks import RETENTION_COMPLETED
from kts_assets.definitions import defs
from kts_resources.tiering import batch_plans  # where the sensor's plans are made (many partitions' store rows at once)
from kts_assets.sensors.retention import retention_sensor
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.tiers import locate_partitions

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .test_assets import instance, kts_home, partition_metadata, pipeline_resources  # noqa: F401

pytestmark = pytest.mark.spark
KEY = "orders-0"
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.fixture
def log_dir(tmp_path):
    """Records 20 s apart, so segments' largest timestamps are minutes apart: retention.ms can fall between them."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=11, topics=("orders", "page.views"), partitions=2, total_bytes=160 * 1024,
                                    segment_bytes=16 * 1024, messages_per_second=0.05))
    return root


def _retention_between(older, newer) -> int:
    """retention.ms whose cutoff, now, falls halfway between two segments' largest timestamps."""
    import time

    return int(time.time() * 1000) - (older.max_timestamp_ms + newer.max_timestamp_ms) // 2


def latest_metadata(instance, asset: str) -> dict:
    """What the UI shows of ``asset``'s KEY now: the metadata of its latest materialisation or observation."""
    records = [record for fetch in (instance.fetch_materializations, instance.fetch_observations)
               for record in fetch(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[KEY]), limit=1).records]
    latest = max(records, key=lambda record: record.storage_id)
    return {label: value.value for label, value in (latest.asset_materialization or latest.asset_observation).metadata.items()}


def assert_the_ui_shows_status(instance, store, log_dir, monkeypatch, changed_by: str) -> dict:
    """remote_segments' and local_segments' latest metadata of KEY are `kts status --json`'s row
    (computed by the same function); that row."""
    from kts_assets.assets.reporting import LOCAL_METADATA, TIER_METADATA
    from kts_resources.tiering.status import STATUS_FIELDS, status_rows_and_lost

    monkeypatch.setenv("KTS_LOG_DIRS", str(log_dir))
    [row] = [row for row, _lost in status_rows_and_lost(store) if f"{row['topic']}-{row['partition']}" == KEY]
    remote, local = latest_metadata(instance, "remote_segments"), latest_metadata(instance, "local_segments")
    assert {name: remote[name] for name in TIER_METADATA if name in STATUS_FIELDS} == \
           {name: row[name] for name in TIER_METADATA if name in STATUS_FIELDS}
    assert {label: local[label] for label, name in LOCAL_METADATA.items() if name in STATUS_FIELDS} == \
           {label: row[name] for label, name in LOCAL_METADATA.items() if name in STATUS_FIELDS}
    assert remote["changed_by"] == local["changed_by"] == changed_by
    return row


def _finished(pg_url):
    store = RemoteLogMetadataStore.from_url(pg_url)
    tip = next(t for t in store.partitions() if t.topic_partition.dir_name == KEY)
    return store, tip, sorted(store.list_remote_log_segments(tip, states={FINISHED}), key=lambda m: m.start_offset)


@pytest.mark.parametrize("planned_by", ["driver", "spark"])
def test_retention_state_expires_the_oldest_segments_in_both_tiers(log_dir, pg_url, tmp_path, kts_home, instance, planned_by,  # noqa: F811
                                                                   monkeypatch):
    """A run of few partitions is planned on the driver; from spark_plan_min_partitions on, by a
    Spark job (forced here with a minimum of one): the same plan and the same deletions."""
    from kts_resources.spark import retention_job as spark_retention

    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote", owned=True)
    minimum = 1 if planned_by == "spark" else 2
    run_config = {"ops": {"retention_state": {"config": {"spark_plan_min_partitions": minimum}}}}
    spark_jobs: list[list[str]] = []
    real_job = spark_retention.plan_partitions_job
    monkeypatch.setattr(spark_retention, "plan_partitions_job", lambda spark, keys, **kw: spark_jobs.append(keys) or real_job(spark, keys, **kw))
    assert dg.materialize([local_and_remote_segments], partition_key=KEY, instance=instance, resources=resources).success
    store, tip, finished = _finished(pg_url)
    assert len(finished) >= 3
    # retention.ms that puts exactly the two oldest segments' largest timestamps past it, now.
    store.set_topic_config("orders", "retention.ms", _retention_between(finished[1], finished[2]))
    result = dg.materialize([retention_state, remote_log_index], partition_key=KEY, instance=instance,
                            resources=resources, run_config=run_config)
    assert result.success
    assert spark_jobs == ([[KEY]] if planned_by == "spark" else [])
    md = partition_metadata(result, "retention_state")[KEY]
    assert md["remote_segments_to_expire"] == md["remote_segments_deleted"] == 2
    assert md["log_start_offset"] == finished[2].start_offset == store.partition_state(tip).log_start_offset
    assert md["local_segments_deleted"] == 2 and md["retention_failed"] == 0
    assert "past retention" in md["size"]
    assert md["delete_lag_segments"] == 0 and md["delete_lag_bytes"] == 0  # what was to go went
    # Both tiers are reported again by the step that changed them: the UI shows what `kts status` shows.
    row = assert_the_ui_shows_status(instance, store, log_dir, monkeypatch, f"retention_state run {result.run_id}")
    assert row["remote_segments"] == len(finished) - 2 and row["log_start_offset"] == finished[2].start_offset
    assert [m.start_offset for m in store.list_remote_log_segments(tip, states={FINISHED})] == [m.start_offset for m in finished[2:]]
    assert not (log_dir / KEY / f"{finished[0].start_offset:020d}.log").exists()
    assert partition_metadata(result, "remote_log_index")[KEY]["indexed_segments"] == len(finished) - 2
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "retention_completed"]
    assert check.passed
    # The check runs alone too (the UI's "execute check"): judged on the latest pass, nothing expired again.
    alone = dg.materialize([retention_state], instance=instance, resources=resources, tags={"dagster/partition": KEY},
                           selection=dg.AssetSelection.checks(RETENTION_COMPLETED))
    [again] = alone.get_asset_check_evaluations()
    assert again.passed and again.check_name == "retention_completed" and not alone.get_asset_materialization_events()
    assert again.target_materialization_data.run_id == result.run_id
    store.close()


def test_an_expiry_of_every_remote_segment_beside_a_broker_shows_in_the_ui_as_kts_status_says(
        log_dir, pg_url, tmp_path, kts_home, instance, monkeypatch):  # noqa: F811
    """The demo's case: a broker-owned log dir keeps its segments, the remote tier loses all of
    them. The UI must not keep the copy's 'N remote segments', remote log start 0, segments
    'eligible' or a delete lag of what is gone."""
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote", owned=False)
    assert dg.materialize([local_and_remote_segments], partition_key=KEY, instance=instance, resources=resources).success
    store, tip, finished = _finished(pg_url)
    assert latest_metadata(instance, "remote_segments")["remote_segments"] == len(finished) > 0
    store.set_topic_config("orders", "retention.ms", 1)  # every segment's records are past it
    result = dg.materialize([retention_state], partition_key=KEY, instance=instance, resources=resources)
    assert result.success
    row = assert_the_ui_shows_status(instance, store, log_dir, monkeypatch, f"retention_state run {result.run_id}")
    assert (row["remote_segments"], row["remote_bytes"], row["remote_log_start_offset"]) == (0, 0, -1)
    assert row["local_segments"] > 0 and row["log_start_offset"] == finished[-1].end_offset + 1
    # What the broker keeps lies below the log start offset now: no segment is eligible any more.
    local = latest_metadata(instance, "local_segments")
    assert local["eligible_segments"] == local["eligible_bytes"] == 0 and local["log_start_offset"] == row["log_start_offset"]
    md = partition_metadata(result, "retention_state")[KEY]
    assert md["remote_segments_deleted"] == len(finished) and md["delete_lag_bytes"] == md["delete_lag_segments"] == 0
    assert md["log_start_offset"] == row["log_start_offset"]
    store.close()


def test_the_retention_sensor_requests_runs_only_where_something_expires(log_dir, pg_url, tmp_path, kts_home, instance, monkeypatch):  # noqa: F811
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    assert dg.materialize([local_and_remote_segments], instance=instance, resources=resources,
                          tags={"dagster/asset_partition_range_start": "orders-0",
                                "dagster/asset_partition_range_end": "page.views-0"}).success
    store, tip, finished = _finished(pg_url)
    store.set_topic_config("orders", "retention.ms", _retention_between(finished[0], finished[1]))
    store.set_topic_config("page.views", "retention.ms", -1)  # its 2023 records would pass the 7-day default
    planned: list[str] = []
    real = batch_plans.plan_partition
    monkeypatch.setattr(batch_plans, "plan_partition", lambda loc, tip, *a, **k: planned.append(tip.topic_partition.dir_name) or real(loc, tip, *a, **k))
    sensor_resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir)),
                        "metadata_store": MetadataStoreResource(database_url=pg_url)}
    with dg.build_sensor_context(instance=instance, resources=sensor_resources, definitions=defs) as context:
        first = retention_sensor.evaluate_tick(context)
    requested = [(r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"]) for r in first.run_requests]
    assert requested == [("orders-0", "orders-1")]  # page.views-0 keeps everything
    assert sorted(planned) == ["orders-0", "orders-1", "page.views-0"]  # the first tick plans every partition
    planned.clear()
    with dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=first.cursor, definitions=defs) as context:
        second = retention_sensor.evaluate_tick(context)
    assert planned == [] and second.run_requests == []  # nothing changed, nothing due: no planning at all
    store.close()


def test_the_definitions_hold_retention_state_expiry_job_and_the_retention_sensor():
    repo = defs.get_repository_def()
    assert "retention_state" in {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert defs.resolve_job_def("expiry_job").name == "expiry_job"
    assert "retention_sensor" in {s.name for s in repo.sensor_defs}
