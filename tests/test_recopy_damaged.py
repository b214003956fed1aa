"""A finished remote segment whose objects are missing or corrupt in the tier is found, recorded,
counted, and re-copied from its local segment by the next copy pass — a new segment id taking the
old one's place, the old one through the delete states — on both remote tiers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kts_resources.tiering.copier import _prepare, _upload_and_finish, copy_partition
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.quotas import SystemClock
from kts_resources.maintenance.remote_integrity import inspect_finished_segments
from kts_resources.remote_log import IndexType, RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import stored_objects
from .partition_steps import copy_each_partition

S = RemoteLogSegmentState


@pytest.fixture
def log_dir(tmp_path) -> Path:
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=4, topics=("orders",), partitions=1, total_bytes=160 * 1024, segment_bytes=24 * 1024))
    return root


def _partition(root: Path):
    partition = LogDir(root).partitions()[0]
    return partition, TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)


def _find_and_record(store, storage, tip) -> list:
    """What the remote_segments_in_bucket check does: inspect, then record each damaged segment."""
    found = inspect_finished_segments(storage, tip, store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED}))
    for md, problems in found.damaged:
        store.record_segment_damage(md.segment_id, "; ".join(problems))
    return found.damaged


def _copy_once(root: Path, store, storage):
    [result] = copy_each_partition(LogDir(root), store, storage)
    assert result.stopped is None and len(result.copied) >= 3
    return result.copied


def _object_key(storage, md, kind: str) -> str:
    return stored_objects(md.custom_metadata)[kind].key


@pytest.mark.parametrize("damage", ["log missing", "index corrupt", "log truncated"])
def test_a_damaged_remote_segment_is_recopied_by_the_next_pass(log_dir, metadata_store, remote_storage, damage):
    store, storage = metadata_store, remote_storage
    copied = _copy_once(log_dir, store, storage)
    victim = copied[1]
    if damage == "log missing":
        storage.delete_objects([_object_key(storage, victim, "log")])
    elif damage == "index corrupt":  # same size, one byte flipped: only the checksum tells
        key = _object_key(storage, victim, "index")
        data = bytearray(storage.fetch_object(key))
        data[3] ^= 0x40
        storage.put_object(key, bytes(data))
    else:
        key = _object_key(storage, victim, "log")
        storage.put_object(key, storage.fetch_object(key)[:-100])
    partition, tip = _partition(log_dir)

    damaged = _find_and_record(store, storage, tip)
    assert [md.segment_id for md, _ in damaged] == [victim.segment_id]
    assert [md.segment_id for md, _ in store.damaged_segments(tip)] == [victim.segment_id]  # counted until re-copied

    result = copy_partition(partition, LogDir(log_dir), store, storage)
    assert result.stopped is None and result.copied == [] and result.damaged_left == []
    [replacement] = result.recopied
    assert replacement.segment_id != victim.segment_id
    assert (replacement.start_offset, replacement.end_offset) == (victim.start_offset, victim.end_offset)
    assert store.segment(victim.segment_id).state is S.DELETE_SEGMENT_FINISHED
    assert store.damaged_segments(tip) == []
    local = next(s for s in partition.segments() if s.base_offset == victim.start_offset)
    assert storage.fetch_log_segment(replacement, 0) == local.log.read_bytes()
    assert storage.fetch_index(replacement, IndexType.OFFSET) == local.offset_index.read_bytes()
    # The replacement answers for its offsets; the tier is whole again.
    first_epoch = min(replacement.segment_leader_epochs)
    assert store.remote_log_segment_metadata(tip, first_epoch, replacement.start_offset).segment_id == replacement.segment_id
    finished = store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED})
    assert [md.start_offset for md in finished] == [md.start_offset for md in copied]
    assert inspect_finished_segments(storage, tip, finished).damaged == []
    # Nothing of the damaged copy is left in the tier.
    listed = {o.key for o in storage.list_objects(storage.keys.partition_prefix(tip))}
    assert not set(storage.segment_object_keys(victim).values()) & listed


def test_a_damaged_segment_whose_local_segment_is_gone_stays_counted(log_dir, metadata_store, remote_storage):
    store, storage = metadata_store, remote_storage
    copied = _copy_once(log_dir, store, storage)
    victim = copied[0]
    storage.delete_objects([_object_key(storage, victim, "log")])
    partition, tip = _partition(log_dir)
    _find_and_record(store, storage, tip)
    local = next(s for s in partition.segments() if s.base_offset == victim.start_offset)
    for path in (local.log, local.offset_index, local.time_index):
        path.unlink()  # the broker's retention took it

    result = copy_partition(partition, LogDir(log_dir), store, storage)
    assert result.recopied == [] and len(result.damaged_left) == 1
    assert "local segment is gone" in result.damaged_left[0]
    assert [md.segment_id for md, _ in store.damaged_segments(tip)] == [victim.segment_id]
    assert store.segment(victim.segment_id).state is S.COPY_SEGMENT_FINISHED  # never deleted: nothing replaces it


def test_a_crash_after_the_replacement_finished_is_completed_by_the_next_pass(log_dir, metadata_store, remote_storage):
    store, storage = metadata_store, remote_storage
    copied = _copy_once(log_dir, store, storage)
    victim = copied[2]
    storage.delete_objects([_object_key(storage, victim, "index")])
    partition, tip = _partition(log_dir)
    _find_and_record(store, storage, tip)
    # The re-copy up to the replacement's COPY_SEGMENT_FINISHED, then the process died.
    local = next(s for s in partition.segments() if s.base_offset == victim.start_offset)
    md, data, _chunks, _cut = _prepare(partition, local, tip, partition.leader_epochs(), 0, SystemClock())
    store.add_remote_log_segment_metadata(md)
    replacement = _upload_and_finish(store, storage, md, data, SystemClock())

    result = copy_partition(partition, LogDir(log_dir), store, storage)
    assert result.recopied == [] and result.stopped is None  # no second copy: the first one stands
    assert store.segment(victim.segment_id).state is S.DELETE_SEGMENT_FINISHED
    assert store.segment(replacement.segment_id).state is S.COPY_SEGMENT_FINISHED
    assert store.damaged_segments(tip) == []


def test_damage_is_recorded_once_and_only_on_finished_segments(log_dir, metadata_store, remote_storage):
    store, storage = metadata_store, remote_storage
    copied = _copy_once(log_dir, store, storage)
    assert store.record_segment_damage(copied[0].segment_id, "first finding") is True
    assert store.record_segment_damage(copied[0].segment_id, "second finding") is False
    _, tip = _partition(log_dir)
    assert [problem for _, problem in store.damaged_segments(tip)] == ["first finding"]
    store.update_remote_log_segment_metadata(copied[1].segment_id, S.DELETE_SEGMENT_STARTED, 1)
    assert store.record_segment_damage(copied[1].segment_id, "being deleted anyway") is False


# --- issue 34 finding 7: damage seen against another tier must not stick ---------------------------


def _two_tiers(tmp_path):
    from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage

    return FileSystemRemoteStorage(tmp_path / "right"), FileSystemRemoteStorage(tmp_path / "wrong")


def test_the_check_against_a_tier_holding_none_of_the_segments_records_no_damage(log_dir, metadata_store, tmp_path):
    """Every object of every finished segment missing is another tier (a wrong KTS_REMOTE_URI), not
    damage: one line saying so, a failed check, nothing recorded (nothing to re-copy later)."""
    from kts_assets.checks import _remote_segments_in_bucket
    from kts_resources.tiering.tiers import locate_partitions

    right, wrong = _two_tiers(tmp_path)
    _copy_once(log_dir, metadata_store, right)
    _, tip = _partition(log_dir)
    located, _ = locate_partitions([log_dir], ["orders-0"])
    ok, metadata, text = _remote_segments_in_bucket(located["orders-0"], metadata_store, wrong)
    assert not ok and metadata["damaged_segments"] == 0
    assert "none of" in text and wrong.location() in text and "KTS_REMOTE_URI" in text
    assert metadata_store.damaged_segments(tip) == []


def test_a_scrub_against_a_tier_holding_none_of_the_segments_records_no_damage(log_dir, metadata_store, tmp_path):
    from kts_resources.maintenance.scrub import scrub

    right, wrong = _two_tiers(tmp_path)
    _copy_once(log_dir, metadata_store, right)
    _, tip = _partition(log_dir)
    report = scrub(metadata_store, wrong, deep=True, grace_s=0)
    assert not report.clean and report.damaged == []
    assert len(report.wrong_tier) == 1 and "orders-0" in report.wrong_tier[0]
    assert metadata_store.damaged_segments(tip) == []


def _recorded_against_another_tier(store, tip, wrong) -> list:
    """What an older kts left behind after one sync against another tier: every finished segment
    recorded damaged ("missing" there)."""
    finished = store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED})
    for md in finished:
        assert store.record_segment_damage(md.segment_id, f"{wrong.location('x')}: missing")
    return finished


def test_damage_recorded_against_another_tier_is_cleared_not_recopied_by_the_next_pass(log_dir, metadata_store, tmp_path):
    right, wrong = _two_tiers(tmp_path)
    copied = _copy_once(log_dir, metadata_store, right)
    partition, tip = _partition(log_dir)
    _recorded_against_another_tier(metadata_store, tip, wrong)
    local = next(s for s in partition.segments() if s.base_offset == copied[0].start_offset)
    for path in (local.log, local.offset_index, local.time_index):
        path.unlink()  # the broker's retention took one: it could not be re-copied

    result = copy_partition(partition, LogDir(log_dir), metadata_store, right)
    assert result.stopped is None and result.recopied == [] and result.damaged_left == []
    assert metadata_store.damaged_segments(tip) == []
    assert all(metadata_store.segment(md.segment_id).state is S.COPY_SEGMENT_FINISHED for md in copied)


def test_a_deep_scrub_of_the_right_tier_clears_damage_recorded_against_another(log_dir, metadata_store, tmp_path):
    from kts_resources.maintenance.scrub import scrub

    right, wrong = _two_tiers(tmp_path)
    _copy_once(log_dir, metadata_store, right)
    _, tip = _partition(log_dir)
    _recorded_against_another_tier(metadata_store, tip, wrong)
    report = scrub(metadata_store, right, deep=True, grace_s=0)
    assert report.clean and report.damaged == []
    assert metadata_store.damaged_segments(tip) == []
