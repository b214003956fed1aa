"""Issue 34, finding 1: the broker's own retention never moves the partition's log start offset.

A broker kts tiers keeps hours locally and the tier keeps months. After the broker deletes
segments kts already copied, it checkpoints its first remaining segment as its log start offset:
that bounds the LOCAL log only. The partition's log start offset moves only by kts's own remote
retention (retention.ms / retention.bytes) and DeleteRecords (`kts delete-records`)."""

from __future__ import annotations

import time
import uuid

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.reading.reader import OffsetOutOfRangeError
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.partition_view import partition_tiers
from kts_resources.tiering.tiers import locate_partitions, log_start_offset

from .broker_retention import FINISHED, HOUR_MS, RetainingBroker, kts_pass, read_remote_only, records_at, remote_only


def test_the_brokers_checkpoint_bounds_only_the_local_log():
    # The broker deleted 0..499 (copied) by its retention and checkpointed 500: the tier still starts at 0.
    assert log_start_offset(checkpointed=500, local_log_start_offset=500, remote_log_start_offset=0) == 0
    # DeleteRecords on the broker, or a leader's log start on a follower: the same, it is the broker's.
    assert log_start_offset(checkpointed=530, local_log_start_offset=500, remote_log_start_offset=0) == 0
    # Only what kts recorded (its remote retention, `kts delete-records`) moves it.
    assert log_start_offset(checkpointed=530, local_log_start_offset=500, remote_log_start_offset=0, recorded=70) == 70
    # Nothing remote: the log is the local log, which the checkpoint bounds.
    assert log_start_offset(checkpointed=130, local_log_start_offset=100) == 130
    assert log_start_offset(checkpointed=None, local_log_start_offset=100) == 100
    assert log_start_offset(checkpointed=40, local_log_start_offset=100) == 100
    # No local segment: nothing for the checkpoint to bound.
    assert log_start_offset(checkpointed=900, local_log_start_offset=-1, remote_log_start_offset=20) == 20
    assert log_start_offset(checkpointed=900, local_log_start_offset=-1) == -1


def test_segments_the_broker_deleted_after_they_were_copied_stay_in_the_tier(tmp_path, metadata_store, pg_url):
    """The reported case: 8 segments copied, the broker's retention deletes the local copies and
    checkpoints its first remaining segment, writes on; the next pass keeps all 8 remote segments
    (an hour old under a 7-day retention), readable, and finds nothing lost."""
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    logs = tmp_path / "logs"
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    broker = RetainingBroker(logs, topic)
    start = time.time_ns() // 1_000_000 - HOUR_MS
    try:
        for i in range(8):
            broker.produce(start + i * 60_000)
            broker.produce(start + i * 60_000 + 1_000)
            broker.roll()
        first = kts_pass(metadata_store, storage, logs, now_ms=start + 10 * 60_000, database_url=pg_url)
        assert len(first.copied) == 8 and not first.lost and not first.stopped
        copied = sorted((md.start_offset, md.end_offset) for md in first.copied)

        # The broker's local retention (say log.retention.ms = 1 minute) takes the 8 copied segments.
        now = start + HOUR_MS
        deleted = broker.delete_by_retention(now, retention_ms=60_000)
        assert deleted == [s for s, _ in copied]
        [partition] = LogDir(logs).partitions()
        first_left = partition.segments()[0].base_offset
        assert LogDir(logs).log_start_offset(partition.topic_partition) == first_left == copied[-1][1] + 1
        broker.produce(now)
        broker.roll()

        again = kts_pass(metadata_store, storage, logs, now_ms=now + 60_000, database_url=pg_url)
        assert not again.lost and not again.stopped
        assert again.remote_expired == [] and again.remote_deleted == []
        [tip] = [t for t in metadata_store.partitions() if t.topic == topic]
        remote = sorted((md.start_offset, md.end_offset) for md in metadata_store.list_remote_log_segments(tip, states={FINISHED}))
        assert remote[:8] == copied
        assert metadata_store.lost_ranges(tip, include_acknowledged=True) == []
        for first_offset, last_offset in copied:
            for offset in (first_offset, last_offset):
                got = read_remote_only(metadata_store, storage, topic, offset, tmp_path / "home")
                assert got.get(offset) == broker.produced[offset], f"offset {offset}"
        located, _ = locate_partitions([logs], [f"{topic}-0"])
        tiers = partition_tiers(located[f"{topic}-0"], metadata_store)
        assert (tiers.log_start_offset, tiers.remote_log_start_offset) == (0, 0)
    finally:
        broker.close()
        storage.close()


def test_the_brokers_log_start_at_kts_first_look_is_the_partitions(tmp_path, metadata_store, pg_url):
    """A DeleteRecords sent to the broker before kts ever looked put its log start inside the first
    segment: nothing is remote, so the log is the local log and starts there. kts records it on its
    first look, so the first segment going remote whole brings nothing below it back, and nothing
    below it is lost. A later checkpoint inside a segment moves nothing: the tier keeps its data."""
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    logs = tmp_path / "logs"
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    broker = RetainingBroker(logs, topic)
    now = time.time_ns() // 1_000_000
    try:
        for i in range(3):
            broker.produce(now - HOUR_MS + i * 1_000)  # two records a batch: 0..1, 2..3, 4..5
            broker.produce(now - HOUR_MS + i * 1_000 + 500)
            broker.roll()
        broker.checkpoint_log_start(3)
        first = kts_pass(metadata_store, storage, logs, now_ms=now, database_url=pg_url)
        assert [md.start_offset for md in first.copied] == [0, 4, 8] and not first.lost
        [tip] = [t for t in metadata_store.partitions() if t.topic == topic]
        assert metadata_store.partition_state(tip).log_start_offset == 3
        part = remote_only(metadata_store, storage, topic)
        assert part.log_start_offset == 3
        with pytest.raises(OffsetOutOfRangeError):
            part.fetch(2, 1)
        assert records_at(part, 3)[3] == broker.produced[3]

        broker.checkpoint_log_start(9)  # later, another DeleteRecords on the broker: not kts's
        again = kts_pass(metadata_store, storage, logs, now_ms=now + 60_000, database_url=pg_url)
        assert again.remote_expired == [] and not again.lost
        assert metadata_store.partition_state(tip).log_start_offset == 3
        located, _ = locate_partitions([logs], [f"{topic}-0"])
        assert partition_tiers(located[f"{topic}-0"], metadata_store).log_start_offset == 3
        assert records_at(remote_only(metadata_store, storage, topic), 4)[4] == broker.produced[4]
        assert metadata_store.lost_ranges(tip, include_acknowledged=True) == []
    finally:
        broker.close()
        storage.close()
