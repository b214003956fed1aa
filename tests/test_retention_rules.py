"""Retention rules (kts_resources/tiering/retention.py) as Kafka applies them: KIP-33's time rule on each
segment's largest timestamp, oldest first and stopping at the first segment kept; retention.bytes
over local-only plus remote bytes; the log start offset; the leader-epoch lineage; and local
retention that never drops a segment that is not yet committed and remote."""

from __future__ import annotations

import uuid

import pytest

from kts_resources.kafka.checkpoints import EpochEntry
from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.tiering.retention import (
    BY_LINEAGE,
    BY_LOG_START_OFFSET,
    BY_SIZE,
    BY_TIME,
    LOCAL_BY_SIZE,
    LOCAL_BY_TIME,
    ClosedSegment,
    RetentionConfig,
    plan_local_retention,
    plan_remote_retention,
)

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("orders", 0))
NOW = 10_000_000
HOUR = 3_600_000


def remote(start: int, end: int, max_ts: int, size: int = 100, epochs: dict[int, int] | None = None) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(TIP), start, end, max_timestamp_ms=max_ts, broker_id=0,
                                    event_timestamp_ms=0, segment_size_in_bytes=size,
                                    segment_leader_epochs=epochs or {0: start})


def plan(segments, *, retention_ms=-1, retention_bytes=-1, log_start=0, lineage=(EpochEntry(0, 0),), only_local=0):
    return plan_remote_retention(segments, log_start_offset=log_start, lineage=list(lineage), only_local_bytes=only_local,
                                 config=RetentionConfig(retention_ms=retention_ms, retention_bytes=retention_bytes), now_ms=NOW)


def test_a_segment_expires_by_time_when_its_largest_timestamp_is_old_enough():
    segments = [remote(0, 9, NOW - 3 * HOUR), remote(10, 19, NOW - 2 * HOUR), remote(20, 29, NOW - 10)]
    p = plan(segments, retention_ms=2 * HOUR)
    # ≤ now − retention.ms expires (the boundary itself included, as RemoteLogManager compares).
    assert [(e.start_offset, e.reason) for e in p.expired] == [(0, BY_TIME), (10, BY_TIME)]
    assert p.log_start_offset == 20 and p.oldest_retained_timestamp == NOW - 10


def test_out_of_order_timestamps_inside_a_segment_count_by_the_largest():
    # The segment's first records are old, one late record is new: its largest timestamp keeps it.
    p = plan([remote(0, 9, max_ts=NOW - 10)], retention_ms=HOUR)
    assert p.expired == []


def test_an_expired_segment_behind_a_kept_one_is_not_deleted():
    # A later segment with an older largest timestamp (KIP-33): the walk stops at the first kept one.
    segments = [remote(0, 9, NOW - 3 * HOUR), remote(10, 19, NOW - 10), remote(20, 29, NOW - 5 * HOUR)]
    p = plan(segments, retention_ms=HOUR)
    assert [e.start_offset for e in p.expired] == [0]
    assert p.log_start_offset == 10


def test_retention_bytes_counts_local_only_bytes_and_keeps_at_least_the_limit():
    segments = [remote(i * 10, i * 10 + 9, NOW, size=100) for i in range(5)]  # 500 remote bytes
    p = plan(segments, retention_bytes=350, only_local=120)  # 620 in all, 270 over
    assert [(e.start_offset, e.reason) for e in p.expired] == [(0, BY_SIZE), (10, BY_SIZE)]  # a third would leave 320 < 350
    assert p.log_start_offset == 20


def test_segments_below_the_log_start_offset_go_without_moving_it():
    segments = [remote(0, 9, NOW), remote(10, 19, NOW), remote(20, 29, NOW)]
    p = plan(segments, log_start=15)
    assert [(e.start_offset, e.reason) for e in p.expired] == [(0, BY_LOG_START_OFFSET)]
    assert p.log_start_offset == 15


