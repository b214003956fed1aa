"""The pipeline's assets, materialised through Dagster against a simulated broker log dir, embedded
PostgreSQL and a filesystem remote tier: ``local_segments`` stores Spark's inventory as Parquet and
reports each partition's offsets and sizes; ``remote_segments`` copies exactly the eligible
segments and reports both tiers; one run covers many partitions with one Spark step."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import materializations
from kts_assets.asset_keys import REMOTE_TIER
from kts_assets.assets import local_and_remote_segments, local_segments, remote_log_index, remote_segments, retention_state
from kts_assets.assets.reporting import run_totals
from kts_assets.definitions import defs
from kts_assets.jobs import copy_job
from kts_assets.partitions import topic_partitions
from kts_resources.spark.inventory import inventory_path
from kts_resources.kafka.checkpoints import PartitionMetadata, read_offset_checkpoint, write_partition_metadata
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.resources import (
    CopyQuotaResource,
    KafkaLogDirsResource,
    MetadataStoreResource,
    RemoteTierResource,
    spark_resource,
)

from .test_copier import _eligible as eligible_segments

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

# One local session for the whole test run: getOrCreate hands every run the same JVM.
SPARK = spark_resource()  # Spark Connect: the session's server (tests/fixtures_spark.py)
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
KEYS = ["orders-0", "orders-1", "page.views-0"]


def simulate_log_dir(root: Path, total_bytes: int = 160 * 1024) -> Path:
    simulate(root, SimulationConfig(seed=11, topics=("orders", "page.views"), partitions=2,
                                    total_bytes=total_bytes, segment_bytes=16 * 1024))
    return root


def pipeline_resources(log_dir: Path, pg_url: str, remote_dir: Path, owned: bool = False) -> dict[str, object]:
    return {
        "kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir), owned_log_dirs=str(log_dir) if owned else ""),
        "metadata_store": MetadataStoreResource(database_url=pg_url),
        "remote_tier": RemoteTierResource(remote_uri=remote_dir.as_uri()),
        "copy_quota": CopyQuotaResource(),
        "pyspark": SPARK,
    }


def eligible(log_dir: Path, key: str) -> list:
    """What the copy rule allows for one partition: closed and wholly below min(HW, recovery point)."""
    return eligible_segments(log_dir)[key]


def partition_metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, dict]:
    """partition key → {label: raw value} of the run's materialisations of ``asset``."""
    return {m.partition: {k: v.value for k, v in m.metadata.items()} for m in materializations(result, asset)}


@pytest.fixture
def kts_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "kts_home"
    monkeypatch.setenv("KTS_HOME", str(home))
    return home


@pytest.fixture
def log_dir(tmp_path) -> Path:
    return simulate_log_dir(tmp_path / "logs")


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, KEYS)
        yield instance


def test_definitions_hold_the_assets_checks_job_sensors_schedule_and_every_resource():
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} >= {"local_segments", "remote_segments"}
    assert {k.name for k in repo.asset_graph.asset_check_keys} >= {
        "offset_invariants", "local_segments_crc_clean", "remote_segments_in_bucket", "no_uncopied_segment_lost"}
    assert defs.resolve_job_def("copy_job").name == copy_job.name
    assert {s.name for s in repo.sensor_defs} >= {"partition_discovery_sensor", "segment_roll_sensor"}
    assert {s.name for s in repo.schedule_defs} >= {"reconcile_schedule"}
    assert set(defs.resources) >= {"kafka_log_dirs", "metadata_store", "remote_tier", "copy_quota", "pyspark"}


