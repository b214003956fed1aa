"""Remote segments that overlap — one wholly inside another, as two brokers' kts copying the same
partition from different roll points left them before copies were serialised by the highest copied
offset — are read from a segment that holds the offset, never from one that ends before it: a
remote-only reader gets every tiered offset's record (issue 30: "offsets unreachable from the tier")."""

from __future__ import annotations

import pytest

from kts_resources.tiering.copier import _prepare, _upload_and_finish, copy_partition, manifest_context_for
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.tiering.quotas import SystemClock
from kts_resources.reading.reader import TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.tiers import topic_id_partition

TOPIC = "orders"
T = 1_700_000_000_000
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def _broker(root, node_id: int, rolls_after: set[int]) -> None:
    """One record per batch, offsets 0..39, under leader epoch 0; rolled after the given offsets."""
    with BrokerLogDir(root, LogConfig(segment_bytes=1 << 20), node_id=node_id) as broker:
        log = broker.partition(TOPIC, 0)
        for i in range(40):
            log.append(build_batch([NewRecord(T + i, f"k{i}".encode(), f"v{i}".encode())], base_offset=0), leader_epoch=0)
            if i in rolls_after:
                log.roll()
        log.update_high_watermark(40)
        broker.checkpoint()


@pytest.fixture
def nested(tmp_path, metadata_store):
    """Broker 0's segments 0..9 and 10..29 in the tier, and broker 1's 15..24 inside the second."""
    first, second = tmp_path / "broker-0", tmp_path / "broker-1"
    _broker(first, 0, {9, 29})
    _broker(second, 1, {14, 24, 34})
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    log_dir = LogDir(first)
    [partition] = log_dir.partitions()
    assert copy_partition(partition, log_dir, metadata_store, storage).stopped is None
    tip = topic_id_partition(partition, metadata_store)
    [other] = LogDir(second).partitions()
    inner = next(s for s in other.segments() if s.base_offset == 15)
    md, data, _chunks, _cut = _prepare(other, inner, tip, other.leader_epochs(), 1, SystemClock())
    metadata_store.add_remote_log_segment_metadata(md)
    _upload_and_finish(metadata_store, storage, md, data, SystemClock(), manifest_context_for(metadata_store, tip))
    spans = sorted((m.start_offset, m.end_offset) for m in metadata_store.list_remote_log_segments(tip, states={FINISHED}))
    assert spans == [(0, 9), (10, 29), (15, 24)]
    return storage, tip


def test_a_remote_only_reader_reads_every_offset_of_overlapping_segments(nested, metadata_store, tmp_path):
    storage, _tip = nested
    reader = TieredLogReader(log_dirs=[], store=metadata_store, rsm=storage, home=tmp_path / "home")
    for offset in range(30):
        fetched = reader.fetch(TOPIC, 0, offset, max_bytes=1)
        assert fetched.batches, (offset, fetched)
        first = fetched.batches[0].header
        assert first.base_offset <= offset <= first.last_offset, offset
        assert fetched.next_offset > offset


def test_the_tier_ends_where_its_furthest_segment_ends_not_where_the_last_one_starts(nested, metadata_store, tmp_path):
    from kts_resources.reading.reader import OffsetOutOfRangeError

    storage, _tip = nested
    reader = TieredLogReader(log_dirs=[], store=metadata_store, rsm=storage, home=tmp_path / "home")
    assert reader.offsets(TOPIC, 0, "latest-tiered").offset == 29
    assert reader.offsets(TOPIC, 0, "latest").offset == 30
    assert reader.fetch(TOPIC, 0, 30).batches == []  # the log end offset: an empty fetch, as Kafka's
    with pytest.raises(OffsetOutOfRangeError):
        reader.fetch(TOPIC, 0, 31)
