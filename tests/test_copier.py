"""The copy procedure (Kafka's RLMCopyTask): which segments go, what travels with them, what is
recorded, and what a failure or a crash at any step leaves behind — against a real PostgreSQL and
both remote tiers (a directory, and S3 through moto's HTTP endpoint)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.tiering.copier import copy_partition, segment_leader_epochs
from kts_resources.kafka.checkpoints import EpochEntry, read_offset_checkpoint, write_offset_checkpoint
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.quotas import ManualClock, RLMQuotaManager, InMemorySamples
from kts_resources.remote_log import IndexType, RemoteLogSegmentState, RemotePartitionDeleteState, TopicIdPartition
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .fixtures_s3 import make_s3_storage
from .partition_steps import copy_each_partition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
REPO_ROOT = Path(__file__).resolve().parent.parent


# --- planning ------------------------------------------------------------------------------------


def test_segment_leader_epochs_come_from_the_lineage_within_the_segment():
    lineage = [EpochEntry(0, 0), EpochEntry(3, 150), EpochEntry(5, 180), EpochEntry(6, 400)]
    assert segment_leader_epochs(lineage, {}, 100, 199) == {0: 100, 3: 150, 5: 180}
    assert segment_leader_epochs(lineage, {}, 200, 299) == {5: 200}


def test_segment_leader_epochs_fall_back_to_the_batches_when_the_lineage_is_missing():
    assert segment_leader_epochs([], {7: 100, 8: 105}, 100, 109) == {7: 100, 8: 105}
    assert segment_leader_epochs([], {}, 100, 109) == {0: 100}  # magic 0/1 data: epoch 0


# --- copying -------------------------------------------------------------------------------------


@pytest.fixture
def log_dir(tmp_path) -> Path:
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=9, topics=("orders", "page.views"), partitions=1,
                                    total_bytes=240 * 1024, segment_bytes=24 * 1024))
    return root


@pytest.fixture(params=["filesystem", "s3"])
def tier(request, tmp_path, monkeypatch):
    """(storage, environment for a subprocess) for each remote tier."""
    if request.param == "filesystem":
        uri = (tmp_path / "remote").as_uri()
        env = {"KTS_REMOTE_URI": uri}
        storage = remote_storage_from_uri(uri)
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = request.getfixturevalue("s3_bucket")
        env = {"KTS_REMOTE_URI": f"s3://{bucket}/tiered", "KTS_S3_ENDPOINT_URL": endpoint}
        storage = make_s3_storage(endpoint, bucket)
    return storage, env


def _eligible(root: Path) -> dict[str, list]:
    """Per partition, the segments the copy rule allows: closed and below min(HW, recovery point).
    The test suite's one statement of the rule (kts_resources.tiering.tiers states it for kts); the other
    tests compare with this, or with hand-computed offsets (tests/test_tiers.py)."""
    log_dir = LogDir(root)
    hws = read_offset_checkpoint(root / "replication-offset-checkpoint")
    rps = read_offset_checkpoint(root / "recovery-point-offset-checkpoint")
    out = {}
    for p in log_dir.partitions():
        bound = min(hws[p.topic_partition], rps[p.topic_partition])
        out[str(p.topic_partition)] = [s for s in p.segments() if not s.active and s.next_base_offset <= bound]
    return out


def _assert_remote_tier_mirrors_eligible_segments(root: Path, store, storage) -> None:
    """Every eligible segment COPY_SEGMENT_FINISHED exactly once, byte-identical, nothing else
    finished, and no object in the remote tier that a finished segment does not reference."""
    referenced: set[str] = set()
    eligible = _eligible(root)
    for partition in LogDir(root).partitions():
        tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
        finished = store.list_remote_log_segments(tip, states={FINISHED})
        assert [md.start_offset for md in finished] == [s.base_offset for s in eligible[str(partition.topic_partition)]]
        for md, segment in zip(finished, eligible[str(partition.topic_partition)]):
            assert md.end_offset == segment.next_base_offset - 1
            assert storage.fetch_log_segment(md, 0) == segment.log.read_bytes()
            assert storage.fetch_index(md, IndexType.OFFSET) == segment.offset_index.read_bytes()
            assert storage.fetch_index(md, IndexType.TIMESTAMP) == segment.time_index.read_bytes()
            referenced.update(storage.segment_object_keys(md).values())
        # The partition's remote log index files (shipped by the pipeline's remote_log_index) are referenced too.
        referenced.update(obj.key for obj in storage.list_objects(storage.keys.remote_index_prefix(tip)))
        unfinished = [md for md in store.list_remote_log_segments(tip) if md.state is not FINISHED and md.state is not RemoteLogSegmentState.DELETE_SEGMENT_FINISHED]
        assert unfinished == []
    listed = {obj.key for obj in storage.list_objects()}
    assert listed <= referenced, f"unreferenced objects: {sorted(listed - referenced)}"


def test_a_pass_copies_exactly_the_eligible_segments_byte_for_byte(log_dir, metadata_store, tier):
    storage, _ = tier
    results = copy_each_partition(LogDir(log_dir), metadata_store, storage)
    assert all(r.stopped is None and r.skipped is None for r in results)
    assert sum(len(r.copied) for r in results) == sum(len(v) for v in _eligible(log_dir).values()) > 2
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)


def test_the_copy_hands_the_index_cache_each_segments_entries_as_a_read_of_the_remote_object_finds_them(log_dir, metadata_store, tier, tmp_path):
    storage, _ = tier
    home = tmp_path / "kts-home"
    results = copy_each_partition(LogDir(log_dir), metadata_store, storage, index_cache_home=home)
    copied = [(r, md) for r in results for md in r.copied]
    assert len(copied) > 2
    for _r, md in copied:
        directory = index_cache.cache_directory(home, md.topic_id_partition)
        assert md.segment_id.id in index_cache.cached_segment_ids(directory)
        cached = (directory / index_cache.SEGMENTS_DIR / f"{md.segment_id.id}{index_cache.ENTRIES_SUFFIX}").read_bytes()
        assert index_cache.decode_segment_entries(cached) == index_cache.read_segment_entries(storage, md)  # from the tier


def test_a_copy_whose_index_entries_cannot_be_cached_still_copies(log_dir, metadata_store, tier, tmp_path, caplog):
    storage, _ = tier
    home = tmp_path / "not-a-directory"
    home.write_text("")
    with caplog.at_level(logging.WARNING, logger="kts_resources.tiering.copier"):
        results = copy_each_partition(LogDir(log_dir), metadata_store, storage, index_cache_home=home)
    assert all(r.stopped is None for r in results) and sum(len(r.copied) for r in results) > 2
    assert "not cached (the index build reads it)" in caplog.text
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)


def test_what_travels_with_a_segment_includes_snapshot_lineage_and_txn_index(log_dir, metadata_store, tier):
    storage, _ = tier
    result = copy_each_partition(LogDir(log_dir), metadata_store, storage)[0]
    partition = LogDir(log_dir).partitions()[0]
    for md in result.copied:
        end = md.end_offset
        snapshot = partition.producer_snapshot_path(end + 1)
        assert storage.fetch_index(md, IndexType.PRODUCER_SNAPSHOT) == snapshot.read_bytes()
        lineage = storage.fetch_index(md, IndexType.LEADER_EPOCH).decode()
        assert all(int(line.split()[1]) <= end for line in lineage.splitlines()[2:])
        assert md.segment_leader_epochs
    with_txn = [md for md, s in zip(result.copied, partition.segments()) if s.txn_index is not None]
    for md in with_txn:
        assert storage.fetch_index(md, IndexType.TRANSACTION)


def test_a_second_pass_copies_only_what_rolled_since(log_dir, metadata_store, tier):
    storage, _ = tier
    first = sum(len(r.copied) for r in copy_each_partition(LogDir(log_dir), metadata_store, storage))
    assert sum(len(r.copied) for r in copy_each_partition(LogDir(log_dir), metadata_store, storage)) == 0
    simulate(log_dir, SimulationConfig(seed=9, topics=("orders", "page.views"), partitions=1,
                                       total_bytes=120 * 1024, segment_bytes=24 * 1024))
    second = copy_each_partition(LogDir(log_dir), metadata_store, storage)
    assert sum(len(r.copied) for r in second) > 0
    assert first + sum(len(r.copied) for r in second) == sum(len(v) for v in _eligible(log_dir).values())
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)


def test_a_lower_high_watermark_holds_segments_back(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    checkpoint = log_dir / "replication-offset-checkpoint"
    hws = read_offset_checkpoint(checkpoint)
    partition = LogDir(log_dir).partitions()[0]
    second_base = partition.segments()[1].base_offset
    write_offset_checkpoint(checkpoint, {**hws, partition.topic_partition: second_base})
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert [md.start_offset for md in result.copied] == [0]


def test_a_corrupt_segment_is_never_copied_and_stops_its_partition(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    partition = LogDir(log_dir).partitions()[0]
    victim = partition.segments()[1].log
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert [md.start_offset for md in result.copied] == [0]
    assert result.stopped.startswith(f"{victim}: byte 0: batch fails its CRC")


def test_a_failed_upload_is_cleaned_up_through_the_delete_states(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    partition = LogDir(log_dir).partitions()[0]
    partition.segments()[1].time_index.unlink()  # the segment's files are incomplete: the copy fails
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert [md.start_offset for md in result.copied] == [0] and "failed and was cleaned up" in result.stopped
    tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
    states = [md.state for md in metadata_store.list_remote_log_segments(tip, states=set(RemoteLogSegmentState))]
    assert states == [FINISHED, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED]
    keys = {obj.key for obj in storage.list_objects()}
    assert keys == set(storage.segment_object_keys(result.copied[0]).values()) & keys


def test_a_recreated_topic_is_tiered_from_its_own_offsets_and_the_old_id_is_marked_deleted(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_each_partition(LogDir(log_dir), metadata_store, storage)
    old = {p.topic_partition: TopicIdPartition(p.metadata().topic_id, p.topic_partition) for p in LogDir(log_dir).partitions()}
    old_segments = {tp: metadata_store.list_remote_log_segments(tip) for tp, tip in old.items()}
    # Deleted and created again under the same names: new topic ids, offsets from 0 again.
    shutil.rmtree(log_dir)
    simulate(log_dir, SimulationConfig(seed=10, topics=("orders", "page.views"), partitions=1,
                                       total_bytes=96 * 1024, segment_bytes=24 * 1024))
    results = copy_each_partition(LogDir(log_dir), metadata_store, storage)
    assert all(r.skipped is None and r.stopped is None for r in results)
    for partition in LogDir(log_dir).partitions():
        tp = partition.topic_partition
        new = TopicIdPartition(partition.metadata().topic_id, tp)
        assert new.topic_id != old[tp].topic_id
        assert [md.start_offset for md in metadata_store.list_remote_log_segments(new)] == [
            s.base_offset for s in _eligible(log_dir)[str(tp)]]
        assert metadata_store.partition_state(old[tp]).delete_state is RemotePartitionDeleteState.DELETE_PARTITION_MARKED
        assert metadata_store.list_remote_log_segments(old[tp]) == old_segments[tp]  # kept for topic deletion


def test_a_dir_of_an_earlier_incarnation_is_skipped_with_both_ids_not_a_crash(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    partition = LogDir(log_dir).partitions()[0]
    earlier = partition.metadata().topic_id
    copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    now = uuid.uuid4()
    metadata_store.ensure_topic(partition.topic, now)  # re-created; this dir was left behind
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert result.copied == [] and str(partition.path) in result.skipped
    assert str(earlier) in result.skipped and str(now) in result.skipped


@pytest.mark.parametrize("configs, topic", [
    ({"remote.storage.enable": "false"}, "orders"),
    ({"remote.log.copy.disable": "true"}, "orders"),
    ({"cleanup.policy": "compact"}, "orders"),
])
def test_topics_that_are_not_tiered_are_skipped(log_dir, metadata_store, tmp_path, configs, topic):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    partition = next(p for p in LogDir(log_dir).partitions() if p.topic == topic)
    metadata_store.ensure_topic(topic, partition.metadata().topic_id, configs)
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert result.copied == [] and result.skipped
    assert list(storage.list_objects()) == []


def test_the_write_quota_is_checked_before_each_segment(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    clock = ManualClock(1_000_000)
    quota = RLMQuotaManager(20_000, window_num=11, window_size_seconds=1, clock=clock, samples=InMemorySamples())
    partition = LogDir(log_dir).partitions()[0]
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage, quota=quota, clock=clock)
    assert len(result.copied) > 2
    assert result.throttle_ms > 0  # ~24 KiB segments at 20 KB/s must wait
    assert quota.metrics().bytes_recorded == result.copied_bytes


# --- crashes and concurrency ---------------------------------------------------------------------


def _run_driver(log_dir: Path, env: dict, crash_at: str | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "tests.copy_driver", str(log_dir)] + ([crash_at] if crash_at else [])
    return subprocess.run(args, cwd=REPO_ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=180)


def _left_behind(log_dir: Path, store) -> list:
    """Rows a crashed pass left mid-way (neither finished copy nor finished delete)."""
    left = []
    for partition in LogDir(log_dir).partitions():
        tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
        left += store.list_remote_log_segments(
            tip, states={RemoteLogSegmentState.COPY_SEGMENT_STARTED, RemoteLogSegmentState.DELETE_SEGMENT_STARTED})
    return left


@pytest.mark.parametrize("crash_at, left_state, objects_left", [
    ("after-started", RemoteLogSegmentState.COPY_SEGMENT_STARTED, False),
    ("mid-upload", RemoteLogSegmentState.COPY_SEGMENT_STARTED, True),
    ("after-upload", RemoteLogSegmentState.COPY_SEGMENT_STARTED, True),
    ("mid-delete", RemoteLogSegmentState.DELETE_SEGMENT_STARTED, True),
])
def test_a_sigkill_at_any_step_is_repaired_by_the_next_pass(log_dir, pg_url, metadata_store, tier, crash_at, left_state, objects_left):
    storage, env = tier
    env = {**env, "KTS_DATABASE_URL": pg_url}
    crashed = _run_driver(log_dir, env, crash_at)
    assert crashed.returncode == -9, crashed.stderr
    [left] = _left_behind(log_dir, metadata_store)  # the crash really happened mid-way
    assert left.state is left_state
    assert bool(set(storage.segment_object_keys(left).values()) & {o.key for o in storage.list_objects()}) is objects_left
    rerun = _run_driver(log_dir, env)
    assert rerun.returncode == 0, rerun.stderr
    assert _left_behind(log_dir, metadata_store) == []
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)


def test_two_copy_processes_started_together_copy_each_segment_once(log_dir, pg_url, metadata_store, tier):
    storage, env = tier
    env = {**env, "KTS_DATABASE_URL": pg_url}
    args = [sys.executable, "-m", "tests.copy_driver", str(log_dir)]
    procs = [subprocess.Popen(args, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outputs]
    copied = [json.loads(o[0]) for o in outputs]
    for partition in copied[0]:
        both = copied[0][partition] + copied[1][partition]
        assert len(both) == len(set(both))  # no segment copied by both
    _assert_remote_tier_mirrors_eligible_segments(log_dir, metadata_store, storage)
