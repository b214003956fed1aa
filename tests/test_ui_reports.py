"""Every command that changes a partition tells the Dagster UI (issue 31, item 1): after `kts scrub`
records damage, `kts restore` rebuilds a partition into a log dir, or `kts recover` rebuilds the
metadata store, the instance's latest remote_segments and local_segments metadata of the partition
are `kts status --json`'s numbers, with nothing waiting for the next run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from kts_assets.assets.reporting import LOCAL_METADATA, TIER_METADATA
from kts_assets.instance import instance_config
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata import database
from kts_resources.remote_storage.base import stored_objects
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.tiering.status import STATUS_FIELDS

from .partition_steps import copy_each_partition

REPO_ROOT = Path(__file__).resolve().parent.parent
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.fixture
def env(tmp_path, pg_url, metadata_store, monkeypatch):
    """Two topics of two partitions copied to a directory tier; the environment of a `kts` process
    over them, with a Dagster instance of its own (its storage in the test's database)."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=13, topics=("orders", "page.views"), partitions=2, total_bytes=200 * 1024,
                                    segment_bytes=24 * 1024, transactional_producers=0))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    assert all(r.copied for r in copy_each_partition(LogDir(root), metadata_store, storage))
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(instance_config())
    values = {"KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(root), "KTS_HOME": str(tmp_path / "home"),
              "KTS_REMOTE_URI": (tmp_path / "remote").as_uri(), "DAGSTER_HOME": str(dagster_home), "KTS_CLI_SERVER": "off"}
    for name, value in values.items():  # this process reads the instance as the commands wrote it
        monkeypatch.setenv(name, value)
    return {**os.environ, **values}


def kts(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def status_of(env, key: str) -> dict:
    result = kts(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    [row] = [r for r in json.loads(result.stdout) if f"{r['topic']}-{r['partition']}" == key]
    return row


def latest_metadata(env, asset: str, key: str) -> dict:
    """What the UI shows of ``asset``'s partition ``key`` now: the metadata of its latest event,
    materialisation or observation."""
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        events = [record for fetch in (instance.fetch_materializations, instance.fetch_observations)
                  for record in fetch(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=1).records]
    assert events, f"{asset} {key}: nothing reported"
    latest = max(events, key=lambda record: record.storage_id)
    event = latest.asset_materialization or latest.asset_observation
    return {label: value.value for label, value in event.metadata.items()}


def assert_the_ui_shows_status(env, key: str, changed_by: str) -> dict:
    """remote_segments' and local_segments' latest metadata of ``key`` are `kts status --json`'s row."""
    row = status_of(env, key)
    remote, local = latest_metadata(env, "remote_segments", key), latest_metadata(env, "local_segments", key)
    assert remote["changed_by"] == local["changed_by"] == changed_by
    assert {name: remote[name] for name in TIER_METADATA if name in STATUS_FIELDS} == \
           {name: row[name] for name in TIER_METADATA if name in STATUS_FIELDS}
    assert {label: local[label] for label, name in LOCAL_METADATA.items() if name in STATUS_FIELDS} == \
           {label: row[name] for label, name in LOCAL_METADATA.items() if name in STATUS_FIELDS}
    return row


def test_a_scrub_that_finds_a_segment_missing_shows_it_damaged_in_the_ui(env, metadata_store, tmp_path):
    storage = remote_storage_from_uri(env["KTS_REMOTE_URI"])
    tip = next(t for t in metadata_store.partitions() if t.topic_partition.dir_name == "orders-0")
    first = min(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    storage.delete_objects([stored_objects(first.custom_metadata)["log"].key])
    scrubbed = kts(env, "scrub", "--grace", "0")
    assert scrubbed.returncode == 1 and "missing" in scrubbed.stderr, scrubbed.stderr
    row = assert_the_ui_shows_status(env, "orders-0", "kts scrub")
    assert row["damaged_remote_segments"] == latest_metadata(env, "remote_segments", "orders-0")["damaged_remote_segments"] == 1


def test_a_partition_restored_into_a_log_dir_shows_its_local_segments_in_the_ui(env, tmp_path):
    restored = tmp_path / "restored"
    restored.mkdir()
    env = {**env, "KTS_LOG_DIRS": f"{env['KTS_LOG_DIRS']},{restored}"}
    shutil.rmtree(Path(env["KTS_LOG_DIRS"].split(",")[0]) / "orders-1")  # the broker lost its disk's copy
    result = kts(env, "restore", "orders", "1", "--to", str(restored), "--json")
    assert result.returncode == 0, result.stderr
    row = assert_the_ui_shows_status(env, "orders-1", "kts restore")
    assert row["local_segments"] == json.loads(result.stdout)["segments"] > 0


def test_recover_into_a_lost_database_shows_every_recovered_partition_in_the_ui(env, pg_url, pg_admin_url, pg_template):
    before = {key: status_of(env, key) for key in ("orders-0", "page.views-1")}
    name = make_url(pg_url).database
    admin = database.create_engine(pg_admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:  # the database is lost, the Dagster instance's storage with it
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    admin.dispose()
    recovered = kts(env, "recover", "--json")
    assert recovered.returncode == 0, recovered.stderr
    for key, row in before.items():
        assert assert_the_ui_shows_status(env, key, "kts recover") == row
        assert latest_metadata(env, "retention_state", key)["delete_lag_segments"] == 0
