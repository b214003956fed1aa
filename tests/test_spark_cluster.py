"""kts on a Spark standalone cluster (README "Beyond one machine"): a master, two workers and a
Spark Connect server on loopback (tests/spark_cluster.py), kts attached through ``KTS_SPARK_REMOTE``.
``kts sync``'s inventory, the remote log index build, retention planned as a Spark job and
``read_tiered`` each run their tasks on the workers' executors, as the cluster's own JSON APIs
show (the master's, each worker's, the application's), and stopping the cluster leaves nothing
of it running."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from kts_assets.assets import remote_log_index, retention_state
from kts_assets.batching import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from kts_assets.partitions import topic_partitions
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.reading.reader import READ_UNCOMMITTED
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource, spark_resource
from kts_resources.servers.local_processes import group_alive
from kts_resources.spark.reader import ReaderConfig, read_tiered
from kts_resources.spark.session import build_spark_session, forget_connect_sessions

from .spark_cluster import APP_NAME, SparkCluster, processes_working_under, start_cluster
from .test_assets import partition_metadata
from .test_spark_reader import fetch_loop
from .test_sync_outcome import kts, sync_env
from .tiered_reads import records_per_tier

pytestmark = pytest.mark.spark
KEYS = ["orders-0", "orders-1"]
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> SparkCluster:
    """One cluster for the module (its start is most of the module's time); stopped at the end,
    whatever happened, and checked to be gone."""
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        forget_connect_sessions()  # this process's clients of it (and of the session's server: remade on use)
        cluster.stop()
    assert not [pid for pid, _ in cluster.groups if group_alive(pid)]


@dataclass(frozen=True)
class WorkDone:
    """What the application had completed at one moment, from its REST API."""

    stages: frozenset[int]  # ids of completed stages
    tasks: dict[str, int]  # executor id → tasks it completed

    @classmethod
    def now(cls, cluster: SparkCluster) -> "WorkDone":
        stages = frozenset(s["stageId"] for s in cluster.app("/stages?status=complete"))
        return cls(stages, {e["id"]: e["completedTasks"] for e in cluster.cluster_executors()})

    def since(self, before: "WorkDone") -> tuple[int, int]:
        """(stages completed, tasks completed on the workers' executors) since ``before``."""
        return len(self.stages - before.stages), sum(self.tasks.values()) - sum(before.tasks.values())


def assert_ran_on_the_cluster(cluster: SparkCluster, before: WorkDone, step: str) -> WorkDone:
    """What the application completed by now, having completed stages and tasks since ``before``.
    Its REST API follows the scheduler's events a moment behind: awaited, within a hang-only bound."""
    deadline = time.monotonic() + 60
    while True:
        after = WorkDone.now(cluster)
        stages, tasks = after.since(before)
        if (stages > 0 and tasks > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stages > 0 and tasks > 0, f"{step}: no stage completed on the cluster ({stages} stages, {tasks} tasks)"
    return after


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    """orders-0 and orders-1, records 20 s apart: segments' largest timestamps are minutes apart,
    so a retention.ms can fall between them."""
    root = tmp_path_factory.mktemp("cluster-logs") / "logs"
    simulate(root, SimulationConfig(seed=33, topics=("orders",), partitions=2, total_bytes=240 * 1024,
                                    segment_bytes=24 * 1024, messages_per_second=0.05))
    return root


def test_the_cluster_runs_an_executor_on_each_worker_for_the_connect_server(cluster):
    state = cluster.master_state()
    assert state["status"] == "ALIVE" and state["aliveworkers"] == 2
    [app] = state["activeapps"]
    assert app["name"] == APP_NAME and app["cores"] == 2  # one core granted on each worker
    # Each worker's own JSON: one executor of the application, one core and 512 MiB.
    for worker in cluster.worker_states():
        [executor] = [e for e in worker["executors"] if e["appid"] == app["id"]]
        assert executor["memory"] == 512 and worker["coresused"] == 1
    assert len(cluster.cluster_executors()) == 2


def test_sync_index_build_retention_planning_and_read_tiered_run_their_tasks_on_both_workers(
        cluster, log_dir, tmp_path, pg_url, monkeypatch):
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True, KTS_SPARK_REMOTE=cluster.connect_url)
    env.pop("KTS_SPARK_MASTER", None)  # a classic master would win over KTS_SPARK_REMOTE
    home, remote = Path(env["KTS_HOME"]), env["KTS_REMOTE_URI"]
    start = WorkDone.now(cluster)

    # kts sync: the inventory of every segment is a Spark job (one task a segment on a cluster).
    synced = kts(env, "sync")
    assert synced.returncode == 0, synced.stderr[-3000:]
    copied = re.search(r"copied (\d+) segments", synced.stdout)
    assert copied and int(copied.group(1)) >= 6, synced.stdout
    after_sync = assert_ran_on_the_cluster(cluster, start, "kts sync")

    # The remote log index rebuilt (every segment re-read by Spark) and retention planned as a
    # Spark job (forced with a minimum of one partition), in one run over both partitions.
    store = RemoteLogMetadataStore.from_url(pg_url)
    try:
        finished = {tip.topic_partition.dir_name: sorted(store.list_remote_log_segments(tip, states={FINISHED}),
                                                         key=lambda m: m.start_offset) for tip in store.partitions()}
        assert sorted(finished) == KEYS and all(len(segments) >= 3 for segments in finished.values())
        # retention.ms whose cutoff, now, falls between orders-0's second and third segments.
        older, newer = finished["orders-0"][1], finished["orders-0"][2]
        store.set_topic_config("orders", "retention.ms",
                               int(time.time() * 1000) - (older.max_timestamp_ms + newer.max_timestamp_ms) // 2)
    finally:
        store.close()
    monkeypatch.setenv("KTS_HOME", str(home))
    resources = {
        "kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir)),
        "metadata_store": MetadataStoreResource(database_url=pg_url),
        "remote_tier": RemoteTierResource(remote_uri=remote),
        "pyspark": spark_resource(remote=cluster.connect_url),
    }
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, KEYS)
        result = dg.materialize([retention_state, remote_log_index], instance=instance, resources=resources,
                                tags={PARTITION_RANGE_START_TAG: KEYS[0], PARTITION_RANGE_END_TAG: KEYS[-1]},
                                run_config={"ops": {"retention_state": {"config": {"spark_plan_min_partitions": 1}},
                                                    "remote_log_index": {"config": {"rebuild": True}}}})
    assert result.success
    retention, index = partition_metadata(result, "retention_state"), partition_metadata(result, "remote_log_index")
    assert retention["orders-0"]["remote_segments_deleted"] == retention["orders-0"]["remote_segments_to_expire"] == 2
    assert all(index[key]["index_failed"] == 0 and index[key]["indexed_segments"] > 0 for key in KEYS)
    after_runs = assert_ran_on_the_cluster(cluster, after_sync, "remote log index and retention planning")

    # read_tiered with the remote part only in the tier: the broker's local copies of every
    # segment but the newest two are gone, so executors fetch those records from the remote tier.
    for key in KEYS:
        for log in sorted((log_dir / key).glob("*.log"))[:-2]:
            for f in log.parent.glob(f"{log.stem}.*"):
                f.unlink()
    config = ReaderConfig([str(log_dir)], remote, None, pg_url, str(home))
    with config.reader() as reader:
        bounds = {p: (reader.partition("orders", p).log_start_offset, reader.partition("orders", p).high_watermark) for p in (0, 1)}
        assert all(records_per_tier(reader, "orders", bounds[p][0], p)[0] > 0 for p in (0, 1))
    frame = read_tiered(build_spark_session(remote=cluster.connect_url), "orders", None, 0, None, config=config,
                        task_bytes=16 * 1024)
    got = sorted((r.partition, r.offset, r.timestamp, r.key, r.value, tuple((h.key, h.value) for h in r.headers))
                 for r in frame.collect())
    assert got == sorted(fetch_loop(config, 0, *bounds[0], READ_UNCOMMITTED) + fetch_loop(config, 1, *bounds[1], READ_UNCOMMITTED))
    end = assert_ran_on_the_cluster(cluster, after_runs, "read_tiered")

    # Both workers' executors took tasks, and none failed.
    executors = cluster.cluster_executors()
    assert len(executors) == 2 and all(end.tasks[e["id"]] > 0 and e["failedTasks"] == 0 for e in executors), executors
    assert not cluster.app("/stages?status=failed")


def test_stopping_the_cluster_ends_every_process_it_started(cluster):
    forget_connect_sessions()
    cluster.stop()
    # Each process group: the master, each worker with its executors and their Python workers,
    # the Connect server; and whatever might have left its group runs no more in the cluster's
    # directories (every process of it works in one: the daemons in its home, executors and
    # their Python workers in a worker's work directory).
    assert not [pid for pid, _ in cluster.groups if group_alive(pid)]
    assert processes_working_under(cluster.home) == []
