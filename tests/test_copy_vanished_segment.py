"""A segment whose files vanish while the copy works on it (the broker's retention deleting it, or
renaming it to ``.deleted``): the next pass must not copy the preceding segment again over the
hole, and the hole must be recorded as a lost range — never papered over by taking a segment's
end from the next file's base offset (issue 34, finding 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.tiering.copier import copy_partition
from kts_resources.kafka.logdir import LogDir, PartitionDir
from kts_resources.kafka.segment import scan_segment_file
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.reading.reader import PartitionReader, ReadError
from kts_resources.reading.remote_index_check import check_partition_index
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.maintenance.restore import RestoreError, restore_partition
from kts_resources.tiering.tiers import LocatedPartition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.fixture
def log_dir(tmp_path) -> Path:
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=11, topics=("orders",), partitions=1, total_bytes=240 * 1024, segment_bytes=24 * 1024))
    return root


def _last_offset(segment) -> int:
    _size, scan = scan_segment_file(segment.log)
    return scan.batches[-1].last_offset


def _vanishing_after_listing(partition: PartitionDir, victim_base: int) -> PartitionDir:
    """The partition as the copy sees it, with the broker's retention renaming the segment at
    ``victim_base`` to ``.deleted`` right after the copy's first listing (as Kafka's asynchronous
    segment deletion does): between the listing and the segment's verification."""
    done: list[bool] = []

    class RetentionMidCopy(PartitionDir):
        def segments(self):
            listed = super().segments()
            if not done:
                done.append(True)
                for path in self.path.glob(f"{victim_base:020d}.*"):
                    path.rename(path.with_name(path.name + ".deleted"))
            return listed

    return RetentionMidCopy(partition.path, partition.topic_partition)


def test_a_segment_vanished_mid_copy_leaves_no_overlap_and_its_range_is_recorded_lost(log_dir, metadata_store, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    logs = LogDir(log_dir)
    [partition] = logs.partitions()
    segments = partition.segments()
    assert len(segments) >= 6
    before, victim, after = segments[1], segments[2], segments[3]
    tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)

    first = copy_partition(_vanishing_after_listing(partition, victim.base_offset), logs, metadata_store, storage)
    assert [md.start_offset for md in first.copied] == [s.base_offset for s in segments[:2]]
    assert first.stopped is not None and str(victim.log) in first.stopped

    second = copy_partition(partition, logs, metadata_store, storage)
    assert second.stopped is None
    assert before.base_offset not in [md.start_offset for md in second.copied], "the preceding segment was copied again"
    assert [md.start_offset for md in second.copied][0] == after.base_offset

    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    local = {s.base_offset: s for s in partition.segments()}
    for a, b in zip(finished, finished[1:]):
        assert a.end_offset < b.start_offset, f"finished segments {a.start_offset}..{a.end_offset} and {b.start_offset}.. overlap"
    for md in finished:  # every end is its last batch's, never the next file's base offset - 1
        assert md.end_offset == _last_offset(local[md.start_offset])
    lost = (victim.base_offset, after.base_offset - 1)
    assert second.lost == [lost]
    assert [(r.start_offset, r.end_offset) for r in metadata_store.lost_ranges(tip)] == [lost]

    # Reads: the latest tiered offset is the last one copied; an offset in the hole is no record.
    located = LocatedPartition(partition.topic_partition.dir_name, logs, partition, owned=False)
    reader = PartitionReader("orders", 0, located=located, store=metadata_store, rsm=storage, index_dir=None)
    assert reader.offsets("latest-tiered").offset == finished[-1].end_offset
    with pytest.raises(ReadError, match=f"{lost[0]}..{lost[1]}"):
        reader.fetch(lost[0] + 1)
    up_to_hole = reader.fetch(before.base_offset, max_bytes=1 << 30)
    assert up_to_hole.batches and up_to_hole.next_offset == lost[0]  # stops at the hole, never jumps over it

    # Later passes: nothing more to do, no new loss, and the remote log index builds cleanly.
    third = copy_partition(partition, logs, metadata_store, storage)
    assert third.stopped is None and third.copied == [] and third.lost == []
    directory = tmp_path / "index"
    index_cache.build_partition_index(directory, finished, lambda md: index_cache.read_segment_entries(storage, md))
    problems, _entries = check_partition_index(directory, finished)
    assert problems == []

    # Restore: from after the hole it succeeds; across it, one line naming the hole.
    restored = restore_partition(metadata_store, storage, "orders", 0, tmp_path / "restored", from_offset=after.base_offset)
    assert restored.log_start_offset == after.base_offset and restored.log_end_offset == finished[-1].end_offset + 1
    with pytest.raises(RestoreError, match=f"offsets {lost[0]}..{lost[1]}"):
        restore_partition(metadata_store, storage, "orders", 0, tmp_path / "whole")


def test_a_segment_whose_last_batch_ends_before_the_next_file_is_recorded_by_its_last_batch(log_dir, metadata_store, tmp_path):
    """The name of the next file says nothing about where a segment's data ends."""
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    logs = LogDir(log_dir)
    [partition] = logs.partitions()
    segments = partition.segments()
    victim = segments[2]
    for path in partition.path.glob(f"{victim.base_offset:020d}.*"):
        path.unlink()
    result = copy_partition(partition, logs, metadata_store, storage)
    assert result.stopped is None
    by_start = {md.start_offset: md for md in result.copied}
    assert by_start[segments[1].base_offset].end_offset == victim.base_offset - 1
