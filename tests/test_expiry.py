"""Expiry in both tiers (kts_resources/tiering/expiry.py), as Kafka's tiered-storage integration tests
check it: records read back with fetch from each tier before and after. The log start offset is
recorded first, remote segments go through the delete states, owned log dirs lose their expired
local segments (only those safely remote), broker-owned ones are only reported on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kts_resources.tiering.expiry import PartitionRetention, expire_partition, plan_partition, remove_deleted_leftovers
from kts_resources.kafka.checkpoints import read_offset_checkpoint
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.quotas import ManualClock
from kts_resources.reading.reader import OffsetOutOfRangeError, TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.tiers import locate_partitions

from .partition_steps import copy_each_partition, plan_and_expire
from .tiered_reads import records_per_tier

TOPIC = "orders"
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


@pytest.fixture
def tiered(tmp_path, metadata_store):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=11, topics=(TOPIC,), partitions=1, total_bytes=300 * 1024, segment_bytes=32 * 1024,
                                    messages_per_second=10.0, transactional_producers=0))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    return root, storage, tip


def located(root: Path, owned: bool):
    key = f"{TOPIC}-0"
    found, _ = locate_partitions([root], [key], owned_log_dirs=[root] if owned else [])
    return found[key]


def test_delete_segments_by_retention_time_in_both_tiers(tiered, metadata_store):
    """Kafka's DeleteSegmentsByRetentionTimeTest, counted per tier with fetch."""
    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    assert len(finished) >= 5
    now = finished[3].max_timestamp_ms + 60_000
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=root.parent / "home")
    total = sum(records_per_tier(reader, TOPIC, 0))

    # Local retention first: the four oldest segments leave the owned local log, the remote tier keeps them.
    metadata_store.set_topic_config(TOPIC, "local.retention.ms", now - finished[3].max_timestamp_ms - 1)
    result = plan_and_expire(located(root, owned=True), tip, metadata_store, storage, clock=ManualClock(now))
    assert result.local_deleted == [md.start_offset for md in finished[:4]] and result.remote_deleted == []
    local_start = finished[4].start_offset
    assert records_per_tier(reader, TOPIC, 0) == (local_start, total - local_start)

    # Then retention.ms takes the two oldest from the remote tier; the log start offset moves first.
    metadata_store.set_topic_config(TOPIC, "retention.ms", now - finished[1].max_timestamp_ms)
    plan = plan_partition(located(root, owned=True), tip, metadata_store, now_ms=now)
    assert [e.start_offset for e in plan.remote.expired] == [md.start_offset for md in finished[:2]]
    result = expire_partition(plan, located(root, owned=True), metadata_store, storage, clock=ManualClock(now))
    new_start = finished[2].start_offset
    assert result.log_start_offset == new_start == metadata_store.partition_state(tip).log_start_offset
    assert result.remote_deleted == [md.start_offset for md in finished[:2]]
    for md in finished[:2]:
        assert metadata_store.segment(md.segment_id).state == DELETE_FINISHED
        assert not any((p := storage.keys.parse(o.key)) and p.segment_id == md.segment_id.id for o in storage.list_objects())
    assert read_offset_checkpoint(root / "log-start-offset-checkpoint")[TopicPartition(TOPIC, 0)] == new_start
    with pytest.raises(OffsetOutOfRangeError):
        reader.partition(TOPIC, 0).fetch(0)
    # No transactions here, so every offset is a record.
    assert records_per_tier(reader, TOPIC, new_start) == (local_start - new_start, total - local_start)
    # A second pass has nothing to do: the plan converged.
    assert not plan_partition(located(root, owned=True), tip, metadata_store, now_ms=now).has_work