def test_local_segments_stores_the_inventory_and_reports_the_partitions_offsets(log_dir, pg_url, tmp_path, kts_home, instance):
    result = dg.materialize([local_and_remote_segments], selection=[local_segments.key], partition_key="orders-0", instance=instance,
                            resources=pipeline_resources(log_dir, pg_url, tmp_path / "remote"))
    assert result.success
    md = partition_metadata(result, "local_segments")["orders-0"]
    partition = next(p for p in LogDir(log_dir).partitions() if p.topic_partition.dir_name == "orders-0")
    segments = partition.segments()
    assert md["segments"] == len(segments) > 3
    assert md["local_bytes"] == sum(s.log.stat().st_size for s in segments)
    assert md["crc_failures"] == 0
    hw = read_offset_checkpoint(log_dir / "replication-offset-checkpoint")[partition.topic_partition]
    assert md["local_log_start_offset"] == segments[0].base_offset <= md["high_watermark"] == hw <= md["log_end_offset"]
    assert md["eligible_segments"] == len(eligible(log_dir, "orders-0"))
    assert md["eligible_bytes"] == sum(s.log.stat().st_size for s in eligible(log_dir, "orders-0"))
    parquet = inventory_path("orders-0")
    assert parquet.is_dir() and parquet.is_relative_to(kts_home) and any(parquet.glob("*.parquet"))
    from kts_resources.spark.session import build_spark_session

    stored = build_spark_session().read.parquet(str(parquet))  # the run's own session
    rows = stored.collect()
    assert sorted(r.base_offset for r in rows) == [s.base_offset for s in segments]
    # The UI's table view: the Parquet files' own columns and the partition's row count.
    assert [c.name for c in md["dagster/column_schema"].columns] == stored.columns
    assert md["dagster/row_count"] == len(rows)
    assert "KiB local" in md["size"]


def test_a_second_inventory_scans_only_what_was_written_since_unless_asked_to_rescan(log_dir, pg_url, tmp_path, kts_home, instance):
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")

    def inventory(**config) -> tuple[int, int]:
        """(segments scanned, segments unchanged): run totals, so on the run (its log), not on the partition."""
        run_config = {"ops": {"local_and_remote_segments": {"config": config}}} if config else None
        result = dg.materialize([local_and_remote_segments], selection=[local_segments.key], partition_key="orders-0", instance=instance, resources=resources, run_config=run_config)
        assert result.success
        assert "segments_scanned" not in materializations(result, "local_segments")[-1].metadata
        totals = run_totals(instance, result.run_id)
        return totals["segments_scanned"], totals["segments_unchanged"]

    segments = next(p for p in LogDir(log_dir).partitions() if p.topic_partition.dir_name == "orders-0").segments()
    assert inventory() == (len(segments), 0)
    stored = kts_home / "inventory" / "local_segments" / "orders-0.parquet"
    written = stored.stat().st_mtime_ns
    assert inventory() == (0, len(segments))  # not a byte written: the inventory stands as it was
    assert stored.stat().st_mtime_ns == written
    [active] = [s for s in segments if s.active]
    with open(active.log, "ab") as f:
        f.write(b"\0" * 12)  # the broker appends (a partial batch, as mid-write)
    assert inventory() == (1, len(segments) - 1)  # the active one
    assert inventory(rescan_unchanged=True) == (len(segments), 0)


def test_remote_segments_copies_exactly_the_eligible_segments_and_reports_both_tiers(log_dir, pg_url, tmp_path, kts_home, instance):
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    result = dg.materialize([local_and_remote_segments], partition_key="orders-1", instance=instance, resources=resources)
    assert result.success
    md = partition_metadata(result, "remote_segments")["orders-1"]
    wanted = eligible(log_dir, "orders-1")
    assert md["copied_segments"] == md["remote_segments"] == len(wanted) > 0
    assert md["copied_bytes"] == md["remote_bytes"] == sum(s.log.stat().st_size for s in wanted)
    assert md["remote_log_start_offset"] == wanted[0].base_offset
    assert md["remote_log_end_offset"] == wanted[-1].next_base_offset - 1 <= md["high_watermark"]
    assert md["copy_lag_segments"] == md["copy_lag_bytes"] == 0 and md["copy_failed"] == 0
    assert md["throttle_time_ms"] == 0 and md["manifests_backfilled"] == 0  # every copy wrote its manifest

    # A second run has nothing new to copy, and says so.
    again = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-1", instance=instance, resources=resources)
    md = partition_metadata(again, "remote_segments")["orders-1"]
    assert md["copied_segments"] == 0 and md["remote_segments"] == len(wanted)


