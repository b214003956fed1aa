"""A ``kts sync`` pass leaves out the partitions where nothing changed since their last clean pass
(kts_assets.sync_skip): a no-op pass runs nothing and the UI's numbers stay those of `kts status`;
one new rolled segment in one partition of many runs exactly that partition. What decides it —
each partition's fingerprint, its due time under retention, the store's change marks it is made
from — is specified here too."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import dagster as dg
import pytest

from kts_assets.sync_skip import unchanged
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.pass_fingerprint import Fingerprint, due_ms, pass_fingerprints
from kts_resources.tiering.retention import RetentionConfig
from kts_resources.tiering.tiers import topic_id_partition

from .conftest import REPO_ROOT
from .partition_steps import copy_each_partition
from .test_sync_outcome import sync_env

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
SMALL = SimulationConfig(seed=11, topics=("orders", "payments"), partitions=2, segment_bytes=24 * 1024, total_bytes=160 * 1024)


# --- the store's change marks ---------------------------------------------------------------------


@pytest.fixture
def copied(tmp_path, metadata_store):
    """A simulated log dir with every eligible segment copied: (log dir, store, its partitions' tips)."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, SMALL)
    copy_each_partition(LogDir(log_dir), metadata_store, remote_storage_from_uri((tmp_path / "remote").as_uri()))
    tips = [topic_id_partition(p, metadata_store) for p in LogDir(log_dir).partitions()]
    return log_dir, metadata_store, tips


def test_a_partitions_change_mark_moves_with_its_store_rows_and_only_its_own(copied):
    _log_dir, store, tips = copied
    before = store.partition_change_marks()
    assert store.partition_change_marks() == before and len(before) == len(tips)
    victim, other = tips[0], tips[1]
    store.record_lost_range(victim, 0, 3, how_found="test")
    after_loss = store.partition_change_marks()
    assert after_loss[(victim.topic_id, victim.partition)] != before[(victim.topic_id, victim.partition)]
    assert {k: v for k, v in after_loss.items() if k != (victim.topic_id, victim.partition)} == \
           {k: v for k, v in before.items() if k != (victim.topic_id, victim.partition)}
    first = store.list_remote_log_segments(other, states={FINISHED})[0]
    store.record_segment_damage(first.segment_id, "a flipped bit")
    assert store.partition_change_marks()[(other.topic_id, other.partition)] != after_loss[(other.topic_id, other.partition)]


# --- the fingerprint and the decision ------------------------------------------------------------


def test_a_partitions_fingerprint_changes_when_its_files_do_and_no_other_does(copied, tmp_path, monkeypatch):
    log_dir, store, _tips = copied
    kts_home = tmp_path / "kts_home"
    monkeypatch.setenv("KTS_HOME", str(kts_home))  # where the inventories would be
    before = pass_fingerprints([log_dir], store, kts_home)
    assert set(before) == {"orders-0", "orders-1", "payments-0", "payments-1"}
    assert pass_fingerprints([log_dir], store, kts_home) == before
    active = LogDir(log_dir).partitions()[0].segments()[-1].log  # orders-0's active segment gains a byte
    with open(active, "ab") as f:
        f.write(b"\0")
    after = pass_fingerprints([log_dir], store, kts_home)
    assert [k for k in before if before[k] != after[k]] == ["orders-0"]


def test_the_due_time_is_the_oldest_remote_segments_largest_timestamp_plus_the_shorter_retention():
    config = RetentionConfig(retention_ms=7_000, local_retention_ms=2_000)
    assert due_ms([5_000, 1_000, 9_000], config) == 3_000
    assert due_ms([1_000], RetentionConfig(retention_ms=7_000, local_retention_ms=-1)) == 8_000
    assert due_ms([1_000], RetentionConfig(retention_ms=-1, local_retention_ms=-1)) is None  # never by time
    assert due_ms([], config) is None  # nothing remote: local retention waits for a copy


def test_a_partition_is_left_out_only_with_its_fingerprint_planned_run_and_due_time_as_recorded():
    tip = TopicIdPartition(uuid.uuid4(), TopicPartition("t", 0))
    now = {key: Fingerprint(tip, "d", 5_000) for key in ("same", "changed", "replanned", "due", "new")}
    now["changed"] = Fingerprint(tip, "d2", 5_000)
    planned = {"same": 7, "changed": 7, "replanned": 8, "due": 7, "new": 7}
    recorded = {key: ["d", 5_000, 7] for key in ("same", "changed", "replanned")} | {"due": ["d", 4_000, 7]}
    assert unchanged(list(now), now, planned, recorded, now_ms=4_500) == ["same"]


# --- whole passes -----------------------------------------------------------------------------

PASS = """
import json
from kts_assets.sync import log_dir_partition_keys, run_pass
from kts_resources import settings
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_storage.factory import remote_storage_from_uri

said = []
done = run_pass(log_dir_partition_keys(), RemoteLogMetadataStore.from_env,
                lambda: remote_storage_from_uri(settings.remote_uri()), say=said.append)
print(json.dumps({"copied_segments": done.outcome.copied_segments, "failed": done.outcome.failed,
                  "runs": done.outcome.run_ids, "rows": [row for row, _lost in done.status], "said": said}))
"""
TOPICS = ("orders", "payments")
HOUR_MS = 3_600_000


def append_rolled_segment(root, keys, timestamp_ms: int) -> None:
    """One rolled segment of one small batch appended to each partition of ``keys`` (made if new)."""
    with BrokerLogDir(root, LogConfig(segment_bytes=1 << 20), seed=3) as broker:
        for key in keys:
            topic, _, partition = key.rpartition("-")
            log = broker.partition(topic, int(partition))
            records = [NewRecord(timestamp_ms, f"k{i}".encode(), bytes(100)) for i in range(10)]
            log.append(build_batch(records, base_offset=0), leader_epoch=0)
            log.roll()
            log.update_high_watermark(log.log_end_offset)
        broker.checkpoint()


def run_pass(env) -> dict:
    ran = subprocess.run([sys.executable, "-c", PASS], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.splitlines()[-1])


def materializations(instance: dg.DagsterInstance) -> dict[str, list[dict]]:
    """remote_segments' materialisations per partition, newest first, as their metadata values."""
    records = instance.fetch_materializations(dg.AssetKey("remote_segments"), limit=1000).records
    out: dict[str, list[dict]] = {}
    for record in records:
        metadata = record.asset_materialization.metadata
        out.setdefault(record.partition_key, []).append({k: v.value for k, v in metadata.items()})
    return out


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_a_pass_runs_only_the_partitions_that_changed_and_the_ui_keeps_kts_status_numbers(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    keys = [f"{topic}-{p}" for topic in TOPICS for p in range(2)]
    recent = int(time.time() * 1000) - HOUR_MS  # an hour old: no retention takes it
    for _ in range(2):
        append_rolled_segment(log_dir, keys, recent)
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)
    first = run_pass(env)
    assert first["failed"] == {} and first["copied_segments"] == 2 * len(keys) and first["runs"]

    noop = run_pass(env)
    assert noop["runs"] == [] and noop["copied_segments"] == 0 and noop["failed"] == {}
    assert f"{len(keys)} of {len(keys)} partitions unchanged since their last pass: not run" in noop["said"]
    assert noop["rows"] == first["rows"]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        shown = materializations(instance)
    assert {key: len(m) for key, m in shown.items()} == {key: 1 for key in keys}  # nothing materialised again
    for row in noop["rows"]:
        latest = shown[f"{row['topic']}-{row['partition']}"][0]
        for name in ("remote_log_start_offset", "remote_log_end_offset", "high_watermark", "remote_segments", "remote_bytes",
                     "copy_lag_segments", "copy_lag_bytes", "local_segments"):
            assert latest[name] == row[name], (row, name)

    append_rolled_segment(log_dir, ["payments-1"], recent)
    one = run_pass(env)
    assert one["failed"] == {} and one["copied_segments"] == 1 and len(one["runs"]) == 1
    assert "copy_job over payments-1 .. payments-1 (1 partitions)" in one["said"]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        shown = materializations(instance)
        (run,) = [instance.get_run_by_id(run_id) for run_id in one["runs"]]
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert {key: len(m) for key, m in shown.items()} == {**{key: 1 for key in keys}, "payments-1": 2}
    row = next(r for r in one["rows"] if (r["topic"], r["partition"]) == ("payments", 1))
    assert shown["payments-1"][0]["remote_segments"] == row["remote_segments"] == 3
