"""The pass itself (kts_assets.sync.run_pass), which `kts sync` and the CLI server run and print:
called on its own, it copies every eligible segment of the log dirs through Dagster and returns
what it did and the tiers' totals as `kts status` reports them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kts_resources.kafka.simulator.simulate import simulate

from .conftest import REPO_ROOT
from .test_copier import _eligible
from .test_sync_outcome import CONFIG, kts, sync_env

PASS = """
import json
from kts_assets.sync import log_dir_partition_keys, run_pass
from kts_resources import settings
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_storage.factory import remote_storage_from_uri

said = []
done = run_pass(log_dir_partition_keys(), RemoteLogMetadataStore.from_env,
                lambda: remote_storage_from_uri(settings.remote_uri()), say=said.append)
print(json.dumps({"keys": done.keys, "new_keys": done.new_keys, "copied_segments": done.outcome.copied_segments,
                  "failed": done.outcome.failed, "runs": done.outcome.run_ids, "topics_deleted": done.topics_deleted,
                  "rows": [row for row, _lost in done.status], "unreadable": done.unreadable, "said": said}))
"""


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_the_pass_copies_every_eligible_segment_and_returns_the_totals_kts_status_reports(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, CONFIG)
    eligible = _eligible(log_dir)
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)

    ran = subprocess.run([sys.executable, "-c", PASS], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)

    assert ran.returncode == 0, ran.stderr
    done = json.loads(ran.stdout.splitlines()[-1])
    assert sorted(done["keys"]) == sorted(eligible) == done["new_keys"]  # a first pass: every partition is new
    assert done["copied_segments"] == sum(len(segments) for segments in eligible.values()) > 0
    assert (done["failed"], done["topics_deleted"], done["unreadable"]) == ({}, [], {})
    assert len(done["runs"]) >= 1 and any(line.startswith("copy_job over ") for line in done["said"])
    assert all(row["copy_lag_segments"] == 0 for row in done["rows"])
    status = kts(env, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == done["rows"]
