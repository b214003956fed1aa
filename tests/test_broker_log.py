"""The broker-like writer against the rules of Apache Kafka's broker, one rule per test.

Each test pins a behaviour of Kafka's UnifiedLog / LogSegment / ProducerStateManager /
ProducerAppendInfo / LeaderEpochFileCache that ``kts_resources.kafka.simulator.broker_log`` must reproduce
byte for byte (the expected values were worked out from Kafka's source, and the HashMap orders
were printed by a JVM's java.util.HashMap).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from kts_resources.kafka.simulator.broker_log import JavaLongHashMapOrder, LogConfig, PartitionLog
from kts_resources.kafka.checkpoints import EpochEntry, read_leader_epoch_checkpoint, write_leader_epoch_checkpoint
from kts_resources.kafka.logdir import list_producer_snapshots
from kts_resources.kafka.records import NewRecord, build_batch, build_control_batch
from kts_resources.kafka.snapshots import AbortedTxn, ProducerSnapshotEntry, read_producer_snapshot, read_txn_index

T0 = 1_700_000_000_000


def data(producer_id: int = -1, epoch: int = -1, sequence: int = -1, *, ts: int = T0, records: int = 1,
         transactional: bool = False, value: bytes = b"v") -> bytes:
    return build_batch(
        [NewRecord(ts + i, b"k", value) for i in range(records)], base_offset=0, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=sequence, is_transactional=transactional,
    )


@pytest.fixture
def log(tmp_path: Path):
    log = PartitionLog.open(tmp_path / "orders-0", LogConfig(segment_bytes=64 * 1024))
    yield log
    log.close()


# --- producer snapshots -------------------------------------------------------------------------


def test_java_long_hashmap_order_is_the_jvms(tmp_path):
    # Printed by java.util.HashMap<Long, …>.keySet() after the same puts and removes.
    m = JavaLongHashMapOrder()
    for k in (1000, 1001, 100000, 100001, 100002):
        m.put(k)
    assert list(m) == [100001, 100000, 100002, 1000, 1001]  # keys ≥ 2^16 have their high half mixed in
    m.clear()
    for k in (33, 1, 17, 49, 2, 18, 34, 50, 3, 19, 35, 51):
        m.put(k)
    assert list(m) == [33, 1, 17, 49, 2, 18, 34, 50, 3, 19, 35, 51]  # 16 buckets, insertion order within one
    m.put(4)  # the 13th key doubles the table; each bucket keeps its order
    assert list(m) == [33, 1, 2, 34, 3, 35, 4, 17, 49, 18, 50, 19, 51]
    m.remove(1)
    m.put(65)
    m.put(1)  # a key put again goes to the end of its bucket
    assert list(m) == [33, 65, 1, 2, 34, 3, 35, 4, 17, 49, 18, 50, 19, 51]
    crowded = JavaLongHashMapOrder()
    for k in (0, 16, 32, 48, 64, 80, 96, 112, 128, 5):
        crowded.put(k)  # a 9th key in one bucket of a small table doubles it instead of making a tree
    assert list(crowded) == [0, 32, 64, 96, 128, 5, 16, 48, 80, 112]
    assert crowded.capacity == 32


def test_a_snapshot_lists_producers_in_the_brokers_hashmap_order_not_by_id(log):
    for pid in (1000, 1001, 100000, 100001, 100002):
        log.append(data(pid, 0, 0), leader_epoch=0)
    log.roll()
    entries = read_producer_snapshot(list_producer_snapshots(log.directory)[5])
    assert [e.producer_id for e in entries] == [100001, 100000, 100002, 1000, 1001]


def marker(producer_id: int, epoch: int, *, commit: bool, coordinator_epoch: int = 0, ts: int = T0) -> bytes:
    return build_control_batch(base_offset=0, commit=commit, producer_id=producer_id, producer_epoch=epoch,
                               coordinator_epoch=coordinator_epoch, timestamp=ts)


def snapshot_entry(log: PartitionLog, producer_id: int):
    log.roll()
    offset = max(list_producer_snapshots(log.directory))
    return {e.producer_id: e for e in read_producer_snapshot(list_producer_snapshots(log.directory)[offset])}[producer_id]


# --- producer state (ProducerAppendInfo) --------------------------------------------------------


def test_a_marker_that_bumps_the_epoch_clears_the_batch_metadata_and_the_next_batch_must_start_at_sequence_zero(log):
    log.append(data(7, 0, 0, transactional=True, records=3), leader_epoch=0)
    log.append(marker(7, 1, commit=False, ts=T0 + 50), leader_epoch=0)  # the coordinator fenced epoch 0
    entry = snapshot_entry(log, 7)
    assert (entry.producer_epoch, entry.last_sequence, entry.last_offset, entry.offset_delta) == (1, -1, -1, 0)
    assert entry.timestamp == T0 + 50 and entry.current_txn_first_offset == -1
    with pytest.raises(ValueError, match="out-of-order sequence 5, expected 0"):
        log.append(data(7, 1, 5), leader_epoch=0)
    log.append(data(7, 1, 0), leader_epoch=0)


def test_a_coordinator_batch_without_a_base_sequence_is_not_sequence_checked_and_leaves_the_last_sequence_unset(log):
    # The group coordinator writes transactional offset commits with the producer's id and epoch
    # but NO_SEQUENCE; RecordBatch.lastSequence is then NO_SEQUENCE too.
    log.append(data(9, 0, 0, transactional=True), leader_epoch=0)
    log.append(data(9, 0, -1, records=4, transactional=True), leader_epoch=0)
    entry = snapshot_entry(log, 9)
    assert (entry.last_sequence, entry.last_offset, entry.offset_delta) == (-1, 4, 3)
    assert entry.current_txn_first_offset == 0


def test_a_batch_whose_last_offset_delta_disagrees_with_its_record_count_is_rejected(log):
    batch = bytearray(data(records=3))
    struct.pack_into(">i", batch, 23, 5)  # lastOffsetDelta 5 for 3 records
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    with pytest.raises(ValueError, match="3 records but lastOffsetDelta 5"):
        log.append(bytes(batch), leader_epoch=0)
    assert log.log_end_offset == 0


def test_a_batch_failing_its_crc_is_rejected_before_the_broker_restamps_it(log):
    batch = bytearray(data())
    batch[-1] ^= 1
    for log_append_time in (None, T0):  # stamping LogAppendTime rewrites the CRC, but comes after the check
        with pytest.raises(ValueError, match="CRC"):
            log.append(bytes(batch), leader_epoch=0, log_append_time=log_append_time)
    assert log.log_end_offset == 0


def test_a_batch_over_max_message_bytes_is_rejected(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(max_message_bytes=500))
    with pytest.raises(ValueError, match="exceeds max.message.bytes 500"):
        log.append(data(value=b"x" * 600), leader_epoch=0)
    log.append(data(value=b"x" * 400), leader_epoch=0)
    assert LogConfig().max_message_bytes == 1048588
    log.close()


def test_a_marker_from_an_older_coordinator_epoch_is_fenced(log):
    log.append(data(7, 0, 0, transactional=True), leader_epoch=0)
    log.append(marker(7, 0, commit=True, coordinator_epoch=4), leader_epoch=0)
    log.append(data(7, 0, 1, transactional=True), leader_epoch=0)
    end = log.log_end_offset
    with pytest.raises(ValueError, match="coordinator epoch 3, older than 4"):
        log.append(marker(7, 0, commit=True, coordinator_epoch=3), leader_epoch=0)
    assert log.log_end_offset == end
    log.append(marker(7, 0, commit=False, coordinator_epoch=4), leader_epoch=0)


def test_a_batch_larger_than_segment_bytes_is_rejected(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1024))
    with pytest.raises(ValueError, match="exceeds segment.bytes 1024"):
        log.append(data(value=b"x" * 2000), leader_epoch=0)
    assert log.log_end_offset == 0 and log.size == 0
    log.close()


# --- retention (UnifiedLog.deleteOldSegments) ---------------------------------------------------


def segmented_log(directory: Path, batches: int = 12, *, epochs: tuple[int, ...] = (0,)) -> PartitionLog:
    """A log whose batches of ~300 bytes roll every 3 batches; batch i at T0 + i seconds."""
    log = PartitionLog.open(directory, LogConfig(segment_bytes=1000))
    for i in range(batches):
        epoch = epochs[min(i * len(epochs) // batches, len(epochs) - 1)]
        log.append(data(ts=T0 + i * 1000, value=b"v" * 250), leader_epoch=epoch)
    return log


def bases(log: PartitionLog) -> list[int]:
    return [s.base_offset for s in log.segments()]


def test_retention_deletes_the_active_segment_too_by_rolling_first_when_the_high_watermark_is_at_the_log_end(tmp_path):
    log = segmented_log(tmp_path / "t-0", epochs=(0, 2))
    assert bases(log) == [0, 3, 6, 9] and log.log_end_offset == 12
    log.update_high_watermark(12)
    assert log.delete_old_segments(T0 + 60_000, retention_ms=1000) == [0, 3, 6, 9]
    # The log rolled to an empty active segment at the log end offset, which is all that is left.
    assert bases(log) == [12] and log.log_start_offset == 12
    # (Kafka opens the new segment's indexes lazily, on first use; kts has them ready at once.)
    assert sorted(p.name for p in log.directory.iterdir() if p.suffix in (".log", ".snapshot", ".txnindex", ".deleted")) == [
        "00000000000000000012.log", "00000000000000000012.snapshot",
    ]
    # LeaderEpochFileCache.truncateFromStart: the latest epoch now starts at the log start offset.
    assert read_leader_epoch_checkpoint(log.directory / "leader-epoch-checkpoint") == [EpochEntry(2, 12)]
    log.close()


def test_retention_keeps_the_active_segment_while_the_high_watermark_is_below_the_log_end(tmp_path):
    log = segmented_log(tmp_path / "t-0")
    log.update_high_watermark(11)
    assert log.delete_old_segments(T0 + 60_000, retention_ms=1000) == [0, 3, 6]
    assert bases(log) == [9] and log.log_start_offset == 9
    log.update_high_watermark(12)
    # retention.bytes = 0: the whole log is over the limit, the active segment included.
    assert log.delete_old_segments(T0, retention_bytes=0) == [9]
    assert bases(log) == [12] and log.size == 0
    assert log.delete_old_segments(T0 + 60_000, retention_ms=0, retention_bytes=0) == []  # an empty active one stays
    log.close()


def test_segments_wholly_below_the_log_start_offset_go_first_whatever_the_retention(tmp_path):
    segmented_log(tmp_path / "t-0").close()
    # A log start offset checkpointed inside segment 6..8 (DeleteRecords): 0..2 and 3..5 are below it.
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1000), log_start_offset=7, high_watermark=12)
    assert log.delete_old_segments(T0) == [0, 3]
    assert bases(log) == [6, 9] and log.log_start_offset == 7
    log.close()


def test_retention_deletes_only_the_snapshots_at_the_deleted_segments_base_offsets(tmp_path):
    log = segmented_log(tmp_path / "t-0", batches=5)  # segments 0, 3; a snapshot at 3
    log.close()
    # A clean shutdown left a snapshot at the log end offset (5), which is no segment's base.
    stray = tmp_path / "t-0" / "00000000000000000005.snapshot"
    stray.write_bytes((tmp_path / "t-0" / "00000000000000000003.snapshot").read_bytes())
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1000))
    for i in range(5, 12):
        log.append(data(ts=T0 + i * 1000, value=b"v" * 250), leader_epoch=0)
    assert bases(log) == [0, 3, 6, 9]
    log.update_high_watermark(12)
    assert log.delete_old_segments(T0 + 60_000, retention_ms=1000) == [0, 3, 6, 9]
    assert sorted(list_producer_snapshots(log.directory)) == [5, 12]
    log.close()


# --- leader epochs (LeaderEpochFileCache) ------------------------------------------------------


def test_reopening_trims_the_epoch_lineage_to_the_checkpointed_log_start_offset_and_the_log_end(tmp_path):
    segmented_log(tmp_path / "t-0", epochs=(0, 1, 3)).close()  # epochs start at 0, 4 and 8; LEO 12
    path = tmp_path / "t-0" / "leader-epoch-checkpoint"
    assert read_leader_epoch_checkpoint(path) == [EpochEntry(0, 0), EpochEntry(1, 4), EpochEntry(3, 8)]
    # An entry no batch has (an epoch assigned at the log end offset) is stale after a restart.
    write_leader_epoch_checkpoint(path, [EpochEntry(0, 0), EpochEntry(1, 4), EpochEntry(3, 8), EpochEntry(5, 12)])
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1000), log_start_offset=6, high_watermark=12)
    assert read_leader_epoch_checkpoint(path) == [EpochEntry(1, 6), EpochEntry(3, 8)]
    assert path.read_bytes() == b"0\n2\n1 6\n3 8\n"
    log.close()


# --- rolling and indexes (LogSegment.shouldRoll / append / onBecomeInactiveSegment) ------------


def seg_file(log: PartitionLog, base: int, suffix: str) -> bytes:
    return (log.directory / f"{base:020d}{suffix}").read_bytes()


def test_a_segment_takes_batches_while_its_size_plus_the_batch_fits_segment_bytes(tmp_path):
    size = len(data())
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=3 * size))
    rolled = [log.append(data(), leader_epoch=0).rolled for _ in range(7)]
    # size > segment.bytes − batch size rolls: three batches fill a segment exactly, the 4th rolls.
    assert rolled == [False, False, False, True, False, False, True]
    assert bases(log) == [0, 3, 6]
    log.close()


def test_segment_ms_counts_from_the_first_batchs_max_timestamp_and_rolls_only_past_it(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_ms=5000))
    log.append(data(ts=T0, records=2), leader_epoch=0)  # max timestamp T0 + 1
    assert not log.append(data(ts=T0 + 5001), leader_epoch=0).rolled  # exactly segment.ms later
    assert not log.append(data(ts=T0 - 9000), leader_epoch=0).rolled  # out of order: earlier
    assert log.append(data(ts=T0 + 5002), leader_epoch=0).rolled
    assert bases(log) == [0, 4]
    log.close()


def test_the_time_index_keeps_its_last_slot_for_the_entry_the_roll_appends(tmp_path):
    # segment.index.bytes 35: the offset index holds 4 entries (32 bytes), the time index 2 (24).
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_index_bytes=35, index_interval_bytes=0))
    assert len(seg_file(log, 0, ".index")) == 32 and len(seg_file(log, 0, ".timeindex")) == 24
    first = data(ts=T0 + 100)
    log.append(first, leader_epoch=0)
    log.append(data(ts=T0 + 50), leader_epoch=0)  # indexed: the max so far is the first batch's
    # One time entry is all a 2-slot time index takes before the segment counts as full.
    assert log.append(data(ts=T0 + 300), leader_epoch=0).rolled
    assert seg_file(log, 0, ".index") == struct.pack(">ii", 1, len(first))
    assert seg_file(log, 0, ".timeindex") == struct.pack(">qi", T0 + 100, 0)
    log.close()


def test_an_index_entry_goes_before_a_batch_once_more_than_index_interval_bytes_went_since_the_last(tmp_path):
    size = len(data(records=2))
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=size + 1))
    for i in range(6):
        log.append(data(ts=T0 + 10 * i, records=2), leader_epoch=0)
    log.roll()
    # Before batch 2 (2·size > size + 1 bytes since the start), then before batch 4: each entry is
    # (that batch's LAST offset, that batch's position) and (max timestamp so far, its batch's last offset).
    assert seg_file(log, 0, ".index") == struct.pack(">iiii", 5, 2 * size, 9, 4 * size)
    assert seg_file(log, 0, ".timeindex") == struct.pack(
        ">qiqiqi", T0 + 21, 5, T0 + 41, 9, T0 + 51, 11,  # the last one appended by the roll
    )
    log.close()


def test_a_rolled_segment_gets_its_final_time_entry_and_trimmed_indexes_and_the_new_one_preallocated_ones(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0")
    log.append(data(ts=T0, records=3), leader_epoch=0)  # offsets 0..2, max T0 + 2
    log.append(data(ts=T0 + 10), leader_epoch=0)  # offset 3: the largest timestamp
    log.append(data(ts=T0 + 5), leader_epoch=0)  # offset 4
    log.roll()
    assert seg_file(log, 0, ".index") == b""
    assert seg_file(log, 0, ".timeindex") == struct.pack(">qi", T0 + 10, 3)
    # The active segment's indexes: segment.index.bytes rounded down to whole entries, zeros.
    assert seg_file(log, 5, ".index") == bytes(10 * 1024 * 1024)
    assert seg_file(log, 5, ".timeindex") == bytes(10 * 1024 * 1024 // 12 * 12)
    log.close()


# --- transactions (UnifiedLog.append → LogSegment.updateTxnIndex) -------------------------------


def test_an_aborted_txn_is_indexed_in_the_segment_holding_the_marker_with_the_lso_of_the_other_open_txns(tmp_path):
    size = len(data(1, 0, 0, transactional=True))
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=3 * size))
    log.append(data(1, 0, 0, transactional=True), leader_epoch=0)  # 0: txn of producer 1 opens
    log.append(data(2, 0, 0, transactional=True), leader_epoch=0)  # 1: txn of producer 2 opens
    log.append(data(1, 0, 1, transactional=True), leader_epoch=0)  # 2
    result = log.append(marker(1, 0, commit=False), leader_epoch=0)  # 3: rolls, then aborts producer 1's
    assert result.rolled and result.segment_base_offset == 3
    # lastStableOffset: the first offset of the earliest OTHER open transaction (producer 2's, at 1).
    assert read_txn_index(log.directory / f"{3:020d}.txnindex") == [AbortedTxn(1, 0, 3, 1)]
    assert not (log.directory / f"{0:020d}.txnindex").exists()
    log.append(marker(2, 0, commit=True), leader_epoch=0)  # 4: a commit is not indexed
    log.append(data(3, 0, 0, transactional=True), leader_epoch=0)  # 5
    at = log.append(marker(3, 0, commit=False), leader_epoch=0).segment_base_offset  # 6: none open: marker + 1
    log.append(marker(3, 0, commit=False), leader_epoch=0)  # 7: an empty transaction: not indexed
    assert read_txn_index(log.directory / f"{at:020d}.txnindex") == [AbortedTxn(3, 5, 6, 7)]
    assert sorted(p.name for p in log.directory.glob("*.txnindex")) == [f"{3:020d}.txnindex", f"{at:020d}.txnindex"]
    # The high watermark plays no part in the recorded offset.
    assert log.high_watermark == 0
    log.close()


def test_after_a_marker_the_producer_keeps_its_last_batch_and_takes_the_markers_time_and_coordinator_epoch(log):
    log.append(data(4, 2, 0, transactional=True, records=3, ts=T0), leader_epoch=0)
    log.append(data(4, 2, 3, transactional=True, records=2, ts=T0 + 7), leader_epoch=0)  # offsets 3..4
    log.append(marker(4, 2, commit=True, coordinator_epoch=6, ts=T0 + 20), leader_epoch=0)
    entry = snapshot_entry(log, 4)
    assert entry == ProducerSnapshotEntry(4, 2, 4, 4, 1, T0 + 20, 6, -1)


def test_an_appended_batch_and_its_txn_entry_are_on_disk_when_append_returns(log):
    # Kafka's FileChannel writes leave nothing in a user-space buffer: a reader sees the batch the
    # index entries point at.
    log.append(data(5, 0, 0, transactional=True), leader_epoch=0)
    result = log.append(marker(5, 0, commit=False), leader_epoch=0)
    assert (log.directory / f"{0:020d}.log").stat().st_size == result.position + result.size
    assert read_txn_index(log.directory / f"{0:020d}.txnindex") == [AbortedTxn(5, 0, 1, 2)]


# --- replication (UnifiedLog.appendAsFollower / truncateTo, LeaderEpochFileCache.endOffsetFor) ----


def log_bytes(log: PartitionLog) -> bytes:
    return b"".join(seg_file(log, base, ".log") for base in bases(log))


def test_a_follower_appends_the_leaders_bytes_unchanged_and_rolls_once_per_fetched_chunk(tmp_path):
    leader = segmented_log(tmp_path / "leader" / "t-0", 8, epochs=(0, 3))
    follower = PartitionLog.open(tmp_path / "follower" / "t-0", LogConfig(segment_bytes=1000))
    whole = log_bytes(leader)
    size = len(whole) // 8  # every batch is the same size
    # Fetches of 2, 3 and 3 batches: the second does not fit behind the first, so the follower rolls
    # before it and keeps the chunk together, where the leader rolled every 3 batches.
    for first, last in ((0, 2), (2, 5), (5, 8)):
        results = follower.append_as_follower(whole[first * size : last * size])
        assert [r.base_offset for r in results] == list(range(first, last))
    assert bases(leader) == [0, 3, 6] and bases(follower) == [0, 2, 5]
    assert log_bytes(follower) == whole
    assert follower.epochs.entries == leader.epochs.entries == [EpochEntry(0, 0), EpochEntry(3, 4)]
    with pytest.raises(ValueError, match="does not start at offset 8"):
        follower.append_as_follower(whole[:size])
    with pytest.raises(ValueError, match="exceeds segment.bytes 1000"):
        PartitionLog.open(tmp_path / "other" / "t-0", LogConfig(segment_bytes=1000)).append_as_follower(whole[: 4 * size])
    leader.close()
    follower.close()


def test_a_follower_indexes_an_abort_with_the_last_stable_offset_after_its_whole_fetch(tmp_path):
    leader = PartitionLog.open(tmp_path / "leader" / "t-0")
    leader.append(data(1, 0, 0, transactional=True), leader_epoch=0)  # 0
    leader.append(marker(1, 0, commit=False), leader_epoch=0)  # 1
    leader.append(data(), leader_epoch=0)  # 2
    leader.append(data(3, 0, 0, transactional=True), leader_epoch=0)  # 3: another transaction opens
    follower = PartitionLog.open(tmp_path / "follower" / "t-0")
    follower.append_as_follower(log_bytes(leader))
    # The leader indexed the abort before producer 3's transaction existed: LSO = marker + 1. The
    # follower applies the whole fetch's producer state first (UnifiedLog.append), so it sees it open.
    assert read_txn_index(leader.directory / f"{0:020d}.txnindex") == [AbortedTxn(1, 0, 1, 2)]
    assert read_txn_index(follower.directory / f"{0:020d}.txnindex") == [AbortedTxn(1, 0, 1, 3)]
    assert follower.producer_state.ongoing_transactions == {3: 3}
    leader.close()
    follower.close()


def test_the_epoch_end_offset_answers_as_offsets_for_leader_epoch_does(tmp_path):
    log = segmented_log(tmp_path / "t-0", 3)
    log.epochs.assign(2, 10)
    log.epochs.assign(5, 20)
    cache = log.epochs
    assert cache.end_offset_for(5, 30) == (5, 30)  # the latest epoch ends at the log end
    assert cache.end_offset_for(2, 30) == (2, 20)
    assert cache.end_offset_for(3, 30) == (2, 20)  # an epoch this log never had: the one below it
    assert cache.end_offset_for(1, 30) == (0, 10)
    assert cache.end_offset_for(6, 30) == (-1, -1)
    assert cache.end_offset_for(-1, 30) == (-1, -1)
    cache.truncate_from_start(12)  # [2@12, 5@20]
    assert cache.end_offset_for(1, 30) == (1, 12)  # below every entry: the first one's start
    log.close()


def test_truncating_into_a_closed_segment_deletes_the_later_ones_and_makes_it_active_with_its_entries_below_the_target(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1000, index_interval_bytes=0))
    for i in range(12):
        log.append(data(7, 0, i, ts=T0 + i * 1000, value=b"v" * 250), leader_epoch=0 if i < 4 else 1)
    log.update_high_watermark(12)
    assert bases(log) == [0, 3, 6, 9] and sorted(list_producer_snapshots(log.directory)) == [3, 6, 9]
    size = len(seg_file(log, 0, ".log")) // 3

    assert log.truncate_to(5)

    assert bases(log) == [0, 3] and log.log_end_offset == 5 and log.high_watermark == 5
    assert not any((log.directory / f"{6:020d}{suffix}").exists() for suffix in (".log", ".index", ".timeindex", ".snapshot"))
    assert len(seg_file(log, 3, ".log")) == 2 * size
    # The index entries below the target stay, the files are preallocated again (the active segment's).
    assert seg_file(log, 3, ".index") == struct.pack(">ii", 1, size) + bytes(10 * 1024 * 1024 - 8)
    assert seg_file(log, 3, ".timeindex")[:12] == struct.pack(">qi", T0 + 4000, 1)  # relative offsets
    assert len(seg_file(log, 3, ".timeindex")) == 10 * 1024 * 1024 // 12 * 12
    assert log.epochs.entries == [EpochEntry(0, 0), EpochEntry(1, 4)]
    assert read_leader_epoch_checkpoint(log.directory / "leader-epoch-checkpoint") == log.epochs.entries
    # Producer state is rebuilt to the target and snapshotted there (UnifiedLog.rebuildProducerState).
    assert sorted(list_producer_snapshots(log.directory)) == [3, 5]
    assert read_producer_snapshot(log.directory / f"{5:020d}.snapshot")[0].last_sequence == 4
    with pytest.raises(ValueError, match="out-of-order sequence 12, expected 5"):
        log.append(data(7, 0, 12), leader_epoch=1)
    # Appending goes on in the segment that was cut, indexing from a fresh byte count.
    log.append(data(7, 0, 5, ts=T0 + 5000, value=b"v" * 250), leader_epoch=1)
    assert bases(log) == [0, 3] and log.log_end_offset == 6
    log.close()


def test_truncating_cuts_the_txn_index_at_the_first_entry_ending_at_or_past_the_target(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0")
    for producer_id, first in ((1, 0), (2, 2), (3, 4)):
        log.append(data(producer_id, 0, 0, transactional=True), leader_epoch=0)  # first
        log.append(marker(producer_id, 0, commit=False), leader_epoch=0)  # first + 1
    assert [t.last_offset for t in read_txn_index(log.directory / f"{0:020d}.txnindex")] == [1, 3, 5]
    log.truncate_to(3)
    assert read_txn_index(log.directory / f"{0:020d}.txnindex") == [AbortedTxn(1, 0, 1, 2)]
    assert log.producer_state.ongoing_transactions == {2: 2}  # producer 2's marker is gone
    log.close()


def test_truncating_at_the_log_end_drops_only_an_epoch_the_log_has_no_batch_of(tmp_path):
    # A leader that took epoch 1 and lost the leadership before appending holds 1@3 at its log end.
    log = segmented_log(tmp_path / "t-0", 3)
    log.epochs.assign(1, 3)
    assert not log.truncate_to(3) and not log.truncate_to(7)
    assert log.epochs.entries == [EpochEntry(0, 0)] and log.log_end_offset == 3
    log.close()


def test_truncating_below_the_first_segment_empties_the_log_and_starts_it_at_the_target(tmp_path):
    log = segmented_log(tmp_path / "t-0", 9)
    log.update_high_watermark(9)
    log.maybe_increment_log_start_offset(6)
    log.delete_old_segments(T0)
    assert bases(log) == [6]
    assert log.truncate_to(2)
    assert bases(log) == [2] and log.log_end_offset == log.log_start_offset == log.high_watermark == 2
    assert log.epochs.entries == [] and list_producer_snapshots(log.directory) == {}
    assert [p.name for p in log.directory.glob("*.log")] == [f"{2:020d}.log"]
    log.close()


def test_a_truncation_inside_a_batch_is_refused_and_changes_nothing(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0")
    log.append(data(records=4), leader_epoch=0)
    with pytest.raises(ValueError, match="offset 2 is inside the batch 0..3"):
        log.truncate_to(2)
    assert log.log_end_offset == 4 and len(seg_file(log, 0, ".log")) == len(data(records=4))
    log.close()


def test_the_log_start_offset_moves_up_to_the_high_watermark_and_no_further(tmp_path):
    log = segmented_log(tmp_path / "t-0", 6)
    log.update_high_watermark(4)
    assert log.maybe_increment_log_start_offset(4) and not log.maybe_increment_log_start_offset(3)
    with pytest.raises(ValueError, match="past the high watermark 4"):
        log.maybe_increment_log_start_offset(5)
    assert log.log_start_offset == 4 and log.epochs.entries == [EpochEntry(0, 4)]
    log.close()