def test_a_plan_comes_back_from_its_trip_as_json_unchanged(tiered, metadata_store):
    """A Spark task plans, the driver carries the plan out: the plan crosses as its own JSON."""
    root, _storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    now = finished[3].max_timestamp_ms + 60_000
    metadata_store.set_topic_config(TOPIC, "retention.ms", now - finished[1].max_timestamp_ms)
    metadata_store.set_topic_config(TOPIC, "local.retention.ms", now - finished[3].max_timestamp_ms - 1)
    plan = plan_partition(located(root, owned=True), tip, metadata_store, now_ms=now)
    assert plan.remote.expired and plan.local.expired and plan.has_work
    assert [e.segment_id for e in plan.remote.expired] == [md.segment_id.id for md in finished[:2]]
    assert PartitionRetention.from_json(plan.to_json()) == plan


def test_expiry_carries_out_the_plan_it_is_given_and_never_plans_again(tiered, metadata_store):
    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    now = finished[3].max_timestamp_ms + 60_000
    metadata_store.set_topic_config(TOPIC, "retention.ms", now - finished[1].max_timestamp_ms)
    plan = plan_partition(located(root, owned=False), tip, metadata_store, now_ms=now)
    assert [e.start_offset for e in plan.remote.expired] == [md.start_offset for md in finished[:2]]
    # Retention tightened after the plan was made: expiry deletes what the plan says, not more.
    metadata_store.set_topic_config(TOPIC, "retention.ms", 1)
    result = expire_partition(plan, located(root, owned=False), metadata_store, storage, clock=ManualClock(now))
    assert result.remote_deleted == [md.start_offset for md in finished[:2]]
    assert [md.start_offset for md in metadata_store.list_remote_log_segments(tip, states={FINISHED})] == [
        md.start_offset for md in finished[2:]]
    # The same plan again (a second run that planned before the first took the lock): what is no
    # longer COPY_SEGMENT_FINISHED is neither deleted again nor counted.
    again = expire_partition(plan, located(root, owned=False), metadata_store, storage, clock=ManualClock(now))
    assert again.remote_deleted == [] and again.remote_bytes_deleted == 0
    assert again.log_start_offset == result.log_start_offset == finished[2].start_offset


def test_a_broker_owned_log_dir_is_only_reported_on(tiered, metadata_store):
    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    metadata_store.set_topic_config(TOPIC, "local.retention.ms", 1)
    logs_before = sorted(p.name for p in (root / f"{TOPIC}-0").iterdir())
    plan = plan_partition(located(root, owned=False), tip, metadata_store, now_ms=finished[-1].max_timestamp_ms + 10_000)
    assert len(plan.local.expired) == len(finished)  # every copied segment may go...
    result = expire_partition(plan, located(root, owned=False), metadata_store, storage,
                              clock=ManualClock(finished[-1].max_timestamp_ms + 10_000))
    assert result.local_deleted == [] and result.remote_deleted == []  # ...but the broker deletes them
    assert sorted(p.name for p in (root / f"{TOPIC}-0").iterdir()) == logs_before


def test_local_retention_never_takes_a_segment_that_is_not_remote(tiered, metadata_store):
    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    metadata_store.set_topic_config(TOPIC, "local.retention.ms", 1)
    # More data rolls more segments, not copied yet.
    simulate(root, SimulationConfig(seed=12, topics=(TOPIC,), partitions=1, total_bytes=100 * 1024, segment_bytes=32 * 1024,
                                    messages_per_second=10.0, transactional_producers=0))
    segments = located(root, owned=True).partition.segments()
    assert len(segments) > len(finished) + 1
    result = plan_and_expire(located(root, owned=True), tip, metadata_store, storage,
                             clock=ManualClock(finished[-1].max_timestamp_ms + 10_000))
    assert result.local_deleted == [md.start_offset for md in finished]
    left = [s.base_offset for s in located(root, owned=True).partition.segments()]
    assert left == [s.base_offset for s in segments[len(finished):]]
    assert metadata_store.partition_state(tip).log_start_offset == 0  # local retention never moves it