def test_a_partition_dir_whose_topic_id_disagrees_with_its_siblings_is_not_copied_and_fails_its_copy(
        pg_url, tmp_path, kts_home, instance):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=11, topics=("orders",), partitions=3, total_bytes=144 * 1024, segment_bytes=16 * 1024))
    stray_id = uuid.uuid4()
    write_partition_metadata(root / "orders-1" / "partition.metadata", PartitionMetadata(0, stray_id))
    instance.add_dynamic_partitions(topic_partitions.name, ["orders-2"])
    result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], instance=instance, resources=pipeline_resources(root, pg_url, tmp_path / "remote"),
                            tags={RANGE_START: "orders-0", RANGE_END: "orders-2"}, raise_on_error=False)
    md = partition_metadata(result, "remote_segments")
    assert md["orders-0"]["copied_segments"] > 0 and md["orders-2"]["copied_segments"] > 0
    assert "copied_segments" not in md["orders-1"]
    assert str(root / "orders-1") in md["orders-1"]["skipped"] and str(stray_id) in md["orders-1"]["skipped"]
    # Not a success for that partition: its copy_completed check fails on it (and the run fails at
    # its end), and `kts sync` exits 1.
    assert md["orders-1"]["copy_failed"] == 1 and str(stray_id) in md["orders-1"]["copy_error"]
    completed = {e.partition: e.passed for e in result.get_asset_check_evaluations() if e.check_name == "copy_completed"}
    assert (completed["orders-0"], completed["orders-1"], completed["orders-2"]) == (True, False, True)
    assert not result.success
    warnings = [e.user_message for e in instance.all_logs(result.run_id)
                if e.level == logging.WARNING and str(stray_id) in e.user_message]
    assert len(warnings) == 1 and "not copied" in warnings[0]


def test_a_partition_dir_whose_topic_id_is_not_its_siblings_is_reported_and_not_copied(pg_url, tmp_path, kts_home, instance,
                                                                                       metadata_store):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=9, topics=("orders",), partitions=3, total_bytes=144 * 1024, segment_bytes=24 * 1024))
    siblings_id = LogDir(root).partitions()[0].metadata().topic_id
    stray_id = uuid.uuid4()
    write_partition_metadata(root / "orders-2" / "partition.metadata", PartitionMetadata(0, stray_id))
    instance.add_dynamic_partitions(topic_partitions.name, ["orders-2"])
    result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], instance=instance,
                            resources=pipeline_resources(root, pg_url, tmp_path / "remote"),
                            tags={RANGE_START: "orders-0", RANGE_END: "orders-2"}, raise_on_error=False)
    md = partition_metadata(result, "remote_segments")
    assert md["orders-0"]["copied_segments"] and md["orders-1"]["copied_segments"]
    stray = md["orders-2"]
    assert "copied_segments" not in stray and str(root / "orders-2") in stray["skipped"]
    assert str(stray_id) in stray["skipped"] and str(siblings_id) in stray["skipped"]
    # The one warning about this log dir's partitions is the stray's (page.views-0, in the instance's
    # range, is in no log dir here).
    assert [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING] == [
        "page.views-0: in none of the log dirs; nothing copied", stray["skipped"]]
    stray_tp = LogDir(root).partitions()[2].topic_partition
    assert metadata_store.list_remote_log_segments(TopicIdPartition(stray_id, stray_tp)) == []


