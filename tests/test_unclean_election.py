"""Two replicas of one partition, a kts beside each, one store and one tier (issue 30): after an
unclean election the tier serves the new leader's records, never the old leader's.

Broker 0 led epoch 0 and wrote offsets 0..89; broker 1 had replicated only 0..59 when it was
elected uncleanly (epoch 1 from offset 60) and wrote 60..139 itself. Broker 0's kts copied its
log before broker 1's kts looked, and (its broker not yet truncated) tries again afterwards. The
replicas roll at their own points. No metadata log: every replica copies, as in ZooKeeper mode.
"""

from __future__ import annotations

import pytest

from kts_resources.tiering.copier import copy_partition
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.indexes import verify_segment_indexes
from kts_resources.kafka.records import NewRecord, build_batch, read_records
from kts_resources.tiering.quotas import SystemClock
from kts_resources.reading.reader import PartitionReader
from .partition_steps import plan_and_expire

TOPIC, T0 = "orders", 1_700_000_000_000


def _batch(offset: int, value: str) -> bytes:
    return build_batch([NewRecord(T0 + offset, f"k{offset}".encode(), value.encode())], base_offset=0)


def _replica(path, node_id: int, segment_bytes: int, writes: list[tuple[int, str, int]], high_watermark: int) -> LogDir:
    with BrokerLogDir(path, LogConfig(segment_bytes=segment_bytes), seed=3, node_id=node_id) as broker:
        log = broker.partition(TOPIC, 0)
        for offset, value, epoch in writes:
            assert log.append(_batch(offset, value), leader_epoch=epoch).base_offset == offset
        log.roll()
        log.update_high_watermark(high_watermark)
        broker.checkpoint()
    return LogDir(path)


def _common(n: int) -> list[tuple[int, str, int]]:
    return [(i, f"v{i}", 0) for i in range(n)]


@pytest.fixture
def replicas(tmp_path):
    old_leader = _replica(tmp_path / "broker-0", 0, 900, _common(60) + [(i, f"old-leader-{i}", 0) for i in range(60, 90)], 90)
    new_leader = _replica(tmp_path / "broker-1", 1, 1300, _common(60) + [(i, f"new-leader-{i}", 1) for i in range(60, 140)], 140)
    return old_leader, new_leader


def verify_segment_indexes_of(partition) -> list:
    """Every finding of kts's index check over the partition's segments (none: Kafka would load them as they are)."""
    return [f for s in partition.segments() for f in verify_segment_indexes(s.log)]


def _remote_only(store, storage) -> PartitionReader:
    return PartitionReader(TOPIC, 0, located=None, store=store, rsm=storage, index_dir=None)


def _every_record(reader: PartitionReader) -> dict[int, str]:
    seen, offset = {}, reader.log_start_offset
    while offset <= reader.highest_remote_offset:
        result = reader.fetch(offset, 4096)
        for record in result.records:
            seen[record.offset] = record.value.decode()
        assert result.next_offset > offset
        offset = result.next_offset
    return seen


NEW_LINEAGE = {i: (f"v{i}" if i < 60 else f"new-leader-{i}") for i in range(140)}


def test_after_an_unclean_election_the_tier_serves_the_new_leaders_records(replicas, metadata_store, remote_storage):
    old_leader, new_leader = replicas
    [old_dir], [new_dir] = old_leader.partitions(), new_leader.partitions()
    assert [s.base_offset for s in old_dir.segments()] != [s.base_offset for s in new_dir.segments()]

    copy_partition(old_dir, old_leader, metadata_store, remote_storage, broker_id=0)
    assert _every_record(_remote_only(metadata_store, remote_storage)) == {i: v for i, v in
                                                                           {**NEW_LINEAGE, **{i: f"old-leader-{i}" for i in range(60, 90)}}.items() if i < 90}

    copied = copy_partition(new_dir, new_leader, metadata_store, remote_storage, broker_id=1)
    # From its divergence point on (the part of the segment holding offset 60 from there), not from the highest offset copied.
    assert copied.copied and copied.copied[0].start_offset == 60 < copied.copied[0].end_offset
    reader = _remote_only(metadata_store, remote_storage)
    assert _every_record(reader) == NEW_LINEAGE
    assert reader.offsets("latest-tiered").offset == 139 and reader.offsets("latest-tiered").leader_epoch == 1
    assert reader.offsets(T0 + 75).offset == 75 and reader.offsets(T0 + 75).leader_epoch == 1
    assert reader.offsets(T0 + 30).offset == 30 and reader.offsets(T0 + 30).leader_epoch == 0

    # The old leader's kts, its broker not truncated yet, copies nothing of its divergent records.
    again = copy_partition(old_dir, old_leader, metadata_store, remote_storage, broker_id=0)
    assert again.copied == [] and again.behind_lineage == 60
    assert _every_record(_remote_only(metadata_store, remote_storage)) == NEW_LINEAGE


def test_retention_deletes_the_old_leaders_divergent_segments_and_counts_overlaps_once(replicas, metadata_store, remote_storage):
    old_leader, new_leader = replicas
    [old_dir], [new_dir] = old_leader.partitions(), new_leader.partitions()
    copy_partition(old_dir, old_leader, metadata_store, remote_storage, broker_id=0)
    copy_partition(new_dir, new_leader, metadata_store, remote_storage, broker_id=1)
    tip = _remote_only(metadata_store, remote_storage).tip
    finished_before = metadata_store.list_remote_log_segments(tip)

    plan_and_expire(None, tip, metadata_store, remote_storage, clock=SystemClock())

    kept = metadata_store.list_remote_log_segments(tip)
    gone = {md.segment_id for md in finished_before} - {md.segment_id for md in kept}
    # Every old-leader segment wholly past the divergence point went; nothing the lineage needs did.
    assert gone and all(md.start_offset >= 60 or md.broker_id == 0 for md in finished_before if md.segment_id in gone)
    assert not any(md.broker_id == 0 and md.start_offset >= 60 for md in kept)
    reader = _remote_only(metadata_store, remote_storage)
    assert _every_record(reader) == NEW_LINEAGE
    # What a reader can read, each offset's bytes once: no more than the segments it reads from.
    assert sum(span.size_bytes for span in reader.spans) <= sum(md.segment_size_in_bytes for md in kept)


def test_restore_after_the_election_rebuilds_the_new_leaders_log(replicas, metadata_store, remote_storage, tmp_path):
    """The new leader's segment holding the divergence point went up from there on (its part below
    was in the tier: no offset twice), so the tier's lineage is whole segments end to end and a
    restore rebuilds exactly the new leader's records, none of the old leader's."""
    from kts_resources.maintenance.restore import restore_partition

    old_leader, new_leader = replicas
    [old_dir], [new_dir] = old_leader.partitions(), new_leader.partitions()
    copy_partition(old_dir, old_leader, metadata_store, remote_storage, broker_id=0)
    copied = copy_partition(new_dir, new_leader, metadata_store, remote_storage, broker_id=1)
    assert copied.copied[0].start_offset == 60  # cut at the divergence point, not the whole segment holding it
    spans = _remote_only(metadata_store, remote_storage).spans
    assert all(span.start_offset == span.segment.start_offset and span.end_offset == span.segment.end_offset for span in spans)

    restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "restored")

    [restored] = LogDir(tmp_path / "restored").partitions()
    records = {r.offset: r.value.decode() for s in restored.segments() for _h, rs in read_records(s.log.read_bytes()) for r in rs}
    assert records == NEW_LINEAGE
    assert not verify_segment_indexes_of(restored)
