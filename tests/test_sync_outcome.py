"""How a ``kts sync`` pass ends: a partition whose copy failed makes the pass exit non-zero, named
with its cause, while the healthy partitions are tiered and materialised and the failed ones are
not (the run fails); the copy lag printed is the one ``kts status`` reports; a wrong environment
(remote tier unreachable or unwritable, database port closed) is one line per problem within
seconds, before Dagster or Spark start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .conftest import REPO_ROOT
from .fixtures_s3 import free_loopback_port
from .test_copier import _eligible

CONFIG = SimulationConfig(seed=5, topics=("orders", "page.views"), partitions=2, segment_bytes=48 * 1024, total_bytes=400 * 1024)


def sync_env(tmp_path: Path, log_dir: Path, pg_url: str, *, session_spark: bool = False, **overrides: str) -> dict[str, str]:
    """A ``kts sync`` subprocess's environment: its own KTS_HOME, Dagster home and remote tier, on
    ``pg_url``. Spark is a classic local[2] session in the sync's own process (the kill and
    signal tests are about that process), or with ``session_spark`` the session's Spark Connect
    server (tests/fixtures_spark.py; the test must be marked ``spark``)."""
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir(exist_ok=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    spark = {} if session_spark else {"KTS_SPARK_MASTER": "local[2]"}
    return {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
            "KTS_REMOTE_URI": (tmp_path / "remote").as_uri(), "DAGSTER_HOME": str(dagster_home), **spark, **overrides}


def kts(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_a_partition_whose_copy_fails_fails_the_pass_by_name_and_the_printed_lag_is_the_status_lag(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, CONFIG)
    eligible = _eligible(log_dir)
    # orders-0: one bit flipped inside its second closed segment (a batch fails its CRC).
    flipped = eligible["orders-0"][1].log
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    # orders-1: its first closed segment cut short inside a batch (invalid bytes at its end).
    cut = eligible["orders-1"][0].log
    os.truncate(cut, cut.stat().st_size - 7)
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)

    result = kts(env, "sync")

    assert result.returncode == 1, result.stderr[-3000:]
    # Each failure is said once, in kts's own lines: not again by the run's log as it happened
    # (Dagster's console, with a stack trace of the failed blocking check; the copier's own error).
    assert all(line.startswith(("kts: ", "sync: ")) for line in result.stderr.splitlines()), result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "kts: ERROR" not in result.stderr
    failed_lines = {line.split(":")[1].strip(): line for line in result.stderr.splitlines()
                    if line.startswith("kts: ") and line.split(":")[1].strip() in ("orders-0", "orders-1", "page.views-0", "page.views-1")}
    assert sorted(failed_lines) == ["orders-0", "orders-1"], result.stderr[-3000:]
    assert str(flipped) in failed_lines["orders-0"] or "CRC" in failed_lines["orders-0"], failed_lines
    assert "sync failed for 2 of 4 partitions" in result.stderr
    status = kts(env, "status", "--json")
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    lag_segments = sum(r["copy_lag_segments"] for r in rows)
    lag_bytes = sum(r["copy_lag_bytes"] for r in rows)
    assert lag_segments > 0
    assert f"copy lag {lag_segments} segments ({lag_bytes:,} bytes)" in result.stdout, result.stdout

    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.FAILURE
        # Every partition's tier state is recorded; the failed copies fail their blocking check.
        assert instance.get_materialized_partitions(dg.AssetKey("remote_segments")) == {"orders-0", "orders-1", "page.views-0", "page.views-1"}
        evaluations = [record.event_log_entry.dagster_event.event_specific_data
                       for record in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records]
        copy_checks = {e.partition: e for e in evaluations if e.check_name == "copy_completed" and e.partition}
        assert {key for key, e in copy_checks.items() if not e.passed} == {"orders-0", "orders-1"}
        assert "CRC" in copy_checks["orders-0"].description or str(flipped) in copy_checks["orders-0"].description


def test_a_wrong_environment_is_one_line_per_problem_within_seconds_before_spark(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=("orders",), partitions=1, segment_bytes=48 * 1024, total_bytes=100 * 1024))
    closed_port = free_loopback_port()
    cases = {
        "s3 endpoint down": dict(KTS_REMOTE_URI="s3://kts-bucket/tier", KTS_S3_ENDPOINT_URL=f"http://127.0.0.1:{closed_port}",
                                 AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"),
        "unwritable remote dir": dict(KTS_REMOTE_URI="file:///proc/kts-x"),
        "database port closed": dict(KTS_DATABASE_URL=f"postgresql://kts@127.0.0.1:{closed_port}/kts"),
    }
    expected = {"s3 endpoint down": f"127.0.0.1:{closed_port} is unreachable", "unwritable remote dir": "/proc/kts-x",
                "database port closed": "metadata store at 127.0.0.1"}
    for name, overrides in cases.items():
        env = sync_env(tmp_path, log_dir, pg_url, **overrides)
        result = kts(env, "sync", timeout=600)  # hang-only; "before Spark" is what the lines below check
        assert result.returncode == 1, (name, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kts: ") and expected[name] in lines[0], (name, lines)
        assert "Traceback" not in result.stderr and "spark" not in result.stderr.lower(), name
        assert not (Path(env["DAGSTER_HOME"]) / "storage").exists(), f"{name}: a Dagster run was started"
        assert not (Path(env["KTS_HOME"]) / "spark-connect").exists(), f"{name}: a Spark Connect server was started"
