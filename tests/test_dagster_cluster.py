"""Dagster beside a cluster (issue 30, item 7): the kts of two brokers on one machine — each with its
own KTS_HOME and log dir (meta.properties node.id 1 and 2), one metadata store (so one Dagster
instance) and one remote tier, and KTS_DAGSTER_PER_BROKER=on — each serve their code location with
``kts code-server``; one ``kts ui --workspace`` (webserver and daemon) loads both, as README's
"Beside a cluster" runs them.

The daemon's own sensors discover each broker's partitions and request its copy runs; the code
server of the run's location starts its worker. While broker 1's pool slot is held (by a run of
broker 1 that stands for a long Spark step), broker 2's runs go through and broker 1's wait; the
UI's GraphQL shows both brokers' assets and partitions, told apart by broker."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from kts_assets.batching import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from kts_assets.broker_scope import BrokerScope
from kts_assets.jobs import COPY_JOB_NAME
from kts_assets.run_hygiene import launch_tags
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .conftest import REPO_ROOT
from .fixtures_s3 import free_loopback_port
from .test_run_hygiene import _processes_mentioning, _started_run
from .test_webserver import _post_graphql, _tail, _wait_until_serving, module_pg_url  # noqa: F401 - a fixture

pytestmark = pytest.mark.spark  # the runs' Spark steps attach to the session's Spark Connect server

TOPICS = {1: "orders", 2: "payments"}  # each broker's own partitions, so the UI must tell them apart
PARTITIONS = 2
LOCATION_TAG = "dagster/code_location"  # Dagster tags every run it launches with its code location
# Hang-only bounds: the UI takes a minute to its first page on a busy 2-core machine, and the
# sensors' first requests come on their 30 s intervals after that.
STARTUP_TIMEOUT_S = 600
RUNS_TIMEOUT_S = 900


@dataclass
class Broker:
    broker_id: int
    env: dict[str, str]
    home: Path
    scope: BrokerScope

    @property
    def keys(self) -> list[str]:
        return [f"{TOPICS[self.broker_id]}-{p}" for p in range(PARTITIONS)]


@dataclass
class Cluster:
    url: str
    log: Path
    brokers: dict[int, Broker]
    instance: dg.DagsterInstance
    holder: dg.DagsterRun  # broker 1's run that holds broker 1's one pool slot until released

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        payload = _post_graphql(self.url, query, variables)
        assert not payload.get("errors"), f"GraphQL errors: {payload['errors']}\n{_tail(self.log)}"
        return payload["data"]

    def copy_runs(self, broker: Broker) -> list[dg.RunRecord]:
        """The copy runs the daemon launched for ``broker``'s location (not the holder)."""
        records = self.instance.get_run_records(dg.RunsFilter(job_name=COPY_JOB_NAME, tags={LOCATION_TAG: broker.scope.location_name}))
        return [r for r in records if r.dagster_run.run_id != self.holder.run_id]

    def release_broker_1s_slot(self) -> None:
        """The holder's step ends: its slot is free and its run over (idempotent)."""
        self.instance.event_log_storage.free_concurrency_slots_for_run(self.holder.run_id)
        run = self.instance.get_run_by_id(self.holder.run_id)
        if not run.is_finished:
            self.instance.report_run_canceled(run, message="the test released broker 1's slot")


def _wait_for(what: str, found: Callable[[], object], cluster: Cluster, timeout_s: float = RUNS_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not (value := found()):
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what} after {timeout_s} s\n{_tail(cluster.log)}")
        time.sleep(1)
    return value