def test_copy_lag_counts_eligible_segments_not_yet_copied(log_dir, pg_url, tmp_path, kts_home, instance):
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    dg.materialize([local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0", instance=instance, resources=resources)
    simulate_log_dir(log_dir, total_bytes=96 * 1024)  # the broker appends and rolls on
    result = dg.materialize([local_and_remote_segments], selection=[local_segments.key], partition_key="orders-0", instance=instance, resources=resources)
    local = partition_metadata(result, "local_segments")["orders-0"]
    store = MetadataStoreResource(database_url=pg_url).store()
    partition = next(p for p in LogDir(log_dir).partitions() if p.topic_partition.dir_name == "orders-0")
    tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
    copied = store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
    assert local["eligible_segments"] > len(copied)
    second = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0", instance=instance, resources=resources)
    md = partition_metadata(second, "remote_segments")["orders-0"]
    assert md["copied_segments"] == local["eligible_segments"] - len(copied)
    assert md["remote_segments"] == local["eligible_segments"] and md["copy_lag_segments"] == 0


def test_one_run_scans_and_copies_many_partitions_in_one_spark_step(log_dir, pg_url, tmp_path, kts_home, instance):
    job = dg.Definitions(assets=[local_and_remote_segments, retention_state, remote_log_index], jobs=[copy_job],
                         resources=pipeline_resources(log_dir, pg_url, tmp_path / "remote")).resolve_job_def("copy_job")
    result = job.execute_in_process(instance=instance, tags={RANGE_START: KEYS[0], RANGE_END: KEYS[-1]})
    assert result.success
    steps = [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"]
    # One step each, whatever the partition count; the inventory scans while the copy runs, in one.
    assert steps == ["local_and_remote_segments", "retention_state", "remote_log_index"]
    local = partition_metadata(result, "local_segments")
    remote = partition_metadata(result, "remote_segments")
    assert set(local) == set(remote) == set(KEYS)
    # Run totals are the run's (a line of its log), never repeated on each partition, nor a tag each:
    # the run's row in the UI shows at most 4 of kts's tags.
    assert not any("partitions_in_run" in md for md in [*local.values(), *remote.values()])
    totals = run_totals(instance, result.run_id)
    assert totals["partitions_in_run"] == len(KEYS) and totals["partitions_failed"] == 0
    kts_tags = {name for name in instance.get_run_by_id(result.run_id).tags if name.startswith("kts/")}
    assert kts_tags == {"kts/trigger", "kts/process"}
    # What the run did to the whole tier is one observation of remote_tier, a point on its plots.
    [tier] = [o for o in result.asset_observations_for_node("local_and_remote_segments") if o.asset_key == REMOTE_TIER]
    assert tier.metadata["copied_bytes"].value == sum(md["copied_bytes"] for md in remote.values()) > 0
    assert tier.metadata["partitions"].value == len(KEYS) and tier.metadata["partitions_failed"].value == 0
    assert "KiB copied by this run over 3 partitions" in tier.metadata["size"].value
    for key in KEYS:
        wanted = eligible(log_dir, key)
        assert remote[key]["remote_bytes"] == remote[key]["copied_bytes"] == sum(s.log.stat().st_size for s in wanted)
        assert local[key]["eligible_segments"] == remote[key]["copied_segments"] == len(wanted)
        assert inventory_path(key).is_dir()


def test_a_copy_that_cannot_start_fails_the_step_but_the_inventory_scanned_beside_it_is_kept(
        log_dir, pg_url, tmp_path, kts_home, instance):
    """The two assets share a step. A metadata store that does not answer fails the copy (and the
    step, after its retries), while the inventory that ran beside it still lands."""
    resources = {**pipeline_resources(log_dir, pg_url, tmp_path / "remote"),
                 "metadata_store": MetadataStoreResource(database_url="postgresql://kts@127.0.0.1:1/nowhere")}
    result = dg.materialize([local_and_remote_segments], instance=instance, raise_on_error=False, resources=resources,
                            tags={RANGE_START: "orders-0", RANGE_END: "orders-1"})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    error, said = failure.step_failure_data.error, []
    while error is not None:
        said.append(error.message)
        error = error.cause or error.context
    assert any("metadata store at 127.0.0.1:1/nowhere is unreachable" in m for m in said), said
    local = partition_metadata(result, "local_segments")
    assert set(local) == {"orders-0", "orders-1"} and all(md["segments"] > 0 for md in local.values())
    assert inventory_path("orders-0").is_dir()
    assert not materializations(result, "remote_segments")


def test_a_corrupt_segment_stops_only_its_own_partition(log_dir, pg_url, tmp_path, kts_home, instance):
    victim = eligible(log_dir, "orders-0")[1].log
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    result = dg.materialize([local_and_remote_segments], instance=instance,
                            resources=pipeline_resources(log_dir, pg_url, tmp_path / "remote"),
                            tags={RANGE_START: "orders-0", RANGE_END: "orders-1"}, raise_on_error=False)
    local = partition_metadata(result, "local_segments")
    remote = partition_metadata(result, "remote_segments")
    assert local["orders-0"]["crc_failures"] >= 1 and local["orders-1"]["crc_failures"] == 0
    assert remote["orders-0"]["copy_failed"] == 1 and remote["orders-0"]["copied_segments"] == 1
    assert "fails its CRC" in remote["orders-0"]["copy_error"]
    assert remote["orders-1"]["copy_failed"] == 0 and remote["orders-1"]["copied_segments"] == len(eligible(log_dir, "orders-1"))
    # Both assets are materialised for both partitions; the step fails on orders-0's checks alone.
    failed = {(e.check_name, e.partition) for e in result.get_asset_check_evaluations() if not e.passed}
    assert failed == {("local_segments_crc_clean", "orders-0"), ("copy_completed", "orders-0")} and not result.success


def test_remote_segments_copies_to_an_s3_tier_through_dagster_aws(log_dir, pg_url, tmp_path, kts_home, instance, s3_endpoint, s3_bucket, s3_client):
    tier = RemoteTierResource(remote_uri=f"s3://{s3_bucket}/tiered", s3_endpoint_url=s3_endpoint)
    assert type(tier.storage()).__name__ == "S3RemoteStorage"
    resources = {**pipeline_resources(log_dir, pg_url, tmp_path / "remote"), "remote_tier": tier}
    result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], partition_key="page.views-0", instance=instance, resources=resources)
    md = partition_metadata(result, "remote_segments")["page.views-0"]
    wanted = eligible(log_dir, "page.views-0")
    assert md["copied_segments"] == len(wanted) > 0 and md["copy_failed"] == 0
    listed = [o for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="tiered/")
              for o in page.get("Contents", [])]
    assert sum(o["Size"] for o in listed if o["Key"].endswith(".log")) == md["remote_bytes"] == sum(s.log.stat().st_size for s in wanted)


