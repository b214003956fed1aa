"""Partition discovery: the sensor keeps Dagster's topic-partition partitions in step with the
broker log dirs — odd topic names included, non-partition dirs left out, nothing ever removed."""

from __future__ import annotations

import dagster as dg

from kts_assets.definitions import defs
from kts_assets.partitions import topic_partitions
from kts_assets.sensors import partition_discovery_sensor
from kts_resources.resources import KafkaLogDirsResource


def _log_dir(tmp_path, *names):
    for name in names:
        (tmp_path / name).mkdir()
    return tmp_path


def _tick(instance, log_dirs: str, cursor=None):
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"kafka_log_dirs": KafkaLogDirsResource(log_dirs=log_dirs)}
    )
    return partition_discovery_sensor.evaluate_tick(context)


def test_the_sensor_adds_one_partition_per_topic_partition_dir(tmp_path):
    log_dir = _log_dir(tmp_path, "orders-0", "orders-1", "page.views-0", "user-events-12")
    with dg.instance_for_test() as instance:
        result = _tick(instance, str(log_dir))
        assert len(result.dynamic_partitions_requests) == 1
        request = result.dynamic_partitions_requests[0]
        assert request.partitions_def_name == topic_partitions.name
        assert sorted(request.partition_keys) == ["orders-0", "orders-1", "page.views-0", "user-events-12"]


def test_deleted_future_and_stray_dirs_are_not_partitions(tmp_path):
    log_dir = _log_dir(
        tmp_path,
        "orders-0",
        "orders-1.4f8c9b2a1d3e4c5f8a9b0c1d2e3f4a5b-delete",
        "orders-2.4f8c9b2a1d3e4c5f8a9b0c1d2e3f4a5b-future",
        "orders-3.4f8c9b2a1d3e4c5f8a9b0c1d2e3f4a5b-stray",
        "lost+found",
    )
    with dg.instance_for_test() as instance:
        result = _tick(instance, str(log_dir))
        assert result.dynamic_partitions_requests[0].partition_keys == ["orders-0"]


def test_a_second_tick_with_nothing_new_skips(tmp_path):
    log_dir = _log_dir(tmp_path, "orders-0")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, ["orders-0"])
        result = _tick(instance, str(log_dir))
        assert not result.dynamic_partitions_requests
        assert result.skip_message == (f"no new partitions: looked at 1 log dir ({log_dir}), 1 partition there, "
                                       "every one already known")


def test_the_skip_reason_names_a_log_dir_not_found_and_partitions_that_left(tmp_path):
    (tmp_path / "a").mkdir()
    log_dir = _log_dir(tmp_path / "a", "orders-0")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, ["orders-0", "orders-1"])
        result = _tick(instance, f"{log_dir},{tmp_path / 'missing'}")
        assert result.skip_message == (
            f"no new partitions: looked at 1 log dir ({log_dir}), 1 partition there, every one already known; "
            f"not found, so not read: {tmp_path / 'missing'} (is KTS_LOG_DIRS right?); "
            "1 known partition no longer in any log dir (kept for its history)")


def test_a_vanished_partition_is_kept_so_its_history_survives(tmp_path):
    log_dir = _log_dir(tmp_path, "orders-1")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, ["orders-0"])
        result = _tick(instance, str(log_dir))
        requests = result.dynamic_partitions_requests
        assert [r.partition_keys for r in requests] == [["orders-1"]]
        assert all(isinstance(r, dg.AddDynamicPartitionsRequest) for r in requests)


def test_several_log_dirs_are_read_and_a_missing_one_is_skipped(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _log_dir(first, "orders-0")
    _log_dir(second, "orders-1")
    with dg.instance_for_test() as instance:
        result = _tick(instance, f"{first},{second},{tmp_path / 'missing'}")
        assert sorted(result.dynamic_partitions_requests[0].partition_keys) == ["orders-0", "orders-1"]


def test_definitions_load_with_the_discovery_sensor():
    assert defs.resolve_sensor_def("partition_discovery_sensor") is not None
