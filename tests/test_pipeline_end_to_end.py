"""End to end through Dagster: the broker (simulator) keeps appending and rolling → the roll sensor
requests a run → that run, executed with the sensor's tags, copies exactly the newly eligible
segments — nothing twice, nothing early."""

from __future__ import annotations

import dagster as dg
import pytest

from kts_assets.definitions import defs
from kts_assets.partitions import topic_partitions
from kts_assets.sensors import segment_roll_sensor
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition

from .test_assets import eligible, pipeline_resources

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

CONFIG = dict(seed=21, topics=("orders", "page.views"), partitions=2, segment_bytes=16 * 1024)


def _finished(store, log_dir) -> dict[str, list[int]]:
    out = {}
    for partition in LogDir(log_dir).partitions():
        tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
        out[partition.topic_partition.dir_name] = [
            md.start_offset for md in store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})]
    return out


def _tick_and_run(instance, resources, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={
        "kafka_log_dirs": resources["kafka_log_dirs"], "metadata_store": resources["metadata_store"]})
    result = segment_roll_sensor.evaluate_tick(context)
    job = defs.resolve_job_def("copy_job")
    for request in result.run_requests:
        run = job.execute_in_process(instance=instance, tags=request.tags, resources=resources)
        assert run.success
    return result


def test_rolled_segments_reach_the_remote_tier_through_sensor_requested_runs(tmp_path, pg_url, metadata_store):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(total_bytes=120 * 1024, **CONFIG))
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    keys = sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions())
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, keys)

        first = _tick_and_run(instance, resources, None)
        assert len(first.run_requests) == 1  # four partitions with work: one ranged run
        assert _finished(metadata_store, log_dir) == {k: [s.base_offset for s in eligible(log_dir, k)] for k in keys}

        idle = _tick_and_run(instance, resources, first.cursor)
        assert idle.run_requests == []  # nothing rolled: nothing requested

        before = _finished(metadata_store, log_dir)
        simulate(log_dir, SimulationConfig(total_bytes=60 * 1024, **CONFIG))  # the broker keeps appending and rolling
        third = _tick_and_run(instance, resources, idle.cursor)
        assert len(third.run_requests) == 1
        after = _finished(metadata_store, log_dir)
        for key in keys:
            expected = [s.base_offset for s in eligible(log_dir, key)]
            assert after[key] == expected  # exactly the eligible segments, each once
            assert after[key][: len(before[key])] == before[key]  # the earlier copies untouched
        assert sum(len(v) for v in after.values()) > sum(len(v) for v in before.values())
