"""Asset checks on a simulated log dir: all pass on a healthy partition copied to a filesystem tier;
a flipped bit in a local segment fails the CRC check; a remote object removed or rewritten fails the
bucket check; a segment the broker deleted before kts copied it raises the data-loss alarm; a
multi-partition run records one evaluation per partition; a deleted .index in a broker-owned log dir
fails the local index check naming the file and how to repair it."""

from __future__ import annotations

import dagster as dg
import pytest

from tests.conftest import materializations
from kts_assets.assets import local_and_remote_segments, local_segments, remote_log_index, remote_segments, retention_state
from kts_assets.checks import (
    LOCAL_INDEXES_WHOLE,
    NO_UNCOPIED_SEGMENT_LOST,
    REMOTE_INDEX_CHECK_SPECS,
    REMOTE_SEGMENTS_IN_BUCKET,
    RETENTION_CHECK_SPECS,
    SEGMENTS_CHECK_SPECS,
)
from kts_assets.partitions import topic_partitions
from kts_resources.kafka.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from kts_resources.kafka.logdir import LogDir

from .test_assets import KEYS, RANGE_END, RANGE_START, eligible, pipeline_resources, simulate_log_dir

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)


@pytest.fixture
def kts_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "kts_home"))


@pytest.fixture
def log_dir(tmp_path):
    return simulate_log_dir(tmp_path / "logs")


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, KEYS)
        yield instance


def run(log_dir, pg_url, tmp_path, instance, assets, **kwargs) -> dg.ExecuteInProcessResult:
    return dg.materialize(assets, instance=instance, resources=pipeline_resources(log_dir, pg_url, tmp_path / "remote"),
                          raise_on_error=False, **kwargs)


# Every check is a check spec of its asset's step.
CHECK_KEYS = [spec.key for spec in SEGMENTS_CHECK_SPECS + RETENTION_CHECK_SPECS + REMOTE_INDEX_CHECK_SPECS]


def check_only(log_dir, pg_url, tmp_path, instance, check: dg.AssetCheckKey, partition_key: str) -> dg.AssetCheckEvaluation:
    """Run one of remote_segments' checks on its own (its asset left as it is, the other checks of
    its step not run) and return its one evaluation."""
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments],
                 selection=dg.AssetSelection.checks(check), tags={"dagster/partition": partition_key})
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def verdicts(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str | None], bool]:
    return {(e.check_name, e.partition): e.passed for e in result.get_asset_check_evaluations()}


def test_every_check_passes_on_a_healthy_partition(log_dir, pg_url, tmp_path, kts_home, instance):
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments, retention_state, remote_log_index], partition_key="orders-0")
    assert result.success
    assert verdicts(result) == {(key.name, "orders-0"): True for key in CHECK_KEYS}
    assert len(CHECK_KEYS) == 8


def test_a_flipped_bit_in_a_local_segment_fails_the_crc_check(log_dir, pg_url, tmp_path, kts_home, instance):
    victim = eligible(log_dir, "orders-0")[1].log
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=dg.AssetSelection.assets(local_segments.key), partition_key="orders-0")
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {"local_segments_crc_clean", LOCAL_INDEXES_WHOLE.name}  # local_segments' two checks
    assert evaluations[LOCAL_INDEXES_WHOLE.name].passed  # a flipped bit leaves the index files whole
    evaluation = evaluations["local_segments_crc_clean"]
    assert not evaluation.passed and str(victim) in evaluation.description
    assert evaluation.metadata["first_unhealthy_base_offset"].value == eligible(log_dir, "orders-0")[1].base_offset


