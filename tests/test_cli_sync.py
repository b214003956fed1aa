"""``kts sync`` and ``kts status``: one full pass of the pipeline through Dagster, in-process, on
embedded-style defaults — the runs land in the Dagster instance (as the UI shows them), every
eligible segment ends up in the remote tier byte for byte, a second pass copies only what rolled
since, and the status fields (ARCHITECTURE.md) agree with the log and the remote tier."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus
from dagster._daemon.sensor import execute_sensor_iteration

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from kts_resources.tiering.status import STATUS_FIELDS
from kts_assets.sensors.cursor import decode_cursor, sensor_state
from kts_assets.sensors.roll import SENSOR_NAME, survey_log_dirs
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.segment import summarize_segment
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .test_copier import _assert_remote_tier_mirrors_eligible_segments, _eligible
from .test_roll_sensor import kts_code_location, remote_roll_sensor, stored_roll_cursor

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

CONFIG = dict(seed=5, topics=("orders", "page.views"), partitions=2, segment_bytes=48 * 1024)


def test_sync_copies_every_eligible_segment_and_records_runs_in_the_instance(tmp_path, pg_url, metadata_store, monkeypatch):
    log_dir, dagster_home, remote = tmp_path / "logs", tmp_path / "dagster", tmp_path / "remote"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    simulate(log_dir, SimulationConfig(total_bytes=400 * 1024, **CONFIG))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote.as_uri(), "DAGSTER_HOME": str(dagster_home)}
    # On the session's Spark Connect server, as kts runs by default; whole syncs on the classic
    # session (KTS_SPARK_MASTER) are test_run_hygiene's and test_sync_outcome's.

    def sync():
        result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    first = sync()
    assert first.startswith("synced 4 partitions (4 new): copied ")
    storage = remote_storage_from_uri(remote.as_uri())
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)

    simulate(log_dir, SimulationConfig(total_bytes=200 * 1024, **CONFIG))
    second = sync()
    assert second.startswith("synced 4 partitions (0 new): copied ") and "copied 0 segments" not in second
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)

    status = subprocess.run([sys.executable, "-m", "kts_assets.cli", "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    rows = {(r["topic"], r["partition"]): r for r in json.loads(status.stdout)}
    assert len(rows) == 4 and all(tuple(r) == STATUS_FIELDS for r in rows.values())
    eligible = _eligible(log_dir)
    for partition in LogDir(log_dir).partitions():
        row = rows[(partition.topic, partition.partition)]
        segments = partition.segments()
        copied = eligible[str(partition.topic_partition)]
        assert row["local_segments"] == len(segments) and row["remote_segments"] == len(copied)
        assert row["remote_log_start_offset"] == 0 and row["remote_log_end_offset"] == copied[-1].next_base_offset - 1
        assert row["remote_bytes"] == sum(s.log.stat().st_size for s in copied)
        assert row["log_end_offset"] == summarize_segment(segments[-1].log, segments[-1].base_offset, active=True).next_offset
        assert row["remote_log_start_offset"] <= row["remote_log_end_offset"] <= row["high_watermark"] <= row["log_end_offset"]
        assert (row["copy_lag_segments"], row["copy_lag_bytes"]) == (0, 0)

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs()
        assert [r.job_name for r in runs] == ["copy_job", "copy_job"]
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert sorted(instance.get_dynamic_partitions("topic_partitions")) == ["orders-0", "orders-1", "page.views-0", "page.views-1"]
        materialized = instance.get_materialized_partitions(dg.AssetKey("remote_segments"))
        assert materialized == {"orders-0", "orders-1", "page.views-0", "page.views-1"}

        # The sensor daemon's first tick after the syncs requests nothing: `kts sync` moved the roll
        # sensor's cursor. It records the copy lag it sees (none: everything eligible was copied).
        for name in ("KTS_DATABASE_URL", "KTS_LOG_DIRS", "KTS_HOME", "KTS_REMOTE_URI"):
            monkeypatch.setenv(name, env[name])
        with kts_code_location(instance) as workspace:
            stored = sensor_state(instance, SENSOR_NAME, stored_roll_cursor(workspace))
            assert decode_cursor(stored) == survey_log_dirs([log_dir], materialized).eligible
            list(execute_sensor_iteration(workspace, logging.getLogger("sensor daemon"), None, None))
            sensor = remote_roll_sensor(workspace)
            (tick,) = instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id)
        assert len(instance.get_runs()) == 2
        assert tick.status == TickStatus.SKIPPED and not tick.run_ids, tick.error
        observed = {record.partition_key: record.asset_observation.metadata for record in instance.fetch_observations(
            dg.AssetKey("remote_segments"), limit=10).records}
        assert set(observed) == materialized
        assert {(m["copy_lag_segments"].value, m["copy_lag_bytes"].value) for m in observed.values()} == {(0, 0)}


def test_a_remote_object_damaged_in_the_tier_fails_a_sync_and_the_next_sync_recopies_it(tmp_path, pg_url, metadata_store):
    log_dir, dagster_home, remote = tmp_path / "logs", tmp_path / "dagster", tmp_path / "remote"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    simulate(log_dir, SimulationConfig(total_bytes=200 * 1024, **{**CONFIG, "topics": ("orders",), "partitions": 1}))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote.as_uri(), "DAGSTER_HOME": str(dagster_home)}

    def kts(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kts_assets.cli", *argv], env=env, capture_output=True, text=True, timeout=600)

    assert kts("sync").returncode == 0
    victim = sorted(remote.rglob("*.index"))[1]
    data = bytearray(victim.read_bytes())
    data[5] ^= 0x10  # one flipped bit in a remote offset index: same size, only its checksum tells
    victim.write_bytes(bytes(data))

    found = kts("sync")
    assert found.returncode == 1 and "remote_segments_in_bucket failed" in found.stderr and str(victim) in found.stderr, found.stderr
    [row] = json.loads(kts("status", "--json").stdout)
    assert row["damaged_remote_segments"] == 1

    recopied = kts("sync")
    assert recopied.returncode == 0, recopied.stderr[-3000:]
    assert recopied.stdout.rstrip().endswith("; re-copied 1 damaged remote segment")
    [row] = json.loads(kts("status", "--json").stdout)
    assert row["damaged_remote_segments"] == 0
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, remote_storage_from_uri(remote.as_uri()))


def test_sync_with_no_partitions_or_no_log_dir_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for log_dirs, line in ((tmp_path / "empty", f"kts: no partitions in the log dirs ({tmp_path / 'empty'}); set KTS_LOG_DIRS"),
                           (tmp_path / "gone", f"kts: log dir {tmp_path / 'gone'}: no such directory (KTS_LOG_DIRS)")):
        env = {**os.environ, "KTS_LOG_DIRS": str(log_dirs), "KTS_HOME": str(tmp_path / "home")}
        result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stderr.splitlines()) == (1, [line])


def test_status_with_a_log_dir_that_is_not_there_is_a_line_and_exit_1_not_an_empty_table(tmp_path):
    """A wrong KTS_LOG_DIRS is a wrong environment, not an empty broker; an existing empty log dir
    (a broker's first minutes) is an empty table."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("")
    env = {**os.environ, "KTS_LOG_DIRS": f"{tmp_path / 'empty'},{tmp_path / 'gone'},{tmp_path / 'afile'}",
           "KTS_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [f"kts: log dir {tmp_path / 'gone'}: no such directory (KTS_LOG_DIRS)",
                                          f"kts: log dir {tmp_path / 'afile'}: not a directory (KTS_LOG_DIRS)"]
    assert not (tmp_path / "home").exists()  # no database server started for a command that cannot run
