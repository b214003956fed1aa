"""``kts recover`` after a real ``kts sync`` (Dagster and Spark: copy, remote log index, retention):
the database and this machine's index cache are lost; the tier alone brings back the same
``kts status``, ``kts offsets`` and ``kts fetch`` answers, and the remote log index the pipeline
shipped is taken from the tier without reading a segment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .test_recover import REPO_ROOT, _answers, _drop_and_recreate, kts

pytestmark = pytest.mark.spark  # kts sync runs Spark (tests/fixtures_spark.py)


def test_after_a_sync_and_a_lost_database_recover_gives_the_same_answers(tmp_path, pg_url, pg_admin_url, pg_template):
    log_dir, dagster_home, remote, home = tmp_path / "logs", tmp_path / "dagster", tmp_path / "remote", tmp_path / "home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    simulate(log_dir, SimulationConfig(seed=13, topics=("orders", "page.views"), partitions=2, total_bytes=320 * 1024,
                                       segment_bytes=24 * 1024))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(home),
           "KTS_REMOTE_URI": remote.as_uri(), "DAGSTER_HOME": str(dagster_home)}
    synced = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=900)
    assert synced.returncode == 0, synced.stderr[-3000:]
    first = sorted((log_dir / "orders-0").glob("*.log"))[0]
    for f in (log_dir / "orders-0").glob(first.stem + ".*"):
        f.unlink()  # the broker's retention: reads of it go to the remote tier
    before = _answers(env, log_dir)
    shipped = sorted(p.relative_to(remote) for p in remote.rglob("*.remoteLogIndex"))
    assert shipped  # the pipeline's remote_log_index shipped the index beside the segments

    _drop_and_recreate(pg_url, pg_admin_url, pg_template)
    shutil.rmtree(home / "remote-log-index")  # a new machine: no index cache either
    out = json.loads(kts(env, "recover", "--json").stdout)
    assert out["segments_recovered"] == sum(row["remote_segments"] for row in before["status"]) > 4
    assert out["objects_without_manifest"] == 0 and out["index_errors"] == []
    assert out["index_segments_read"] == 0 and out["index_files_published"] == 0  # all from the shipped files
    assert _answers(env, log_dir) == before