def test_with_copying_disabled_local_retention_moves_the_log_start_and_loses_nothing(tiered, metadata_store):
    """KIP-950: with remote.log.copy.disable=true nothing more is copied, the local log keeps the
    topic's retention.*, and segments it deletes leave the log: the log start offset moves past
    them (UnifiedLog.deleteSegments), so they are expired data, never a lost range."""
    from kts_resources.tiering.lost_ranges import detect_lost_ranges

    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    metadata_store.set_topic_config(TOPIC, "remote.log.copy.disable", "true")
    simulate(root, SimulationConfig(seed=12, topics=(TOPIC,), partitions=1, total_bytes=100 * 1024, segment_bytes=32 * 1024,
                                    messages_per_second=10.0, transactional_producers=0))
    segments = located(root, owned=True).partition.segments()
    uncopied = [s for s in segments[:-1] if s.base_offset > finished[-1].end_offset]
    assert uncopied, "more closed segments than were copied"
    metadata_store.set_topic_config(TOPIC, "retention.bytes", 1)  # every closed segment is past it, in both tiers

    result = plan_and_expire(located(root, owned=True), tip, metadata_store, storage, clock=ManualClock(10**13))

    active = segments[-1].base_offset
    assert result.local_deleted == [s.base_offset for s in segments[:-1]]
    assert result.log_start_offset == active == metadata_store.partition_state(tip).log_start_offset
    assert read_offset_checkpoint(root / "log-start-offset-checkpoint")[TopicPartition(TOPIC, 0)] == active
    assert detect_lost_ranges(metadata_store, tip, located(root, owned=True).partition.segments(), how_found="test") == []
    assert metadata_store.lost_ranges(tip, include_acknowledged=True) == []
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=root.parent / "home")
    assert reader.partition(TOPIC, 0).offsets("earliest").offset == active
    with pytest.raises(OffsetOutOfRangeError):
        reader.partition(TOPIC, 0).fetch(uncopied[0].base_offset)


def test_deleted_leftovers_of_an_interrupted_local_delete_are_removed(tmp_path):
    (tmp_path / "00000000000000000000.log.deleted").write_bytes(b"x")
    (tmp_path / "00000000000000000100.log").write_bytes(b"")
    assert remove_deleted_leftovers(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000000100.log"]


def test_delete_segments_by_retention_size(tiered, metadata_store):
    """Kafka's DeleteSegmentsByRetentionSizeTest: retention.bytes over local-only plus remote bytes
    deletes the oldest remote segments while what stays is at least the limit."""
    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    segments = located(root, owned=True).partition.segments()
    only_local = sum(s.log.stat().st_size for s in segments if s.base_offset > finished[-1].end_offset)
    remote = sum(md.segment_size_in_bytes for md in finished)
    # A limit that keeps all but the two oldest remote segments.
    limit = only_local + remote - finished[0].segment_size_in_bytes - finished[1].segment_size_in_bytes
    metadata_store.set_topic_config(TOPIC, "retention.bytes", limit)
    metadata_store.set_topic_config(TOPIC, "retention.ms", -1)
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=root.parent / "home")
    total = sum(records_per_tier(reader, TOPIC, 0))
    result = plan_and_expire(located(root, owned=False), tip, metadata_store, storage, clock=ManualClock(10**13))
    assert result.remote_deleted == [finished[0].start_offset, finished[1].start_offset]
    new_start = finished[2].start_offset
    assert sum(records_per_tier(reader, TOPIC, new_start)) == total - new_start


