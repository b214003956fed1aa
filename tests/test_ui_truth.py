"""What a person reads in the Dagster UI is true, read through the GraphQL API the UI itself reads,
with ``kts ui`` (webserver and daemon) serving kts's own instance config:

- after an expiry, the expired partition's remote_segments and local_segments metadata as the
  partition page shows it (its latest materialisation, overridden by the observations made since,
  label by label) equal ``kts status --json``'s numbers, the moment the run ends;
- a corrupt segment in one partition shows that partition failed: its file and byte in the latest
  copy_completed result of that partition and in the run's failure message, while the other
  partition of that run has its retention_state and remote_log_index materialised by the run;
- the Materialize button on remote_segments for one partition (the implicit asset job with the
  checks the UI selects) runs no scrub and finishes within 2x a copy_job run of that partition
  (both timed here, from the runs' own start and end);
- a deleted ``.index`` in a broker-owned log dir fails a check naming the file.

One ``kts ui`` serves every test of this module; its sensors and schedules are switched off
through the UI's own mutations once it serves, so the runs here are the only ones.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from kts_assets.broker_scope import PLAIN_LOCATION
from kts_assets.instance import instance_config
from kts_assets.sizes import human_bytes
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .conftest import REPO_ROOT
from .fixtures_postgres import _fresh_database
from .fixtures_s3 import free_loopback_port
from .test_copier import _eligible
from .test_webserver import _post_graphql, _stop, _tail, _wait_until_serving

pytestmark = pytest.mark.spark  # the runs' Spark steps use the session's Spark Connect server

SIMULATION = SimulationConfig(total_bytes=400 * 1024, seed=11, topics=("orders", "page.views"), partitions=2,
                              segment_bytes=24 * 1024)
REPOSITORY = "__repository__"
CORRUPT, HEALTHY_BESIDE_IT = "page.views-0", "page.views-1"
EXPIRED = "orders-0"
BUTTON = "page.views-1"  # the Materialize button's partition (healthy, not expired by these tests)
BROKER_OWNED_INDEX = "orders-1"
# Hang-only bounds.
STARTUP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 600


@dataclass
class KtsUi:
    url: str
    log: Path
    env: dict[str, str]
    log_dir: Path
    first_sync: subprocess.CompletedProcess

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        payload = _post_graphql(self.url, query, variables)
        assert not payload.get("errors"), f"GraphQL errors: {payload['errors']}\n{_tail(self.log)}"
        return payload["data"]

    def kts(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=self.env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)

    def status(self) -> dict[str, dict]:
        done = self.kts("status", "--json")
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        rows = rows["partitions"] if isinstance(rows, dict) else rows
        return {f"{r['topic']}-{r['partition']}": r for r in rows}


def _flipped_segment(log_dir: Path) -> Path:
    """The segment of CORRUPT whose byte the fixture flips: its second eligible one."""
    return _eligible(log_dir)[CORRUPT][1].log


@pytest.fixture(scope="module")
def module_pg_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    yield from _fresh_database(pg_admin_url, pg_template)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, module_pg_url: str) -> Iterator[KtsUi]:
    """A simulated broker log dir (broker-owned: kts writes nothing in it) with one flipped byte in
    page.views-0's second segment, one ``kts sync`` over it (which fails for that partition), and
    ``kts ui`` on kts's own instance config (runs and events in the metadata store's database)."""
    root = tmp_path_factory.mktemp("ui")
    log_dir, dagster_home = root / "logs", root / "dagster"
    simulate(log_dir, SIMULATION)
    flipped = _flipped_segment(log_dir)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(instance_config())
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(root / "kts_home"),
           "KTS_DATABASE_URL": module_pg_url, "KTS_REMOTE_URI": (root / "remote").as_uri()}
    env.pop("KTS_SPARK_MASTER", None)
    env.pop("KTS_OWNED_LOG_DIRS", None)
    assert env.get("KTS_SPARK_REMOTE"), "the session's Spark Connect server"
    first_sync = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "kts-ui.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "ui", "--port", str(port)], env=env, cwd=REPO_ROOT,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_serving(url, server, log)
        kts_ui = KtsUi(url, log, env, log_dir, first_sync)
        _switch_off_sensors_and_schedules(kts_ui)
        _wait_for_runs_in_flight(kts_ui)  # a run a sensor started before that (the retry of page.views-0's copy)
        yield kts_ui
    finally:
        _stop(server)


INSTIGATORS = """
query Instigators($selector: RepositorySelector!) {
  sensorsOrError(repositorySelector: $selector) { ... on Sensors { results { name sensorState { id status } } } }
  schedulesOrError(repositorySelector: $selector) { ... on Schedules { results { name scheduleState { id status } } } }
}
"""
STOP_SENSOR = "mutation Stop($id: String) { stopSensor(id: $id) { __typename } }"
STOP_SCHEDULE = "mutation Stop($id: String) { stopRunningSchedule(id: $id) { __typename } }"


def _switch_off_sensors_and_schedules(ui: KtsUi) -> None:
    """As a person would with the UI's toggles, so that the runs of the tests are the only ones."""
    selector = {"repositoryName": REPOSITORY, "repositoryLocationName": PLAIN_LOCATION}
    data = ui.graphql(INSTIGATORS, {"selector": selector})
    for sensor in data["sensorsOrError"]["results"]:
        if sensor["sensorState"]["status"] == "RUNNING":
            assert ui.graphql(STOP_SENSOR, {"id": sensor["sensorState"]["id"]})["stopSensor"]["__typename"] == "StopSensorMutationResult"
    for schedule in data["schedulesOrError"]["results"]:
        if schedule["scheduleState"]["status"] == "RUNNING":
            ui.graphql(STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})