def _started(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "kts_assets.cli", *command], env=env, cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stopped(process: subprocess.Popen, log: Path) -> None:
    """SIGTERM, as a service manager stops it: kts stops the Dagster servers it started (and their
    run workers) within its grace; SIGKILL only if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)  # hang-only
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"{process.args} still running 120 s after SIGTERM\n{_tail(log)}")


def _workspace_entry(log: Path, process: subprocess.Popen) -> str:
    """The workspace entry `kts code-server` says loads it (its first line)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    marker = "its workspace entry: "
    while marker not in (text := log.read_text(errors="replace") if log.exists() else ""):
        assert process.poll() is None and time.monotonic() < deadline, _tail(log)
        time.sleep(0.2)
    return text.split(marker, 1)[1].split("; Ctrl-C", 1)[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, module_pg_url: str) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    pg_url = module_pg_url
    dagster_home = root / "dagster"
    dagster_home.mkdir()
    # The repo's instance: kts's PostgreSQL storage, one slot per pool, run limits per code location.
    shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    shared = {"KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": (root / "remote").as_uri(), "DAGSTER_HOME": str(dagster_home)}
    base = {k: v for k, v in os.environ.items() if k != "KTS_SPARK_MASTER"}
    assert base.get("KTS_SPARK_REMOTE"), "the session's Spark Connect server"
    now_ms = int(time.time() * 1000)
    brokers = {}
    for broker_id, topic in TOPICS.items():
        home = root / f"broker{broker_id}"
        log_dir = home / "logs"
        simulate(log_dir, SimulationConfig(seed=broker_id, node_id=broker_id, topics=(topic,), partitions=PARTITIONS,
                                           segment_bytes=48 * 1024, total_bytes=150 * 1024, start_time_ms=now_ms - 3_600_000))
        env = {**base, **shared, "KTS_HOME": str(home / "kts"), "KTS_LOG_DIRS": str(log_dir), "KTS_DAGSTER_PER_BROKER": "on"}
        brokers[broker_id] = Broker(broker_id, env, home / "kts", BrokerScope(broker_id))
    processes: list[tuple[subprocess.Popen, Path]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KTS_DATABASE_URL", pg_url)  # this process's handle on the shared instance
        instance = dg.DagsterInstance.from_config(str(dagster_home))
        try:
            # Broker 1's long step: a run of broker 1's, alive (this process), holding its pool's one slot.
            pool = brokers[1].scope.pool
            instance.event_log_storage.initialize_concurrency_limit_to_default(pool)
            holder = _started_run(instance, {**launch_tags("the test"), LOCATION_TAG: brokers[1].scope.location_name})
            assert instance.event_log_storage.claim_concurrency_slot(pool, holder.run_id, "local_and_remote_segments").is_claimed

            entries = []
            for broker_id, broker in brokers.items():
                log = root / f"code-server-{broker_id}.log"
                server = _started(["code-server", "--port", str(free_loopback_port())], broker.env, log)
                processes.append((server, log))
                entries.append(_workspace_entry(log, server))
            workspace = root / "workspace.yaml"
            workspace.write_text("load_from:\n" + "".join(f"  {entry}\n" for entry in entries))
            port = free_loopback_port()
            ui_log = root / "ui.log"
            ui = _started(["ui", "--workspace", str(workspace), "--port", str(port)],
                          {**base, **shared, "KTS_HOME": str(root / "ui")}, ui_log)
            processes.append((ui, ui_log))
            url = f"http://127.0.0.1:{port}"
            _wait_until_serving(url, ui, ui_log)
            yield Cluster(url, ui_log, brokers, instance, holder)
        finally:
            # The daemon first (no new runs), then the code servers, which stop their run workers.
            for process, log in reversed(processes):
                _stopped(process, log)
            instance.dispose()
    assert _processes_mentioning(str(root)) == []  # nothing of the servers or their run workers is left


LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}
"""


def test_a_run_of_broker_2_finishes_while_broker_1s_run_waits_for_broker_1s_held_slot(cluster: Cluster):
    b1, b2 = cluster.brokers[1], cluster.brokers[2]
    # Broker 1's roll sensor asked for a copy: its run waits for broker 1's slot.
    waiting = _wait_for("a copy run of broker 1", lambda: cluster.copy_runs(b1), cluster)
    # Then broker 2's copy over its partitions, launched as the UI's "Materialize" launches it.
    params = {"selector": {"repositoryLocationName": b2.scope.location_name, "repositoryName": "__repository__",
                           "pipelineName": COPY_JOB_NAME},
              "executionMetadata": {"tags": [{"key": PARTITION_RANGE_START_TAG, "value": b2.keys[0]},
                                             {"key": PARTITION_RANGE_END_TAG, "value": b2.keys[-1]}]}}
    launched = cluster.graphql(LAUNCH, {"params": params})["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    finished = _wait_for("broker 2's run to end", lambda: (run := cluster.instance.get_run_by_id(run_id)).is_finished and run,
                         cluster)

    assert finished.status == dg.DagsterRunStatus.SUCCESS, finished.status
    # Broker 1's run was waiting before broker 2's started, and still is: in flight at once.
    assert all(not cluster.instance.get_run_by_id(r.dagster_run.run_id).is_finished for r in waiting)
    held = cluster.instance.event_log_storage.get_concurrency_info(b1.scope.pool)
    assert {slot.run_id for slot in held.claimed_slots} == {cluster.holder.run_id}
    # Broker 2's run read broker 2's log dir, beside broker 2's code server: its inventory is under
    # broker 2's KTS_HOME, and broker 1's has none yet.
    assert sorted(p.name for p in (b2.home / "inventory" / "local_segments").glob("*.parquet")) == \
        [f"{key}.parquet" for key in b2.keys]
    assert not (b1.home / "inventory").exists()


ASSETS = """
{
  assetNodes {
    assetKey { path }
    pools
    partitionDefinition { dimensionTypes { dynamicPartitionsDefinitionName } }
    partitionKeys
    repository { location { name } }
    assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions } }
  }
}
"""


def test_the_ui_shows_each_brokers_assets_and_partitions_under_its_broker(cluster: Cluster):
    b1, b2 = cluster.brokers[1], cluster.brokers[2]
    cluster.release_broker_1s_slot()
    _wait_for("a finished copy run of broker 1", lambda: [r for r in cluster.copy_runs(b1)
                                                          if r.dagster_run.status == dg.DagsterRunStatus.SUCCESS], cluster)

    nodes = {"/".join(n["assetKey"]["path"]): n for n in cluster.graphql(ASSETS)["assetNodes"]}

    for broker in (b1, b2):
        prefix = f"broker_{broker.broker_id}/"
        mine = {key: node for key, node in nodes.items() if key.startswith(prefix)}
        assert set(mine) == {prefix + name for name in ("local_segments", "remote_segments", "retention_state",
                                                          "remote_log_index", "hourly_record_counts", "remote_tier")}
        # The whole tier, which each broker's weekly scrub reports on: one asset, no partitions, no Spark.
        tier = mine.pop(prefix + "remote_tier")
        assert tier["repository"]["location"]["name"] == f"kts-broker-{broker.broker_id}" and not tier["pools"]
        assert tier["partitionDefinition"] is None
        for key, node in mine.items():
            assert node["repository"]["location"]["name"] == f"kts-broker-{broker.broker_id}", key
            assert node["pools"] == [f"spark_broker_{broker.broker_id}"], key
            [dimension] = node["partitionDefinition"]["dimensionTypes"]
            assert dimension["dynamicPartitionsDefinitionName"] == f"topic_partitions_broker_{broker.broker_id}", key
            assert node["partitionKeys"] == broker.keys, key
        copied = mine[prefix + "remote_segments"]["assetPartitionStatuses"]["materializedPartitions"]
        assert sorted(copied) == broker.keys
    assert len(nodes) == 12  # no asset of either broker under a plain, shared key
