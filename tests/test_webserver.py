"""The Dagster UI's view of kts: ``dagster-webserver``, started on a free loopback port with the
repo's ``workspace.yaml``, serves — through the GraphQL API the UI itself reads — the asset graph
``local_segments → remote_segments``, the ``<topic>-<partition>`` partitions the discovery sensor
registered from a simulated broker log dir, the asset checks on each asset, the copy job, both
sensors and the reconcile schedule, and the materialisations and check results one ``kts sync``
recorded.

One webserver serves every test in this module (starting it is most of the cost)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import dagster as dg
import pytest

from kts_assets.broker_scope import PLAIN_LOCATION
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .conftest import REPO_ROOT
from .fixtures_postgres import _fresh_database
from .fixtures_s3 import free_loopback_port

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

TOPICS = ("orders", "page.views")
PARTITIONS = 2
SIMULATION = SimulationConfig(total_bytes=200 * 1024, seed=5, topics=TOPICS, partitions=PARTITIONS, segment_bytes=48 * 1024)
# The broker's own partition dir names, which are the partition keys (kts_assets/partitions.py).
EXPECTED_KEYS = sorted(f"{topic}-{partition}" for topic in TOPICS for partition in range(PARTITIONS))

LOCATION = PLAIN_LOCATION  # workspace.yaml's location_name
REPOSITORY = "__repository__"  # what Dagster names the repository of a module-level Definitions
# Hang-only bounds: the UI takes 57–73 s to its first page on a busy 2-core machine.
STARTUP_TIMEOUT_S = 600
SYNC_TIMEOUT_S = 300


@dataclass
class Webserver:
    url: str
    log: Path
    log_dirs: Path

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        """The query's ``data``; any GraphQL error fails the test with the server's words."""
        payload = _post_graphql(self.url, query, variables)
        assert not payload.get("errors"), f"GraphQL errors: {payload['errors']}\n{_tail(self.log)}"
        return payload["data"]


# Loopback only: a proxy from the environment must not see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post_graphql(url: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=30) as response:
        return json.load(response)


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return f"--- last {lines} lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the process group (the webserver and the code server it spawned), SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _register_partitions_with_the_discovery_sensor(env: dict[str, str]) -> None:
    """One tick of ``partition_discovery_sensor`` against the DAGSTER_HOME instance, its dynamic
    partition requests applied as the sensor daemon applies them. The sensor's resource is the one
    the Definitions build from the environment (KTS_LOG_DIRS)."""
    from kts_assets.definitions import default_resources
    from kts_assets.sensors import partition_discovery_sensor

    with pytest.MonkeyPatch.context() as mp:
        for name in ("DAGSTER_HOME", "KTS_LOG_DIRS", "KTS_HOME", "KTS_DATABASE_URL", "KTS_REMOTE_URI"):
            mp.setenv(name, env[name])
        with dg.DagsterInstance.get() as instance:
            context = dg.build_sensor_context(
                instance=instance, resources={"kafka_log_dirs": default_resources()["kafka_log_dirs"]}
            )
            result = partition_discovery_sensor.evaluate_tick(context)
            assert result.dynamic_partitions_requests, result.skip_message
            for request in result.dynamic_partitions_requests:
                assert isinstance(request, dg.AddDynamicPartitionsRequest)
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))


def _wait_until_serving(url: str, process: subprocess.Popen, log: Path) -> None:
    """Until /server_info answers and every code location has finished loading (loaded or failed)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"dagster-webserver exited with {process.returncode} before serving\n{_tail(log)}")
        try:
            with _OPENER.open(f"{url}/server_info", timeout=5):
                pass
            statuses = _post_graphql(
                url, "{ locationStatusesOrError { ... on WorkspaceLocationStatusEntries { entries { loadStatus } } } }"
            )["data"]["locationStatusesOrError"]
            entries = statuses.get("entries") or []
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, TypeError, ValueError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"dagster-webserver not serving {url} after {STARTUP_TIMEOUT_S} s\n{_tail(log)}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def module_pg_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """A fresh migrated database shared by this module's tests (pg_url is per test)."""
    yield from _fresh_database(pg_admin_url, pg_template)


