"""The index-rebuild sensor and ``index_rebuild_job``: a partition whose remote log index is damaged
(a flipped byte in a remoteLogIndex file) or missing (its cache directory gone) gets a rebuild run
from the sensor's tick; the run rebuilds the files byte for byte as a fresh build writes them; the
next tick finds nothing to do. A whole index is never asked to be rebuilt."""

from __future__ import annotations

import shutil

import dagster as dg
import pytest

from tests.conftest import materializations
from kts_assets.assets import local_and_remote_segments, local_segments, remote_log_index, remote_segments
from kts_assets.definitions import defs
from kts_assets.jobs import INDEX_REBUILD_JOB_NAME, REBUILD_CONFIG
from kts_assets.sensors import index_rebuild as index_rebuild_module
from kts_assets.sensors.index_rebuild import index_rebuild_sensor
from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.kafka.indexes import rebuild_segment_indexes
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.manifest import INDEX_FILE_KINDS
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource

from .test_assets import instance, kts_home, pipeline_resources  # noqa: F401

pytestmark = pytest.mark.spark
KEYS = ["orders-0", "orders-1"]
RANGE = {"dagster/asset_partition_range_start": KEYS[0], "dagster/asset_partition_range_end": KEYS[-1]}


@pytest.fixture
def log_dir(tmp_path):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=8, topics=("orders",), partitions=2, total_bytes=160 * 1024, segment_bytes=16 * 1024))
    return root


def _tick(instance, log_dir, pg_url, cursor=None, owned=False):
    resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir), owned_log_dirs=str(log_dir) if owned else ""),
                 "metadata_store": MetadataStoreResource(database_url=pg_url)}
    with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor, definitions=defs) as context:
        return index_rebuild_sensor.evaluate_tick(context)


def _index_files(directory):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(params=["filesystem", "s3"])
def tier(request, tmp_path) -> RemoteTierResource:
    """The remote tier the pipeline copies to: a directory, or a bucket behind moto's S3 HTTP endpoint."""
    if request.param == "filesystem":
        return RemoteTierResource(remote_uri=(tmp_path / "remote").as_uri())
    return RemoteTierResource(remote_uri=f"s3://{request.getfixturevalue('s3_bucket')}/tiered",
                              s3_endpoint_url=request.getfixturevalue("s3_endpoint"))


