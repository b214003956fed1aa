"""``kts sync`` and ``kts status``: one full pass of the pipeline through Dagster, in-process, on
embedded-style defaults — the runs land in the Dagster instance (as the UI shows them), every
eligible segment ends up in the remote tier byte for byte, a second pass copies only what rolled
since, and the status fields (ARCHITECTURE.md) agree with the log and the remote tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import pytest

from kts_resources.kafka.simulate import SimulationConfig, simulate

from kts_assets.cli import STATUS_FIELDS
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.segment import summarize_segment
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .test_copier import _assert_remote_tier_mirrors_eligible_segments, _eligible

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

CONFIG = dict(seed=5, topics=("orders", "page.views"), partitions=2, segment_bytes=48 * 1024)


def test_sync_copies_every_eligible_segment_and_records_runs_in_the_instance(tmp_path, pg_url, metadata_store):
    log_dir, dagster_home, remote = tmp_path / "logs", tmp_path / "dagster", tmp_path / "remote"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    simulate(log_dir, SimulationConfig(total_bytes=400 * 1024, **CONFIG))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote.as_uri(), "DAGSTER_HOME": str(dagster_home), "KTS_SPARK_MASTER": "local[2]"}

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


def test_sync_with_no_partitions_is_one_line(tmp_path):
    env = {**os.environ, "KTS_LOG_DIRS": str(tmp_path / "empty"), "KTS_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().startswith("kts: no partitions in the log dirs")