def test_roll_and_offload_copies_each_rolled_segment_and_serves_it_after_local_deletion(tmp_path, metadata_store):
    """Kafka's RollAndOffloadActiveSegmentTest: segments rolled since the last pass are offloaded by
    the next one; once local retention took them, their records come from the remote tier."""
    root = tmp_path / "logs"
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    config = dict(seed=13, topics=(TOPIC,), partitions=1, segment_bytes=32 * 1024, transactional_producers=0)
    simulate(root, SimulationConfig(total_bytes=100 * 1024, **config))
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    first = len(metadata_store.list_remote_log_segments(tip, states={FINISHED}))
    simulate(root, SimulationConfig(total_bytes=100 * 1024, **config))  # more rolls
    copy_each_partition(LogDir(root), metadata_store, storage)
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    assert len(finished) > first
    metadata_store.set_topic_config(TOPIC, "local.retention.ms", 1)
    result = plan_and_expire(located(root, owned=True), tip, metadata_store, storage,
                             clock=ManualClock(finished[-1].max_timestamp_ms + 10_000))
    assert result.local_deleted == [md.start_offset for md in finished]
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=tmp_path / "home")
    remote, local = records_per_tier(reader, TOPIC, 0)
    assert remote == finished[-1].end_offset + 1  # every offloaded record, now only in the remote tier
    assert remote + local == reader.partition(TOPIC, 0).high_watermark


def objects_per_segment(storage) -> Counter:
    return Counter(parsed.segment_id for o in storage.list_objects() if (parsed := storage.keys.parse(o.key)))


@pytest.mark.parametrize("crash_at", ["after-log-start", "after-started", "mid-manifests", "mid-objects", "after-second-started",
                                      "after-first-finished", "mid-second-objects", "mid-local"])
def test_a_sigkill_at_any_step_of_expiry_is_finished_by_the_next_pass(tiered, metadata_store, pg_url, tmp_path, crash_at):
    """Killed at any step, the expiry leaves a state a rerun converges from: what it meant to delete
    is gone from both tiers, nothing it meant to keep is lost, nothing is orphaned."""
    import os
    import subprocess
    import sys

    root, storage, tip = tiered
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    now = finished[1].max_timestamp_ms + 1
    metadata_store.set_topic_config(TOPIC, "retention.ms", 1)  # the two oldest are past it at `now`
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": storage.location()}
    repo = Path(__file__).resolve().parent.parent

    def driver(*extra):
        return subprocess.run([sys.executable, "-m", "tests.expiry_driver", str(root), TOPIC, str(now), *extra],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=120)

    before = objects_per_segment(storage)
    crashed = driver(crash_at)
    assert crashed.returncode == -9, crashed.stderr
    assert metadata_store.partition_state(tip).log_start_offset == finished[2].start_offset  # recorded first, always
    # Where the kill left it: a segment with an object gone is STARTED or FINISHED, a FINISHED one has none left.
    after = objects_per_segment(storage)
    state = {md.segment_id.id: metadata_store.segment(md.segment_id).state for md in finished}
    for md in finished:
        if state[md.segment_id.id] is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            assert after[md.segment_id.id] == 0, f"segment {md.start_offset} FINISHED with objects left"
        elif after[md.segment_id.id] < before[md.segment_id.id]:
            assert state[md.segment_id.id] is RemoteLogSegmentState.DELETE_SEGMENT_STARTED, f"segment {md.start_offset}: objects gone while {state[md.segment_id.id].name}"
    rerun = driver()
    assert rerun.returncode == 0, rerun.stderr
    assert [m.start_offset for m in metadata_store.list_remote_log_segments(tip, states={FINISHED})] == \
        [m.start_offset for m in finished[2:]]
    assert metadata_store.list_remote_log_segments(tip, states={RemoteLogSegmentState.DELETE_SEGMENT_STARTED}) == []
    gone = {md.segment_id.id for md in finished[:2]}
    assert not any((p := storage.keys.parse(o.key)) and p.segment_id in gone for o in storage.list_objects())
    assert not list((root / f"{TOPIC}-0").glob("*.deleted"))
    assert not plan_partition(located(root, owned=True), tip, metadata_store, now_ms=now).has_work
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=tmp_path / "home")
    part = reader.partition(TOPIC, 0)
    assert part.log_start_offset == finished[2].start_offset
    assert sum(records_per_tier(reader, TOPIC, part.log_start_offset)) == part.high_watermark - part.log_start_offset