def test_a_damaged_or_missing_remote_log_index_is_rebuilt_by_the_sensors_run_as_a_fresh_build_writes_it(
        log_dir, pg_url, tmp_path, kts_home, instance, monkeypatch, tier):  # noqa: F811
    monkeypatch.setattr(index_rebuild_module, "FINISHED_GRACE_MS", 0)  # the segments were finished just now
    resources = {**pipeline_resources(log_dir, pg_url, tmp_path / "remote"), "remote_tier": tier}
    instance.add_dynamic_partitions("topic_partitions", KEYS)
    assert dg.materialize([local_and_remote_segments, remote_log_index], instance=instance, resources=resources,
                          tags=RANGE).success
    whole = _tick(instance, log_dir, pg_url)
    known = len(instance.get_dynamic_partitions("topic_partitions"))
    assert whole.run_requests == [] and whole.skip_message == (
        f"looked at {known} of {known} known partitions: every remote log index and every closed segment's local "
        ".index / .timeindex whole")

    store = RemoteLogMetadataStore.from_url(pg_url)
    tips = {t.topic_partition.dir_name: t for t in store.partitions()}
    home = tmp_path / "kts_home"
    directories = {key: index_cache.cache_directory(home, tips[key]) for key in KEYS}
    damaged = sorted(directories["orders-1"].glob(f"*{ri.LOG_INDEX_SUFFIX}"))[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x08
    damaged.write_bytes(bytes(data))
    shutil.rmtree(directories["orders-0"])

    found = _tick(instance, log_dir, pg_url, cursor=whole.cursor)
    [request] = found.run_requests
    assert (request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]) == tuple(KEYS)
    assert request.tags["kts/trigger"] == "index_rebuild"
    assert request.run_config == REBUILD_CONFIG
    rebuilt = dg.materialize([local_and_remote_segments, remote_log_index], selection=[local_segments.key, remote_log_index.key], instance=instance, resources=resources, tags=request.tags,
                             run_config=request.run_config)
    assert rebuilt.success

    storage = tier.storage()
    for key in KEYS:
        finished = store.list_remote_log_segments(tips[key], states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
        fresh = tmp_path / "fresh" / key
        index_cache.build_partition_index(fresh, finished, lambda md: index_cache.read_segment_entries(storage, md), fresh=True)
        assert _index_files(directories[key]) == _index_files(fresh), key
        # What the tier names as current is what the cache holds.
        pointer = index_tier.read_pointer(storage, tips[key])
        current = {f"{ref.base_offset:020d}.{kind}": storage.fetch_object(storage.keys.remote_index_key(
            tips[key], f"{ref.base_offset:020d}.{kind}", ref.version)) for ref in pointer.file_sets for kind in INDEX_FILE_KINDS}
        assert current == {p.name: p.read_bytes() for p in directories[key].iterdir() if p.is_file()}, key
    again = _tick(instance, log_dir, pg_url, cursor=found.cursor)
    assert again.run_requests == []
    store.close()


def test_missing_or_torn_local_indexes_in_an_owned_log_dir_are_rebuilt_by_kafkas_recovery_rule(
        log_dir, pg_url, tmp_path, kts_home, instance, capfd):  # noqa: F811
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote", owned=True)
    instance.add_dynamic_partitions("topic_partitions", KEYS)
    segments = LogDir(log_dir).partitions()[0].segments()
    key = segments[0].log.parent.name
    expected = {}
    for segment in segments[:-1]:  # what recovery writes for each closed segment, built aside
        out = tmp_path / "expected" / str(segment.base_offset)
        rebuild_segment_indexes(segment.log, out_dir=out, closed=True)
        expected[segment.base_offset] = {p.name: p.read_bytes() for p in out.iterdir()}
    segments[0].time_index.unlink()  # a segment from before KIP-33: no time index
    with open(segments[1].offset_index, "r+b") as f:
        f.truncate(f.seek(0, 2) - 3)  # a torn write
    capfd.readouterr()
    found = _tick(instance, log_dir, pg_url, owned=True)
    logged = capfd.readouterr().err
    assert f"{key}: local index to rebuild: {segments[0].time_index}: the time index is missing (and 1 more)" in logged
    assert "remote log index to rebuild" not in logged  # a local index is called a local index
    [request] = found.run_requests
    assert request.tags["dagster/asset_partition_range_start"] <= key <= request.tags["dagster/asset_partition_range_end"]
    result = dg.materialize([local_and_remote_segments, remote_log_index], selection=[local_segments.key, remote_log_index.key], instance=instance, resources=resources, tags=request.tags,
                            run_config=request.run_config)
    assert result.success
    rebuilt = {m.partition: m.metadata["indexes_rebuilt"].value for m in materializations(result, "local_segments")}
    assert rebuilt[key] == 2
    for segment in segments[:-1]:
        assert {p.name: p.read_bytes() for p in (segment.offset_index, segment.time_index)} == expected[segment.base_offset]
    assert _tick(instance, log_dir, pg_url, cursor=found.cursor, owned=True).run_requests == []


def test_a_missing_local_index_in_a_brokers_log_dir_is_reported_with_the_repair_and_never_written(
        log_dir, pg_url, tmp_path, kts_home, instance, capfd):  # noqa: F811
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote", owned=False)
    instance.add_dynamic_partitions("topic_partitions", KEYS)
    segment = LogDir(log_dir).partitions()[0].segments()[0]
    key = segment.log.parent.name
    segment.offset_index.unlink()
    logs = _captured_sensor_logs(instance, log_dir, pg_url, capfd)
    found, lines = logs()
    # One run, so that the partition's local_indexes_whole check fails naming the file; nothing is rebuilt.
    [request] = found.run_requests
    assert request.tags["dagster/asset_partition_range_start"] <= key <= request.tags["dagster/asset_partition_range_end"]
    warning = next(line for line in lines if "broker-owned" in line)
    assert warning.startswith(f"{key}: local index missing or torn in a broker-owned log dir: {segment.offset_index}: the offset index is missing; ")
    assert f"kts does not write broker-owned log dirs: repair with `kts index rebuild {segment.log}`" in warning
    assert "KTS_OWNED_LOG_DIRS" in warning
    result = dg.materialize([local_and_remote_segments, remote_log_index], selection=[local_segments.key, remote_log_index.key],
                            instance=instance, resources=resources, tags=request.tags, run_config=request.run_config)
    assert result.success and not segment.offset_index.exists()
    failed = {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == "local_indexes_whole" and not e.passed}
    assert list(failed) == [key] and str(segment.offset_index) in failed[key].description
    # Reported once: the next ticks request nothing more, and still say what is wrong and how to repair it.
    again, _ = logs(found.cursor)
    assert again.run_requests == []
    known = len(instance.get_dynamic_partitions("topic_partitions"))
    assert again.skip_message.startswith(f"looked at {known} of {known} known partitions: every remote log index whole; "
                                         "nothing kts may rebuild; "
                                         f"1 partition in broker-owned log dirs with a missing or torn local index, reported by the "
                                         f"local_indexes_whole check of local_segments: {key}; {key}: {segment.offset_index}: "
                                         "the offset index is missing; kts does not write broker-owned log dirs")


def _captured_sensor_logs(instance, log_dir, pg_url, capfd):
    """A tick function returning (the tick's result, the messages the sensor logged): a sensor's
    log goes to the tick's own log handlers, here the console's."""

    def tick(cursor=None):
        capfd.readouterr()
        result = _tick(instance, log_dir, pg_url, cursor=cursor)
        return result, [line.split(" - ", 4)[-1] for line in capfd.readouterr().err.splitlines() if " - dagster - " in line]

    return tick


def test_the_index_rebuild_job_rebuilds_local_and_remote_indexes_and_checks_them():
    job = defs.resolve_job_def(INDEX_REBUILD_JOB_NAME)
    assert sorted(node.name for node in job.nodes) == ["local_and_remote_segments", "remote_log_index"]
    # The inventory's CRC check and the index's come along (each judged in its asset's step),
    # remote_segments' checks do not.
    assert sorted(k.to_user_string() for k in job.asset_layer.asset_graph.asset_check_keys) == [
        "local_segments:local_indexes_whole", "local_segments:local_segments_crc_clean",
        "remote_log_index:remote_log_index_covers_finished_segments"]
    assert job.executor_def.name == "in_process"
    assert job.partitioned_config.get_run_config_for_partition_key(KEYS[0]) == REBUILD_CONFIG
    assert index_rebuild_sensor.job_name == INDEX_REBUILD_JOB_NAME