def test_a_deleted_index_in_a_broker_owned_log_dir_fails_the_local_index_check_naming_the_file(
        log_dir, pg_url, tmp_path, kts_home, instance):
    segment = eligible(log_dir, "orders-1")[0]
    segment.offset_index.unlink()  # the demo's log dir: the broker's, not in KTS_OWNED_LOG_DIRS
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments],
                 tags={"dagster/asset_partition_range_start": "orders-0", "dagster/asset_partition_range_end": "orders-1"})
    evaluations = {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == LOCAL_INDEXES_WHOLE.name}
    assert evaluations["orders-0"].passed
    failed = evaluations["orders-1"]
    assert not failed.passed and failed.asset_key == local_segments.key
    assert failed.description.startswith(f"{segment.offset_index}: the offset index is missing; ")
    assert "kts does not write broker-owned log dirs" in failed.description
    assert f"`kts index rebuild {segment.log}`" in failed.description and "KTS_OWNED_LOG_DIRS" in failed.description
    assert failed.metadata["first_index_problem"].value == f"{segment.offset_index}: the offset index is missing"
    assert failed.metadata["owned_log_dir"].value is False
    assert not segment.offset_index.exists()  # kts never writes there


def test_a_missing_or_rewritten_remote_object_fails_the_bucket_check_until_the_next_copy_recopies_it(
        log_dir, pg_url, tmp_path, kts_home, instance):
    run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0")
    logs = sorted((tmp_path / "remote").rglob("*.log"))
    logs[0].unlink()
    logs[1].write_bytes(b"x" * logs[1].stat().st_size)  # same size, other bytes: only the CRC tells
    evaluation = check_only(log_dir, pg_url, tmp_path, instance, REMOTE_SEGMENTS_IN_BUCKET, "orders-0")
    assert not evaluation.passed
    assert "missing" in evaluation.description and "CRC" in evaluation.description.upper()
    assert evaluation.metadata["problems"].value == 2 and evaluation.metadata["damaged_segments"].value == 2

    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0")
    [materialization] = materializations(result, "remote_segments")
    assert materialization.metadata["recopied_segments"].value == 2
    assert materialization.metadata["copy_failed"].value == 0
    assert check_only(log_dir, pg_url, tmp_path, instance, REMOTE_SEGMENTS_IN_BUCKET, "orders-0").passed


def test_a_lost_manifest_fails_the_bucket_check_until_the_next_copy_writes_it_again(
        log_dir, pg_url, tmp_path, kts_home, instance):
    run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0")
    manifest = sorted((tmp_path / "remote").rglob("*.manifest"))[0]
    manifest.unlink()  # the segment's data is whole; the tier no longer describes it (kts recover)
    evaluation = check_only(log_dir, pg_url, tmp_path, instance, REMOTE_SEGMENTS_IN_BUCKET, "orders-0")
    assert not evaluation.passed and "manifest missing" in evaluation.description
    assert evaluation.metadata["manifests_lost"].value == 1 and evaluation.metadata["damaged_segments"].value == 0

    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0")
    [materialization] = materializations(result, "remote_segments")
    assert materialization.metadata["manifests_backfilled"].value == 1
    assert materialization.metadata["recopied_segments"].value == 0 and manifest.exists()
    assert check_only(log_dir, pg_url, tmp_path, instance, REMOTE_SEGMENTS_IN_BUCKET, "orders-0").passed


def _copy_only_the_first_segment_of_orders_0(log_dir, pg_url, tmp_path, instance) -> list:
    """Only orders-0's first segment committed when kts copies it; its segments."""
    checkpoint = log_dir / "replication-offset-checkpoint"
    hws = read_offset_checkpoint(checkpoint)
    partition = next(p for p in LogDir(log_dir).partitions() if p.topic_partition.dir_name == "orders-0")
    segments = partition.segments()
    write_offset_checkpoint(checkpoint, {**hws, partition.topic_partition: segments[1].base_offset})
    run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=[remote_segments.key], partition_key="orders-0")
    write_offset_checkpoint(checkpoint, hws)
    return segments


def _broker_retention_removes(segments) -> None:
    for segment in segments:
        for path in (segment.log, segment.offset_index, segment.time_index):
            path.unlink(missing_ok=True)