IN_FLIGHT = """
{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED, CANCELING]}) { ... on Runs { results { runId } } } }
"""


def _wait_for_runs_in_flight(ui: KtsUi) -> None:
    """Until no run is queued or running, twice in a row a few seconds apart (a sensor's tick under
    way when it was switched off may still submit one)."""
    quiet = 0
    while quiet < 2:
        runs = ui.graphql(IN_FLIGHT)["runsOrError"]["results"]
        for run in runs:
            _wait_for(ui, run["runId"])
        quiet = 0 if runs else quiet + 1
        time.sleep(2)


LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""

RUN = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { status startTime endTime assetCheckSelection { name assetKey { path } } tags { key value } }
  }
}
"""

ASSET_CHECKS_OF = """
query Checks($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks { name jobNames } } } }
  }
}
"""


def _launch(ui: KtsUi, job: str, partition: str, *, assets: list[str] | None = None,
            checks: list[tuple[str, str]] | None = None) -> str:
    selector = {"repositoryLocationName": PLAIN_LOCATION, "repositoryName": REPOSITORY, "pipelineName": job}
    if assets is not None:
        selector["assetSelection"] = [{"path": [a]} for a in assets]
        selector["assetCheckSelection"] = [{"assetKey": {"path": [a]}, "name": n} for a, n in checks or []]
    params = {"mode": "default", "runConfigData": "{}", "selector": selector,
              "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}
    launched = ui.graphql(LAUNCH, {"executionParams": params})["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def _wait_for(ui: KtsUi, run_id: str) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        run = ui.graphql(RUN, {"runId": run_id})["runOrError"]
        if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']}\n{_tail(ui.log)}"
        time.sleep(0.5)


def _materialize_button(ui: KtsUi, asset: str, partition: str) -> str:
    """The run the asset page's Materialize button launches for one partition: the implicit asset
    job with the asset and those of its checks that job runs (ui-core's executionParamsForAssetJob)."""
    job = "__ASSET_JOB"
    checks = ui.graphql(ASSET_CHECKS_OF, {"key": {"path": [asset]}})["assetNodeOrError"]["assetChecksOrError"]["checks"]
    selected = [(asset, c["name"]) for c in checks if not c["jobNames"] or job in c["jobNames"]]
    return _launch(ui, job, partition, assets=[asset], checks=selected)


METADATA_ENTRY = """
  label __typename
  ... on IntMetadataEntry { intValue }
  ... on FloatMetadataEntry { floatValue }
  ... on TextMetadataEntry { text }
  ... on BoolMetadataEntry { boolValue }
"""

PARTITION_EVENTS = f"""
query Events($key: AssetKeyInput!, $partitions: [String!]) {{
  assetOrError(assetKey: $key) {{
    ... on Asset {{
      assetMaterializations(partitions: $partitions, limit: 1) {{ runId timestamp metadataEntries {{ {METADATA_ENTRY} }} }}
      assetObservations(partitions: $partitions, limit: 50) {{ runId timestamp metadataEntries {{ {METADATA_ENTRY} }} }}
    }}
  }}
}}
"""


def _value(entry: dict):
    for field in ("intValue", "floatValue", "text", "boolValue"):
        if field in entry:
            return entry[field]
    return None


def _shown_metadata(ui: KtsUi, asset: str, partition: str) -> dict:
    """The partition page's Metadata table (ui-core's AssetEventMetadataEntriesTable): the latest
    materialisation's entries, each overridden by the newest observation since that has its label."""
    found = ui.graphql(PARTITION_EVENTS, {"key": {"path": [asset]}, "partitions": [partition]})["assetOrError"]
    [latest] = found["assetMaterializations"]
    newer = sorted((o for o in found["assetObservations"] if float(o["timestamp"]) > float(latest["timestamp"])),
                   key=lambda o: float(o["timestamp"]))
    shown = {e["label"]: _value(e) for e in latest["metadataEntries"]}
    for observation in newer:  # oldest first, so the newest wins
        shown.update({e["label"]: _value(e) for e in observation["metadataEntries"]})
    return shown


# --- after an expiry, the numbers on the partition's pages are kts status's ----------------------

REMOTE_NUMBERS = ("log_start_offset", "local_log_start_offset", "high_watermark", "remote_log_start_offset",
                  "remote_log_end_offset", "remote_bytes", "remote_segments", "copy_lag_segments", "copy_lag_bytes")
LOCAL_NUMBERS = {"log_start_offset": "log_start_offset", "local_log_start_offset": "local_log_start_offset",
                 "high_watermark": "high_watermark", "local_bytes": "local_bytes", "segments": "local_segments"}


def test_after_an_expiry_the_expired_partitions_pages_show_kts_status_numbers(ui):
    before = ui.status()[EXPIRED]
    assert before["remote_segments"] > 0, before
    configured = ui.kts("config", "set", "orders", "retention.ms=1")
    assert configured.returncode == 0, configured.stderr
    run = _wait_for(ui, _launch(ui, "expiry_job", EXPIRED))  # what the retention sensor launches
    assert run["status"] == "SUCCESS", _tail(ui.log)

    status = ui.status()[EXPIRED]
    assert status["remote_segments"] == 0 and status["remote_log_start_offset"] == -1, status  # all of it expired
    remote = _shown_metadata(ui, "remote_segments", EXPIRED)
    assert {n: remote.get(n) for n in REMOTE_NUMBERS} == {n: status[n] for n in REMOTE_NUMBERS}
    local = _shown_metadata(ui, "local_segments", EXPIRED)
    assert {label: local.get(label) for label in LOCAL_NUMBERS} == {label: status[n] for label, n in LOCAL_NUMBERS.items()}
    # The words beside the numbers say the same, with units.
    assert remote["size"].startswith(f"{human_bytes(status['remote_bytes'])} remote,"), remote["size"]
    assert local["size"].startswith(f"{human_bytes(status['local_bytes'])} local,"), local["size"]
    retention = _shown_metadata(ui, "retention_state", EXPIRED)
    assert retention.get("delete_lag_bytes") == 0 and retention.get("delete_lag_segments") == 0, retention


# --- a corrupt segment: that partition failed, with its file and byte where the UI looks first ---

CHECK_EXECUTIONS = """
query Executions($key: AssetKeyInput!, $check: String!, $partition: String) {
  assetCheckExecutions(assetKey: $key, checkName: $check, partition: $partition, limit: 1) {
    runId status partition evaluation { success description }
  }
}
"""

RUN_EVENTS = """
query Logs($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message level stepKey }
        ... on RunFailureEvent { message error { message } }
      }
    }
  }
}
"""

MATERIALIZATIONS_IN_RUN = """
query Materialized($key: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $key) { ... on Asset { assetMaterializations(partitions: $partitions, limit: 20) { runId } } }
}
"""

PARTITION_STATUSES = """
query Statuses($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode { assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } } }
  }
}
"""


def test_a_corrupt_segment_fails_its_partition_by_file_and_byte_while_the_run_serves_the_healthy_one(ui):
    sync = ui.first_sync
    assert sync.returncode == 1, sync.stdout + sync.stderr  # the pass failed, by name
    flipped = _flipped_segment(ui.log_dir)

    # The sync's run (which the roll sensor's retry of the failed partition may have followed by
    # now: the latest result for the partition is then the retry's, failed for the same cause).
    [run_id] = re.findall(r"run ([0-9a-f-]{36}) in the Dagster UI", sync.stderr)
    [latest] = ui.graphql(CHECK_EXECUTIONS, {"key": {"path": ["remote_segments"]}, "check": "copy_completed",
                                             "partition": CORRUPT})["assetCheckExecutions"]
    assert latest["status"] == "FAILED" and latest["partition"] == CORRUPT, latest
    description = latest["evaluation"]["description"]
    assert flipped.name in description and "byte" in description and "CRC" in description, description

    events = ui.graphql(RUN_EVENTS, {"runId": run_id})["logsForRun"]["events"]
    [failure] = [e for e in events if e["__typename"] == "RunFailureEvent"]
    # What the run page shows first: the run's error, a line per failed partition with its cause.
    cause = failure["error"]["message"]
    assert f"{CORRUPT}: copy_completed failed" in cause and flipped.name in cause and "byte" in cause, cause
    assert "Traceback" not in cause and "dagster/_core" not in cause, cause

    # The partitions view: the corrupt partition red, the one beside it green.
    statuses = ui.graphql(PARTITION_STATUSES, {"key": {"path": ["remote_segments"]}})["assetNodeOrError"]["assetPartitionStatuses"]
    assert CORRUPT in statuses["failedPartitions"] and HEALTHY_BESIDE_IT in statuses["materializedPartitions"], statuses

    for asset in ("retention_state", "remote_log_index"):
        done = ui.graphql(MATERIALIZATIONS_IN_RUN, {"key": {"path": [asset]}, "partitions": [HEALTHY_BESIDE_IT]}
                          )["assetOrError"]["assetMaterializations"]
        assert run_id in {m["runId"] for m in done}, (asset, done)


# --- the Materialize button is the fast path ----------------------------------------------------

TIER_WIDE_SCRUB = "remote_tier_scrubbed"


def test_the_materialize_button_runs_no_scrub_and_takes_at_most_twice_a_copy_job_run(ui):
    durations = {"button": [], "copy_job": []}
    for _ in range(2):  # interleaved, so both see the same machine
        copy = _wait_for(ui, _launch(ui, "copy_job", BUTTON))
        assert copy["status"] == "SUCCESS", _tail(ui.log)
        durations["copy_job"].append(copy["endTime"] - copy["startTime"])
        button = _wait_for(ui, _materialize_button(ui, "remote_segments", BUTTON))
        assert button["status"] == "SUCCESS", _tail(ui.log)
        assert TIER_WIDE_SCRUB not in {c["name"] for c in button["assetCheckSelection"] or []}, button
        durations["button"].append(button["endTime"] - button["startTime"])
    ratio = min(durations["button"]) / min(durations["copy_job"])
    assert ratio <= 2.0, durations


# --- a broker's index gone: a failed check naming the file, never a silent pass --------------------


def test_a_deleted_index_in_a_broker_owned_log_dir_fails_a_check_naming_the_file(ui):
    segment = _eligible(ui.log_dir)[BROKER_OWNED_INDEX][0]
    index = segment.log.with_suffix(".index")
    index.unlink()
    run = _wait_for(ui, _launch(ui, "copy_job", BROKER_OWNED_INDEX))
    assert run["status"] in ("SUCCESS", "FAILURE"), run
    [latest] = ui.graphql(CHECK_EXECUTIONS, {"key": {"path": ["local_segments"]}, "check": "local_indexes_whole",
                                             "partition": BROKER_OWNED_INDEX})["assetCheckExecutions"]
    assert latest["status"] == "FAILED", latest
    description = latest["evaluation"]["description"]
    assert str(index) in description and "KTS_OWNED_LOG_DIRS" in description and "kts index rebuild" in description, description
    assert index.exists() is False  # kts wrote nothing in the broker's dir
