"""A partition's failure stays that partition's (issue 31 item 2). In one run of copy_job's steps
over two partitions, one of which holds a segment with a batch that fails its CRC:

- the failed partition's latest copy_completed result is a failure whose description names the
  file, the byte and what is wrong, and the partitions view shows that partition failed;
- the run fails once, not retried, and its failure message says the partition and its cause on
  one line, with no traceback and no Dagster class in it;
- the healthy partition of the same run gets its retention_state and remote_log_index.

Each is read from the instance where the UI reads it: the check's latest execution per partition,
the partitions' status, the run's RUN_FAILURE event, each asset partition's latest materialisation."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from kts_assets.assets import local_and_remote_segments, remote_log_index, retention_state
from kts_assets.asset_keys import REMOTE_LOG_INDEX, REMOTE_SEGMENTS, RETENTION_STATE
from kts_assets.checks import COPY_COMPLETED
from kts_assets.partition_outcome import FAILED_PARTITIONS
from kts_assets.partitions import topic_partitions
from kts_resources.kafka.segment import verify_segment_file
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .test_assets import RANGE_END, RANGE_START, eligible, pipeline_resources

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

FAILED, HEALTHY = "page.views-0", "page.views-1"


@pytest.fixture
def kts_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "kts_home"))


@pytest.fixture
def corrupt_run(tmp_path, pg_url, kts_home):
    """(instance, the run's id, the corrupt segment's expected cause): one ranged run of copy_job's
    steps over both partitions, one byte of a closed segment of FAILED flipped first."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=11, topics=("page.views",), partitions=2,
                                       total_bytes=160 * 1024, segment_bytes=16 * 1024))
    victim = eligible(log_dir, FAILED)[1].log  # closed and below the high watermark: the copy takes it
    data = bytearray(victim.read_bytes())
    flipped = len(data) // 2
    data[flipped] ^= 0x20
    victim.write_bytes(bytes(data))
    position, problem = verify_segment_file(victim).problem
    assert position <= flipped  # the batch holding the flipped byte
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, [FAILED, HEALTHY])
        result = dg.materialize([local_and_remote_segments, retention_state, remote_log_index], instance=instance,
                                resources=pipeline_resources(log_dir, pg_url, tmp_path / "remote"),
                                tags={RANGE_START: FAILED, RANGE_END: HEALTHY}, raise_on_error=False)
        yield instance, result.run_id, f"{victim}: byte {position}: {problem}"


def latest_copy_completed(instance: dg.DagsterInstance, partition: str):
    return instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [COPY_COMPLETED], partition_filter=PartitionKeyFilter(key=partition))[COPY_COMPLETED]


def test_the_failed_partitions_latest_check_result_names_the_file_byte_and_cause(corrupt_run):
    instance, run_id, cause = corrupt_run
    failed, healthy = latest_copy_completed(instance, FAILED), latest_copy_completed(instance, HEALTHY)
    assert (failed.run_id, failed.status) == (run_id, AssetCheckExecutionRecordStatus.FAILED)
    assert cause in failed.event.dagster_event.event_specific_data.description
    assert (healthy.run_id, healthy.status) == (run_id, AssetCheckExecutionRecordStatus.SUCCEEDED)


def test_the_partitions_view_shows_the_failed_partition_failed_and_the_other_materialised(corrupt_run):
    instance, _, _ = corrupt_run
    assert instance.get_status_by_partition(REMOTE_SEGMENTS, [FAILED, HEALTHY], topic_partitions) == {
        FAILED: dg.AssetPartitionStatus.FAILED, HEALTHY: dg.AssetPartitionStatus.MATERIALIZED}


def test_the_runs_failure_message_is_one_line_per_failed_partition_with_its_cause_and_not_retried(corrupt_run):
    instance, run_id, cause = corrupt_run
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
    [record] = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    failure = record.event_log_entry.dagster_event.job_failure_data
    header, *lines = failure.error.message.strip().splitlines()
    assert header == "kts_assets.partition_outcome.PartitionsFailed: 1 partition of the run failed:"
    assert len(lines) == 1 and lines[0].startswith(f"{FAILED}: copy_completed failed: ") and cause in lines[0], lines
    assert "Traceback" not in failure.error.message and "dagster" not in failure.error.message
    metadata = failure.first_step_failure_event.step_failure_data.user_failure_data.metadata
    assert list(metadata[FAILED_PARTITIONS].value) == [FAILED]
    retried = instance.get_records_for_run(run_id, of_type={dg.DagsterEventType.STEP_UP_FOR_RETRY,
                                                            dg.DagsterEventType.STEP_RESTARTED}).records
    assert retried == []  # a partition's bad segment is not the store or the bucket briefly away


def test_the_healthy_partition_of_the_run_gets_its_retention_and_remote_log_index(corrupt_run):
    instance, run_id, _ = corrupt_run
    for asset in (REMOTE_SEGMENTS, RETENTION_STATE, REMOTE_LOG_INDEX):
        [latest] = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset, asset_partitions=[HEALTHY]),
                                                   limit=1).records
        assert latest.run_id == run_id, asset
    copied = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=REMOTE_SEGMENTS, asset_partitions=[HEALTHY]),
                                             limit=1).records[0].asset_materialization.metadata
    assert copied["copy_failed"].value == 0 and copied["copied_segments"].value > 0
    index = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=REMOTE_LOG_INDEX, asset_partitions=[HEALTHY]),
                                            limit=1).records[0].asset_materialization.metadata
    assert index["indexed_segments"].value == copied["remote_segments"].value > 0