def test_a_segment_deleted_before_it_was_copied_raises_the_data_loss_alarm(log_dir, pg_url, tmp_path, kts_home, instance):
    segments = _copy_only_the_first_segment_of_orders_0(log_dir, pg_url, tmp_path, instance)
    assert check_only(log_dir, pg_url, tmp_path, instance, NO_UNCOPIED_SEGMENT_LOST, "orders-0").passed
    _broker_retention_removes(segments[:2])
    evaluation = check_only(log_dir, pg_url, tmp_path, instance, NO_UNCOPIED_SEGMENT_LOST, "orders-0")
    assert not evaluation.passed
    assert evaluation.metadata["lost_offsets"].value == segments[2].base_offset - segments[1].base_offset
    assert f"offsets {segments[1].base_offset}..{segments[2].base_offset - 1}" in evaluation.description


def test_in_the_copy_step_the_loss_check_reports_what_the_copy_pass_just_found_without_looking_again(
        log_dir, pg_url, tmp_path, kts_home, instance, monkeypatch):
    """The copy pass looks for lost ranges at its end, under the partition lock; the check of the
    same step reads what it recorded (a second look moments later finds nothing new), while a check
    run alone still looks for itself (above)."""
    from kts_resources.tiering import lost_ranges

    segments = _copy_only_the_first_segment_of_orders_0(log_dir, pg_url, tmp_path, instance)
    _broker_retention_removes(segments[:2])
    looks = []
    detect = lost_ranges.detect_lost_ranges

    def counted(*args, how_found, **kwargs):
        looks.append(how_found)
        return detect(*args, how_found=how_found, **kwargs)

    monkeypatch.setattr(lost_ranges, "detect_lost_ranges", counted)
    monkeypatch.setattr("kts_resources.tiering.copier.detect_lost_ranges", counted)
    monkeypatch.setattr("kts_assets.checks.detect_lost_ranges", counted)
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], selection=[remote_segments.key],
                 partition_key="orders-0")
    assert looks == ["copy pass"]
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == NO_UNCOPIED_SEGMENT_LOST.name]
    assert not evaluation.passed
    assert f"offsets {segments[1].base_offset}..{segments[2].base_offset - 1}" in evaluation.description


def test_a_multi_partition_run_records_one_evaluation_per_partition_and_nothing_else(log_dir, pg_url, tmp_path, kts_home, instance):
    victim = eligible(log_dir, "orders-1")[0].log
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments, retention_state, remote_log_index],
                 tags={RANGE_START: KEYS[0], RANGE_END: KEYS[-1]})
    seen = verdicts(result)
    for key in CHECK_KEYS:
        # The failed copy fails no step: what comes after the copy runs, with its checks, for
        # every partition; the run fails at its end.
        assert {k for (n, k) in seen if n == key.name} == set(KEYS), key.name
    assert not result.success
    assert seen[("local_segments_crc_clean", "orders-1")] is False
    assert seen[("local_segments_crc_clean", "orders-0")] is True


def test_a_check_that_cannot_run_fails_the_copy_step_once_and_keeps_what_it_materialised(
        log_dir, pg_url, tmp_path, kts_home, instance, monkeypatch):
    """The checks run in the step that copies: a check that crashes (here: the instance's event log
    failing when read) must fail that step, not have its RetryPolicy copy and scan again."""
    from kts_assets import checks

    def event_log_down(*args, **kwargs):
        raise RuntimeError("event log unreachable")

    monkeypatch.setattr(checks, "_latest_records", event_log_down)
    result = run(log_dir, pg_url, tmp_path, instance, [local_and_remote_segments], partition_key="orders-0")
    assert not result.success
    retries = [e.event_type_value for e in result.all_events if e.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_RESTARTED")]
    assert retries == []  # the step's RetryPolicy did not run the copy again
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "could not run: RuntimeError: event log unreachable" in failure.step_failure_data.user_failure_data.description
    assert materializations(result, "local_segments") and materializations(result, "remote_segments")


def test_the_checks_module_imports_first_in_a_fresh_process():
    """The assets take their check specs from kts_assets.checks, which names the assets by key and
    so never imports them back (importing it first once failed on that cycle)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import kts_assets.checks, kts_assets.definitions"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