def test_segments_of_epochs_before_the_lineage_go_without_moving_the_log_start_offset():
    # An unclean election: the new leader's lineage starts at epoch 3; the old leader's epoch 1 and 2
    # segment above the log start offset is off the lineage. (Below the lineage's first offset an
    # older epoch is history it does not contradict: that segment goes as below the log start offset.)
    segments = [remote(0, 9, NOW, epochs={1: 0}), remote(10, 19, NOW, epochs={1: 10, 2: 15}), remote(10, 14, NOW, epochs={3: 10})]
    p = plan(segments, lineage=[EpochEntry(3, 10)], log_start=10)
    assert sorted((e.start_offset, e.end_offset, e.reason) for e in p.expired) == [(0, 9, BY_LOG_START_OFFSET), (10, 19, BY_LINEAGE)]
    assert p.log_start_offset == 10


def test_unbounded_retention_expires_nothing():
    assert plan([remote(0, 9, 0)]).expired == []


def local(base, end, ts, size=100):
    return ClosedSegment(base, end, size, ts)


def local_plan(segments, *, hw=1000, copied=1000, local_ms=-1, local_bytes=-1, copy_enabled=True, active=0, log_start=0):
    return plan_local_retention(segments, active_size_bytes=active, high_watermark=hw, highest_copied_offset=copied,
                                log_start_offset=log_start,
                                config=RetentionConfig(local_retention_ms=local_ms, local_retention_bytes=local_bytes,
                                                       copy_enabled=copy_enabled), now_ms=NOW)


def test_local_retention_takes_only_segments_already_remote_and_committed():
    segments = [local(0, 9, 0), local(10, 19, 0), local(20, 29, 0)]
    p = local_plan(segments, local_ms=HOUR, copied=19)
    assert [e.start_offset for e in p.expired] == [0, 10] and p.local_log_start_offset == 20
    p = local_plan(segments, local_ms=HOUR, hw=15)
    assert [e.start_offset for e in p.expired] == [0]


def test_local_retention_by_time_is_strictly_older_than_the_limit():
    p = local_plan([local(0, 9, NOW - HOUR), local(10, 19, NOW - HOUR - 1)], local_ms=HOUR)
    assert p.expired == []  # the walk stops at the first segment kept


def test_local_retention_by_size_counts_the_active_segment():
    segments = [local(i * 10, i * 10 + 9, NOW, size=100) for i in range(4)]
    p = local_plan(segments, local_bytes=250, active=50)  # 450 bytes, 200 over
    assert [(e.start_offset, e.reason) for e in p.expired] == [(0, LOCAL_BY_SIZE), (10, LOCAL_BY_SIZE)]


def test_with_copying_disabled_local_retention_no_longer_waits_for_the_remote_tier():
    segments = [local(0, 9, 0), local(10, 19, 0)]
    assert local_plan(segments, local_ms=HOUR, copied=-1).expired == []
    p = local_plan(segments, local_ms=HOUR, copied=-1, copy_enabled=False)
    assert [e.reason for e in p.expired] == [LOCAL_BY_TIME, LOCAL_BY_TIME]


@pytest.mark.parametrize("overrides, expected", [
    ({}, (7 * 24 * HOUR, -1, 7 * 24 * HOUR, -1)),
    ({"retention.ms": "3600000", "local.retention.ms": "60000"}, (HOUR, -1, 60000, -1)),
    ({"retention.bytes": "1000", "remote.log.copy.disable": "true", "local.retention.bytes": "10"}, (7 * 24 * HOUR, 1000, 7 * 24 * HOUR, 1000)),
])
def test_the_config_resolves_local_retention_as_kafka_does(overrides, expected):
    from kts_resources.metadata.topic_config import TopicConfig

    c = RetentionConfig.from_topic_config(TopicConfig(overrides), "orders")
    assert (c.retention_ms, c.retention_bytes, c.local_retention_ms, c.local_retention_bytes) == expected
