"""Runs that die or are stopped never block later ones, and the UI sees the CLI's world: the repo's
dagster.yaml turns on Dagster's run monitoring (dead daemon-launched runs failed, their slots
freed); a SIGTERMed ``kts sync`` exits within seconds and the next pass finishes its copies; a
wrong environment fails a run instead of succeeding with nothing done; ``kts ui`` serves the
repository's jobs on loopback and stops on SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from kts_assets.assets import local_and_remote_segments, local_segments, remote_segments
from kts_assets.checks import OFFSET_INVARIANTS
from kts_assets.partitions import topic_partitions
from kts_assets.run_hygiene import PROCESS_TAG
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.resources import CopyQuotaResource, KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource, spark_resource

from .conftest import REPO_ROOT
from .fixtures_s3 import free_loopback_port
from .test_sync_outcome import kts, sync_env
from .test_webserver import REPOSITORY_QUERY, _post_graphql, _stop, _tail, _wait_until_serving


def test_the_repo_dagster_yaml_turns_on_run_monitoring_that_frees_slots_of_dead_runs(pg_url, monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)  # the instance's storage is kts's database
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        assert instance.run_monitoring_enabled
        settings = instance.run_monitoring_settings
        assert settings["free_slots_after_run_end_seconds"] > 0
        assert settings["start_timeout_seconds"] > 0 and settings["max_resume_run_attempts"] == 0
        assert instance.run_retries_enabled and not instance.run_retries_retry_on_asset_or_op_failure


def test_a_run_whose_partitions_are_in_no_log_dir_fails_and_so_does_their_check(tmp_path, pg_url):
    keys = ["orders-0", "orders-1"]
    resources = {
        "kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(tmp_path / "no-such-dir")),
        "metadata_store": MetadataStoreResource(database_url=pg_url),
        "remote_tier": RemoteTierResource(remote_uri=(tmp_path / "remote").as_uri()),
        "copy_quota": CopyQuotaResource(),
        "pyspark": spark_resource("local[1]"),  # declared by local_segments; its step does not run here
    }
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, keys)
        result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], resources=resources, instance=instance, raise_on_error=False,
                                tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
        assert not result.success
        [failure] = [e for e in result.all_events if e.is_step_failure]
        assert "none of the run's 2 partitions is in the log dirs" in failure.step_failure_data.user_failure_data.description
        assert instance.get_materialized_partitions(remote_segments.key) == set()

        checked = dg.materialize([local_and_remote_segments], resources=resources, instance=instance,
                                 selection=dg.AssetSelection.checks(OFFSET_INVARIANTS), tags={"dagster/partition": "orders-0"},
                                 raise_on_error=False)
        [evaluation] = checked.get_asset_check_evaluations()
        assert not evaluation.passed and "in none of the log dirs" in evaluation.description


def test_a_sigtermed_sync_exits_cancelling_its_run_and_the_next_pass_leaves_no_copy_started(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=("orders",), partitions=2, segment_bytes=48 * 1024, total_bytes=300 * 1024))
    env = sync_env(tmp_path, log_dir, pg_url)
    out = tmp_path / "sync.log"
    with open(out, "wb") as sink:
        sync = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    # Until the run is under way (its first line), then some seconds into Spark's start.
    deadline = time.monotonic() + 600  # hang-only
    while "copy_job over" not in out.read_text() and time.monotonic() < deadline:
        assert sync.poll() is None, _tail(out)
        time.sleep(0.2)
    time.sleep(3)
    sync.send_signal(signal.SIGTERM)
    try:
        sync.wait(timeout=300)  # hang-only: what it must do on the way out is checked below
    except subprocess.TimeoutExpired:
        _stop(sync)
        pytest.fail(f"kts sync still running 5 minutes after SIGTERM\n{_tail(out)}")
    assert sync.returncode == 128 + signal.SIGTERM, _tail(out)
    assert "kts: sync stopped by SIGTERM" in out.read_text() and "Traceback" not in out.read_text()
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.CANCELED

    again = kts(env, "sync")
    assert again.returncode == 0, again.stderr[-3000:]
    store = RemoteLogMetadataStore.from_url(pg_url)
    try:
        with store.engine.connect() as conn:
            states = [row[0] for row in conn.exec_driver_sql("SELECT state FROM remote_segments")]
    finally:
        store.close()
    assert states and RemoteLogSegmentState.COPY_SEGMENT_STARTED.name not in states


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (the webserver's, daemon's and code
    server's carry the instance's DAGSTER_HOME)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_kts_ui_serves_the_repository_on_loopback_and_stops_on_sigterm(tmp_path):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=("orders",), partitions=1, segment_bytes=48 * 1024, total_bytes=60 * 1024))
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}
    port = free_loopback_port()
    log = tmp_path / "ui.log"
    with open(log, "wb") as sink:
        # Started with SIGINT ignored, as `nohup` or a script's `&` starts it: what dagster dev
        # stops its servers with must still reach them.
        ui = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "ui", "--port", str(port)], env=env, cwd=tmp_path,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_serving(url, ui, log)
        repository = _post_graphql(url, REPOSITORY_QUERY, {"selector": {"repositoryName": "__repository__",
                                                                        "repositoryLocationName": "kts"}})["data"]["repositoryOrError"]
        assert "copy_job" in {job["name"] for job in repository["jobs"]}, repository
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=300) == 0, _tail(log)  # hang-only
        with pytest.raises(ProcessLookupError):
            os.killpg(ui.pid, 0)
        assert _processes_mentioning(str(dagster_home)) == []  # nothing of the webserver, daemon or code server is left
    finally:
        _stop(ui)
        # The daemon's sensors started this KTS_HOME's embedded PostgreSQL, which outlives the UI by
        # design (every later kts process reuses it): stop it as a user would.
        subprocess.run([sys.executable, "-m", "kts_assets.cli", "services", "stop"], env=env, cwd=tmp_path,
                       check=False, capture_output=True, timeout=120)
        # Its cluster (under /var/lib/kts/postgres as root) goes too: whether the daemon got to start
        # the server before SIGTERM depends on the machine's load, and the run leaves none behind.
        from kts_resources.metadata import embedded

        embedded.discard(tmp_path / "home" / "postgres")


def _spark_slot_holders(dagster_home: str) -> set[str]:
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        if "spark" not in instance.event_log_storage.get_concurrency_keys():
            return set()
        return {slot.run_id for slot in instance.event_log_storage.get_concurrency_info("spark").claimed_slots}


def test_a_sync_killed_in_its_spark_step_never_blocks_the_next(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=("orders",), partitions=2, segment_bytes=48 * 1024, total_bytes=300 * 1024))
    env = sync_env(tmp_path, log_dir, pg_url)
    # The repo's pools: one `spark` slot, as a host running kts has.
    (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    # The instance's SQLite files made before the sync starts: the polling below must not race the
    # sync's process to create them (two first-time Alembic stamps leave two heads).
    dg.DagsterInstance.from_config(env["DAGSTER_HOME"]).dispose()
    out = tmp_path / "killed.log"
    with open(out, "wb") as sink:
        doomed = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                  stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600  # hang-only
    while not _spark_slot_holders(env["DAGSTER_HOME"]):
        assert doomed.poll() is None and time.monotonic() < deadline, _tail(out)
        time.sleep(0.5)
    os.killpg(doomed.pid, signal.SIGKILL)  # as an OOM kill would: the process and its Spark JVM
    doomed.wait(timeout=30)
    [held_by] = _spark_slot_holders(env["DAGSTER_HOME"])  # what blocked every later run before

    after = kts(env, "sync")

    assert after.returncode == 0, after.stderr[-3000:]
    assert f"run {held_by} (copy_job) died with its process" in after.stderr, after.stderr[-3000:]
    assert not _spark_slot_holders(env["DAGSTER_HOME"])
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(held_by).status == dg.DagsterRunStatus.FAILURE
        assert [r.status for r in instance.get_runs()][0] == dg.DagsterRunStatus.SUCCESS


@contextlib.contextmanager
def _pool_instance(limit: int = 1):
    """An instance whose `spark` pool has ``limit`` slots, initialised as a step's first claim does."""
    with dg.instance_for_test(overrides={"concurrency": {"pools": {"default_limit": limit}}}) as instance:
        instance.event_log_storage.initialize_concurrency_limit_to_default("spark")
        yield instance