@pytest.fixture(scope="module")
def webserver(tmp_path_factory: pytest.TempPathFactory, module_pg_url: str) -> Iterator[Webserver]:
    """A simulated broker log dir, its partitions registered by the discovery sensor, one ``kts sync``
    materialising them, and dagster-webserver serving the repo's workspace on that instance."""
    root = tmp_path_factory.mktemp("webserver")
    log_dir, dagster_home, remote = root / "logs", root / "dagster_home", root / "remote"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    simulate(log_dir, SIMULATION)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "KTS_LOG_DIRS": str(log_dir),
           "KTS_HOME": str(root / "kts_home"), "KTS_DATABASE_URL": module_pg_url,
           "KTS_REMOTE_URI": remote.as_uri()}
    # The sync runs on the Spark Connect path, kts's default: the session's standing server
    # (KTS_SPARK_REMOTE from tests/fixtures_spark.py), never a classic JVM of its own.
    env.pop("KTS_SPARK_MASTER", None)
    assert env.get("KTS_SPARK_REMOTE"), "the session's Spark Connect server"
    _register_partitions_with_the_discovery_sensor(env)

    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    server_log, sync_log = root / "webserver.log", root / "sync.log"
    processes: list[subprocess.Popen] = []
    try:
        # kts sync (Spark) and the webserver's start overlap; both only read what the sensor wrote.
        with open(sync_log, "wb") as out:
            sync = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(sync)
        with open(server_log, "wb") as out:
            server = subprocess.Popen(
                [str(Path(sys.executable).parent / "dagster-webserver"), "-w", str(REPO_ROOT / "workspace.yaml"),
                 "-h", "127.0.0.1", "-p", str(port)],
                env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        processes.append(server)
        _wait_until_serving(url, server, server_log)
        try:
            sync.wait(timeout=SYNC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"kts sync still running after {SYNC_TIMEOUT_S} s\n{_tail(sync_log)}")
        assert sync.returncode == 0, _tail(sync_log)
        # The sensor registered every partition before the sync: the sync adds none.
        summary = [line for line in sync_log.read_text().splitlines() if line.startswith("synced ")]
        assert summary and summary[-1].startswith(f"synced {len(EXPECTED_KEYS)} partitions (0 new): "), _tail(sync_log)
        yield Webserver(url=url, log=server_log, log_dirs=log_dir)
    finally:
        for process in reversed(processes):
            _stop(process)


ASSET_GRAPH = """
{
  assetNodes {
    assetKey { path }
    groupName
    dependencyKeys { path }
    dependedByKeys { path }
    jobNames
    kinds
    backfillPolicy { policyType }
  }
}
"""

PARTITIONS_QUERY = """
{
  assetNodes {
    assetKey { path }
    isPartitioned
    partitionDefinition { type name dimensionTypes { type dynamicPartitionsDefinitionName } }
    partitionKeys
  }
}
"""

CHECKS = """
{
  assetNodes {
    assetKey { path }
    hasAssetChecks
    assetChecksOrError {
      __typename
      ... on AssetChecks { checks { name assetKey { path } jobNames partitionDefinition { name } } }
    }
  }
}
"""

LOCATIONS = """
{
  workspaceOrError {
    __typename
    ... on PythonError { message }
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on PythonError { message stack }
          ... on RepositoryLocation { repositories { name } }
        }
      }
    }
  }
  locationStatusesOrError {
    __typename
    ... on PythonError { message }
    ... on WorkspaceLocationStatusEntries { entries { name loadStatus } }
  }
}
"""

REPOSITORY_QUERY = """
query Repository($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on PythonError { message }
    ... on Repository {
      jobs { name }
      sensors { name defaultStatus minIntervalSeconds targets { pipelineName } }
      schedules { name pipelineName cronSchedule defaultStatus }
    }
  }
}
"""

MATERIALIZATIONS = """
{
  assetNodes {
    assetKey { path }
    partitionStats { numPartitions numMaterialized numFailed }
    assetPartitionStatuses {
      __typename
      ... on DefaultPartitionStatuses { materializedPartitions failedPartitions unmaterializedPartitions }
    }
  }
}
"""

CHECK_STATUSES = """
{
  assetNodes {
    assetKey { path }
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          executionForLatestMaterialization { status }
          partitionStatuses {
            __typename
            ... on AssetCheckDefaultPartitionStatuses {
              succeededPartitions failedPartitions executionFailedPartitions inProgressPartitions skippedPartitions
            }
          }
        }
      }
    }
  }
}
"""


def _by_key(nodes: list[dict]) -> dict[str, dict]:
    return {"/".join(node["assetKey"]["path"]): node for node in nodes}


def test_the_kts_code_location_loads_without_error(webserver):
    data = webserver.graphql(LOCATIONS)
    workspace = data["workspaceOrError"]
    assert workspace["__typename"] == "Workspace", workspace
    [entry] = workspace["locationEntries"]
    location = entry["locationOrLoadError"]
    assert location["__typename"] == "RepositoryLocation", f"{location.get('message')}\n{''.join(location.get('stack', []))}"
    assert (entry["name"], entry["loadStatus"]) == (LOCATION, "LOADED")
    assert location["repositories"] == [{"name": REPOSITORY}]
    assert data["locationStatusesOrError"] == {
        "__typename": "WorkspaceLocationStatusEntries", "entries": [{"name": LOCATION, "loadStatus": "LOADED"}],
    }


TIERING = ["local_segments", "remote_log_index", "remote_segments", "retention_state"]  # copy_job's assets
PARTITIONED = sorted([*TIERING, "hourly_record_counts"])
ALL_ASSETS = sorted([*PARTITIONED, "remote_tier"])  # remote_tier: the whole tier, which the weekly scrub reports on


def test_the_asset_graph_is_inventory_copy_then_retention_and_the_remote_log_index(webserver):
    nodes = _by_key(webserver.graphql(ASSET_GRAPH)["assetNodes"])
    assert sorted(nodes) == ALL_ASSETS
    deps = {name: sorted(k["path"][0] for k in node["dependencyKeys"]) for name, node in nodes.items()}
    assert deps == {"local_segments": [], "remote_segments": ["local_segments"], "retention_state": ["remote_segments"],
                    "remote_log_index": ["remote_segments", "retention_state"], "hourly_record_counts": [],
                    "remote_tier": ["remote_segments"]}
    groups = {name: node["groupName"] for name, node in nodes.items()}
    assert groups == {"local_segments": "tiering", "remote_segments": "tiering", "remote_log_index": "tiering",
                      "retention_state": "retention", "hourly_record_counts": "backfills", "remote_tier": "tiering"}
    for name in TIERING:
        assert "copy_job" in nodes[name]["jobNames"], name
        assert nodes[name]["backfillPolicy"] == {"policyType": "SINGLE_RUN"}  # one run, one Spark JVM, many partitions
    assert {"expiry_job"} <= set(nodes["retention_state"]["jobNames"])
    assert "backfill_job" in nodes["hourly_record_counts"]["jobNames"]
    assert "scrub_job" in nodes["remote_tier"]["jobNames"] and "copy_job" not in nodes["remote_tier"]["jobNames"]
    assert {"spark", "kafka", "parquet"} <= set(nodes["local_segments"]["kinds"])
    # The webserver's tier is a directory (KTS_REMOTE_URI file:…): its kind says so, not "s3".
    assert {"kafka", "filesystem"} <= set(nodes["remote_segments"]["kinds"]) and "s3" not in nodes["remote_segments"]["kinds"]


def test_the_partition_assets_are_partitioned_by_topic_partitions_holding_exactly_the_log_dirs_partitions(webserver):
    on_disk = sorted(p.name for p in webserver.log_dirs.iterdir() if p.is_dir())
    assert on_disk == EXPECTED_KEYS  # the simulation wrote what it was asked to
    nodes = _by_key(webserver.graphql(PARTITIONS_QUERY)["assetNodes"])
    assert sorted(nodes) == ALL_ASSETS
    assert not nodes.pop("remote_tier")["isPartitioned"]  # one tier, whatever the partitions
    for name, node in nodes.items():
        assert node["isPartitioned"], name
        assert node["partitionDefinition"]["type"] == "DYNAMIC", name
        assert node["partitionDefinition"]["name"] == "topic_partitions", name
        assert node["partitionDefinition"]["dimensionTypes"] == [
            {"type": "DYNAMIC", "dynamicPartitionsDefinitionName": "topic_partitions"}
        ], name
        assert len(node["partitionKeys"]) == len(set(node["partitionKeys"])), name
        assert sorted(node["partitionKeys"]) == EXPECTED_KEYS, name


TIER_WIDE_CHECK = "remote_tier_scrubbed"


def _partitioned_checks(nodes: dict) -> list[dict]:
    return [c for node in nodes.values() if node["assetChecksOrError"].get("checks")
            for c in node["assetChecksOrError"]["checks"] if c["name"] != TIER_WIDE_CHECK]


def test_each_asset_lists_its_asset_checks_partitioned_like_it(webserver):
    expected = {
        "local_segments": {"local_segments_crc_clean", "local_indexes_whole"},
        # Not the scrub: Materialize on remote_segments runs every check of the asset in the implicit
        # asset job, and a partition's copy must not read the whole tier.
        "remote_segments": {"offset_invariants", "remote_segments_in_bucket", "no_uncopied_segment_lost", "copy_completed"},
        "remote_tier": {TIER_WIDE_CHECK},
        "retention_state": {"retention_completed"},
        "remote_log_index": {"remote_log_index_covers_finished_segments"},
    }
    nodes = {k: v for k, v in _by_key(webserver.graphql(CHECKS)["assetNodes"]).items() if v["hasAssetChecks"]}
    assert sorted(nodes) == sorted(expected)
    for name, node in nodes.items():
        assert node["hasAssetChecks"], name
        checks = node["assetChecksOrError"]
        assert checks["__typename"] == "AssetChecks", checks
        assert {c["name"] for c in checks["checks"]} == expected[name]
        for check in checks["checks"]:
            assert check["assetKey"] == {"path": [name]}, check
            if check["name"] == TIER_WIDE_CHECK:  # the weekly scrub's, of the whole tier, shown on the tier
                assert check["partitionDefinition"] is None and "scrub_job" in check["jobNames"], check
                assert "copy_job" not in check["jobNames"], check  # a sync never reads the whole tier
                continue
            assert check["partitionDefinition"] == {"name": "topic_partitions"}, check
            assert "copy_job" in check["jobNames"], check  # copy runs evaluate the checks too


def test_the_repository_has_its_jobs_sensors_and_schedules(webserver):
    repository = webserver.graphql(
        REPOSITORY_QUERY, {"selector": {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}}
    )["repositoryOrError"]
    assert repository["__typename"] == "Repository", repository
    assert "copy_job" in {job["name"] for job in repository["jobs"]}
    sensors = {s["name"]: s for s in repository["sensors"]}
    assert sorted(sensors) == ["dead_run_sensor", "index_rebuild_sensor", "partition_discovery_sensor", "retention_sensor",
                               "segment_roll_sensor", "topic_deletion_sensor"]
    assert sensors["retention_sensor"]["targets"] == [{"pipelineName": "expiry_job"}]
    assert sensors["topic_deletion_sensor"]["targets"] == [{"pipelineName": "topic_deletion_job"}]
    assert sensors["index_rebuild_sensor"]["targets"] == [{"pipelineName": "index_rebuild_job"}]
    assert {"copy_job", "expiry_job", "index_rebuild_job", "backfill_job", "scrub_job"} <= {job["name"] for job in repository["jobs"]}
    assert all(s["defaultStatus"] == "RUNNING" for s in sensors.values())
    assert sensors["partition_discovery_sensor"]["minIntervalSeconds"] == 30
    assert sensors["segment_roll_sensor"]["targets"] == [{"pipelineName": "copy_job"}]
    schedules = {s["name"]: s for s in repository["schedules"]}
    assert sorted(schedules) == ["reconcile_schedule", "scrub_schedule"]
    assert schedules["reconcile_schedule"] == {"name": "reconcile_schedule", "pipelineName": "copy_job",
                                               "cronSchedule": "15 * * * *", "defaultStatus": "RUNNING"}
    assert schedules["scrub_schedule"] == {"name": "scrub_schedule", "pipelineName": "scrub_job",
                                           "cronSchedule": "30 3 * * 0", "defaultStatus": "RUNNING"}


DESCRIPTIONS = """
query Descriptions($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on Repository {
      jobs { name description }
      sensors { name description }
      schedules { name description }
      allTopLevelResourceDetails { name description }
    }
  }
  assetNodes {
    assetKey { path }
    description
    opVersion
    kinds
    owners { __typename ... on TeamAssetOwner { team } ... on UserAssetOwner { email } }
  }
}
"""


def _markdown_safe(text: str) -> bool:
    """No RST double backticks and no <word> that markdown would swallow as an HTML tag."""
    import re

    return "``" not in text and not re.search(r"<[A-Za-z][^>]*>", text)


def test_every_job_sensor_schedule_resource_and_asset_has_a_markdown_safe_description(webserver):
    data = webserver.graphql(DESCRIPTIONS, {"selector": {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}})
    repository = data["repositoryOrError"]
    assert repository["__typename"] == "Repository", repository
    described = {f"{kind} {item['name']}": item["description"]
                 for kind in ("jobs", "sensors", "schedules", "allTopLevelResourceDetails")
                 for item in repository[kind] if not item["name"].startswith("__")}
    described.update({f"asset {'/'.join(n['assetKey']['path'])}": n["description"] for n in data["assetNodes"]})
    assert {"sensors partition_discovery_sensor", "sensors segment_roll_sensor", "jobs copy_job", "jobs expiry_job",
            "sensors retention_sensor", "sensors index_rebuild_sensor", "jobs index_rebuild_job",
            "asset retention_state", "asset remote_log_index",
            "schedules reconcile_schedule", "schedules scrub_schedule", "jobs scrub_job", "allTopLevelResourceDetails pyspark",
            "allTopLevelResourceDetails metadata_store"} <= set(described)
    for name, description in described.items():
        assert description and description.strip(), f"{name} has no description"
        assert _markdown_safe(description), f"{name}: {description!r}"


def test_the_assets_carry_owners_kinds_and_code_versions(webserver):
    nodes = _by_key(webserver.graphql(DESCRIPTIONS, {"selector": {"repositoryName": REPOSITORY,
                                                                 "repositoryLocationName": LOCATION}})["assetNodes"])
    for name, node in nodes.items():
        assert node["owners"] == [{"__typename": "TeamAssetOwner", "team": "kts"}], name
        assert node["opVersion"], name
    assert "postgres" in nodes["remote_segments"]["kinds"]  # its metadata goes to the store's PostgreSQL


def test_one_sync_shows_every_partition_of_both_assets_materialized(webserver):
    nodes = {k: v for k, v in _by_key(webserver.graphql(MATERIALIZATIONS)["assetNodes"]).items() if k in TIERING}
    assert sorted(nodes) == TIERING  # kts sync runs copy_job: the example backfill is not part of it
    for name, node in nodes.items():
        statuses = node["assetPartitionStatuses"]
        assert statuses["__typename"] == "DefaultPartitionStatuses", name
        assert sorted(statuses["materializedPartitions"]) == EXPECTED_KEYS, name
        assert statuses["failedPartitions"] == [] and statuses["unmaterializedPartitions"] == [], name
        assert node["partitionStats"] == {"numPartitions": len(EXPECTED_KEYS),
                                          "numMaterialized": len(EXPECTED_KEYS), "numFailed": 0}, name


def test_every_check_passed_in_the_sync_run(webserver):
    nodes = _by_key(webserver.graphql(CHECK_STATUSES)["assetNodes"])
    checks = _partitioned_checks(nodes)
    assert len(checks) == 8
    assert all(c["executionForLatestMaterialization"] == {"status": "SUCCEEDED"} for c in checks), checks


def test_every_check_shows_passed_for_every_partition_after_one_sync(webserver):
    nodes = _by_key(webserver.graphql(CHECK_STATUSES)["assetNodes"])
    checks = _partitioned_checks(nodes)
    assert len(checks) == 8
    for check in checks:
        statuses = check["partitionStatuses"]
        assert statuses["__typename"] == "AssetCheckDefaultPartitionStatuses", check
        assert sorted(statuses["succeededPartitions"]) == EXPECTED_KEYS, check
        assert all(statuses[other] == [] for other in ("failedPartitions", "executionFailedPartitions",
                                                       "inProgressPartitions", "skippedPartitions")), check


CHECK_EXECUTIONS = """
query Executions($assetKey: AssetKeyInput!, $checkName: String!) {
  assetCheckExecutions(assetKey: $assetKey, checkName: $checkName, limit: 100) { partition status }
}
"""


def test_every_check_execution_belongs_to_a_partition(webserver):
    # A run over a range of partitions records one evaluation per partition and no unpartitioned
    # summary: the UI's check history has no "Partition —" rows.
    nodes = _by_key(webserver.graphql(CHECK_STATUSES)["assetNodes"])
    for name, node in nodes.items():
        for check in node["assetChecksOrError"].get("checks") or []:
            if check["name"] == TIER_WIDE_CHECK:
                continue  # unpartitioned by design, and not evaluated by a sync
            executions = webserver.graphql(CHECK_EXECUTIONS, {"assetKey": {"path": [name]}, "checkName": check["name"]})
            partitions = [e["partition"] for e in executions["assetCheckExecutions"]]
            assert sorted(partitions) == EXPECTED_KEYS, (name, check["name"], partitions)