def test_the_metadata_store_resource_keeps_one_migrated_store_per_process(pg_url):
    first = MetadataStoreResource(database_url=pg_url).store()
    assert MetadataStoreResource(database_url=pg_url).store() is first
    assert first.partitions() == []  # migrated: the tables are there


def test_the_copy_quota_throttles_a_run_and_reports_the_time_waited(log_dir, pg_url, tmp_path, kts_home, instance):
    # 12 KiB/s over 2 one-second windows admits 24 KiB at once: more than a segment, less than the partition.
    quota = CopyQuotaResource(copy_max_bytes_per_second=12 * 1024, window_num=2, window_size_seconds=1)
    resources = {**pipeline_resources(log_dir, pg_url, tmp_path / "remote"), "copy_quota": quota}
    result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0", instance=instance, resources=resources)
    md = partition_metadata(result, "remote_segments")["orders-0"]
    assert md["copied_bytes"] == sum(s.log.stat().st_size for s in eligible(log_dir, "orders-0")) > 24 * 1024
    assert md["throttle_time_ms"] > 0


def test_partitions_copied_in_parallel_report_the_same_as_one_at_a_time(log_dir, pg_url, tmp_path, kts_home, instance):
    result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], instance=instance, resources=pipeline_resources(log_dir, pg_url, tmp_path / "remote"),
                            tags={RANGE_START: KEYS[0], RANGE_END: KEYS[-1]},
                            run_config={"ops": {"local_and_remote_segments": {"config": {"parallel_partitions": 3}}}})
    remote = partition_metadata(result, "remote_segments")
    for key in KEYS:
        assert remote[key]["copied_segments"] == remote[key]["remote_segments"] == len(eligible(log_dir, key))