def _started_run(instance: dg.DagsterInstance, tags: dict[str, str]) -> dg.DagsterRun:
    run = instance.create_run_for_job(dg.GraphDefinition(name="g", node_defs=[]).to_job(name="copy_job"), tags=tags)
    instance.handle_run_event(run.run_id, dg.DagsterEvent(
        event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name, message="started"))
    return instance.get_run_by_id(run.run_id)


def test_release_marks_failed_a_run_whose_process_is_gone_and_frees_its_slot():
    from kts_assets.run_hygiene import launch_tags, release_dead_runs

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    host = socket.gethostname()
    with _pool_instance(limit=2) as instance:
        gone = _started_run(instance, {**launch_tags(), PROCESS_TAG: f"{host}:{dead}:"})
        # The same pid on another host (beside a cluster, one instance for every broker) is not this host's to judge.
        elsewhere = _started_run(instance, {**launch_tags(), PROCESS_TAG: f"not-{host}:{dead}:"})
        alive = _started_run(instance, launch_tags())  # this very process: still running
        for run in (gone, alive):
            instance.event_log_storage.claim_concurrency_slot("spark", run.run_id, "local_segments")

        lines = release_dead_runs(instance)

        assert lines == [f"run {gone.run_id} (copy_job) died with its process (pid {dead}): marked failed and its pool slots freed"]
        assert instance.get_run_by_id(gone.run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.STARTED
        assert instance.get_run_by_id(elsewhere.run_id).status == dg.DagsterRunStatus.STARTED
        holders = {s.run_id for s in instance.event_log_storage.get_concurrency_info("spark").claimed_slots}
        assert holders == {alive.run_id}


def test_a_run_waiting_on_a_pool_slot_is_told_which_run_holds_it():
    from kts_assets.run_hygiene import SlotWaitReporter

    with _pool_instance() as instance:
        instance.event_log_storage.claim_concurrency_slot("spark", "holder-run", "local_segments")
        blocked = instance.event_log_storage.claim_concurrency_slot("spark", "waiting-run", "local_segments")
        assert not blocked.is_claimed
        said: list[str] = []
        with SlotWaitReporter(instance, "waiting-run", said.append, interval_s=0.5):
            deadline = time.monotonic() + 120  # hang-only
            while not said and time.monotonic() < deadline:
                time.sleep(0.2)
        assert said and said[0] == "waiting for a free `spark` slot held by run holder-run"


def test_a_run_worker_killed_in_its_spark_step_is_failed_by_the_dead_run_sensor_and_frees_its_slot(tmp_path, pg_url):
    """A run executed by a worker process of its own (as the daemon's run launcher starts one), not
    by `kts sync`: SIGKILLed while it holds the `spark` slot, it is failed and its slot freed by the
    dead-run sensor's next tick, and the next run proceeds with no manual step."""
    from kts_assets.sensors import dead_run_sensor

    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=6, topics=("orders",), partitions=2, segment_bytes=48 * 1024, total_bytes=300 * 1024))
    env = sync_env(tmp_path, log_dir, pg_url)
    (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    keys = ["orders-0", "orders-1"]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        instance.add_dynamic_partitions(topic_partitions.name, keys)
    out = tmp_path / "worker.log"
    tags = '{"dagster/asset_partition_range_start": "orders-0", "dagster/asset_partition_range_end": "orders-1"}'
    with open(out, "wb") as sink:
        worker = subprocess.Popen([str(Path(sys.executable).with_name("dagster")), "job", "execute", "-m", "kts_assets.definitions",
                                   "-j", "copy_job", "--tags", tags], env=env, cwd=REPO_ROOT,
                                  stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while not _spark_slot_holders(env["DAGSTER_HOME"]):
        assert worker.poll() is None and time.monotonic() < deadline, _tail(out)
        time.sleep(0.5)
    [held_by] = _spark_slot_holders(env["DAGSTER_HOME"])
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        deadline = time.monotonic() + 60  # the step tags its run with its worker when it starts
        while PROCESS_TAG not in instance.get_run_by_id(held_by).tags:
            assert time.monotonic() < deadline, _tail(out)
            time.sleep(0.2)
    os.killpg(worker.pid, signal.SIGKILL)  # as an OOM kill or a reboot would: the worker and its JVM
    worker.wait(timeout=30)

    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(held_by).status == dg.DagsterRunStatus.STARTED  # nobody noticed yet
        result = dead_run_sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
        assert held_by in (result.skip_message or "")
        assert instance.get_run_by_id(held_by).status == dg.DagsterRunStatus.FAILURE
    assert not _spark_slot_holders(env["DAGSTER_HOME"])

    after = kts(env, "sync")
    assert after.returncode == 0, after.stderr[-3000:]


def test_every_job_runs_its_steps_in_one_process_so_a_run_starts_one_spark_session():
    """A daemon-launched copy run pays one JVM, as `kts sync` does: the inventory step and the CRC
    check share the run's process, and so its Spark session. So does Dagster's implicit asset job,
    which the Materialize button on an asset page launches."""
    from kts_assets.definitions import defs

    jobs = [*defs.get_repository_def().get_all_jobs()]
    assert "__ASSET_JOB" in {job.name for job in jobs} and "copy_job" in {job.name for job in jobs}
    assert {job.name: job.executor_def for job in jobs} == {job.name: dg.in_process_executor for job in jobs}


def test_loading_the_definitions_prints_no_dagster_beta_or_preview_warning():
    """`dagster dev` loads the code location over and over: kts's deliberate use of beta/preview
    APIs must not fill its log (other warnings still show)."""
    probe = ("import warnings; warnings.simplefilter('always'); "
             "import kts_assets.definitions")
    done = subprocess.run([sys.executable, "-W", "always", "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "BetaWarning" not in done.stderr and "PreviewWarning" not in done.stderr, done.stderr[-2000:]
