"""ListOffsets across tiers, ported from Kafka's tiered-storage integration test ListOffsetsTest
(storage/src/test/java/org/apache/kafka/tiered/storage/integration/ListOffsetsTest.java, KRaft):
one record per batch, two batches per segment; k0..k2 written under leader epoch 0, a leader
election, k3..k5 under epoch 1; the first two segments offloaded and gone from the local log. Then
the answers for earliest, earliest-local, latest-tiered, latest and timestamps before, at, between
and after the records — each with its leader epoch — also after DeleteRecords moves the log start
offset (remote segments deleted, the leader-epoch cache truncated from the start, as the broker does).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.tiering.copier import delete_remote_log_segment
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.checkpoints import (
    EpochEntry,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
)
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.tiering.quotas import SystemClock
from kts_resources.reading.reader import READ_UNCOMMITTED, TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from .partition_steps import copy_each_partition

TOPIC = "topicA"
T = 1_700_000_000_000
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
NO_EPOCH = -1


def _produce(log, i: int, epoch: int) -> None:
    record = NewRecord(T + i, f"k{i}".encode(), f"v{i}".encode())
    log.append(build_batch([record], base_offset=0), leader_epoch=epoch)


@pytest.fixture(params=["remote log index", "segment indexes"])
def cluster(request, tmp_path, metadata_store):
    """The test's partition after its two offloads: segments [0,1] and [2,3] only remote, [4,5] local;
    read through the remote log index, or (before it is built) through each segment's own indexes."""
    root = tmp_path / "logs"
    with BrokerLogDir(root, LogConfig(segment_bytes=1 << 20)) as log_dir:
        log = log_dir.partition(TOPIC, 0)
        _produce(log, 0, 0)
        _produce(log, 1, 0)
        log.roll()
        _produce(log, 2, 0)
        # Leader election: epoch 0 → 1 (KRaft bumps it for the election only).
        _produce(log, 3, 1)
        log.roll()
        _produce(log, 4, 1)
        _produce(log, 5, 1)
        log.update_high_watermark(6)
        log.flush()
        log_dir.checkpoint()
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
    assert [(md.start_offset, md.end_offset) for md in finished] == [(0, 1), (2, 3)]
    pdir = root / f"{TOPIC}-0"
    # Local retention (local.retention.ms=0 on an offloaded segment): the log now starts at 4.
    for md in finished:
        for f in pdir.glob(f"{md.start_offset:020d}.*"):
            f.unlink()
    home = tmp_path / "home"
    if request.param == "remote log index":
        index_dir = index_cache.cache_directory(home, tip)
        index_cache.build_partition_index(index_dir, finished, lambda md: index_cache.read_segment_entries(storage, md))
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=home)
    return reader, root, metadata_store, storage, tip, finished


def offsets(reader, spec) -> tuple[int, int]:
    answer = reader.offsets(TOPIC, 0, spec, READ_UNCOMMITTED)
    return answer.leader_epoch, answer.offset


def _delete_records(root: Path, store, storage, tip, before: int, remote_segments) -> None:
    """Kafka's DeleteRecords on a tiered partition, as the broker carries it out: the log start
    offset moves (checkpointed, and recorded for the remote tier), the leader-epoch cache is
    truncated from the start, and the remote segments wholly below it are deleted."""
    tp = TopicPartition(TOPIC, 0)
    checkpoint = root / "log-start-offset-checkpoint"
    starts = read_offset_checkpoint(checkpoint)
    starts[tp] = before
    write_offset_checkpoint(checkpoint, starts)
    epochs_path = root / f"{TOPIC}-0" / "leader-epoch-checkpoint"
    entries = read_leader_epoch_checkpoint(epochs_path)
    kept = [e for e in entries if e.start_offset >= before]
    below = [e for e in entries if e.start_offset < before]
    if below and (not kept or kept[0].start_offset > before):
        kept.insert(0, EpochEntry(below[-1].epoch, before))
    write_leader_epoch_checkpoint(epochs_path, kept)
    store.update_log_start_offset(tip, before)
    for md in remote_segments:
        delete_remote_log_segment(store, storage, md, SystemClock())


def test_list_offsets_for_special_timestamps(cluster):
    reader, *_ = cluster
    assert offsets(reader, "earliest") == (0, 0)
    assert offsets(reader, "earliest-local") == (1, 4)
    assert offsets(reader, "latest-tiered") == (1, 3)
    assert offsets(reader, "latest") == (1, 6)


def test_list_offsets_by_timestamp_from_the_local_log(cluster):
    reader, *_ = cluster
    assert offsets(reader, T + 6) == (NO_EPOCH, -1)
    assert offsets(reader, T + 5) == (1, 5)
    assert offsets(reader, T + 4) == (1, 4)


def test_list_offsets_by_timestamp_from_the_remote_tier(cluster):
    reader, *_ = cluster
    assert offsets(reader, T - 1) == (0, 0)
    assert offsets(reader, T) == (0, 0)
    assert offsets(reader, T + 1) == (0, 1)
    assert offsets(reader, T + 3) == (1, 3)


def test_the_earliest_offset_follows_delete_records(cluster):
    reader, root, store, storage, tip, finished = cluster
    _delete_records(root, store, storage, tip, 3, finished[:1])
    assert offsets(reader, "earliest") == (1, 3)
    assert offsets(reader, "earliest-local") == (1, 4)
    # Records below the log start offset are never answered, even by timestamp.
    assert offsets(reader, T) == (1, 3)

    _delete_records(root, store, storage, tip, 4, finished[1:])
    assert offsets(reader, "earliest") == (1, 4)
    assert offsets(reader, "earliest-local") == (1, 4)
    # The highest offset ever tiered stays 3; its epoch is no longer in the truncated cache.
    assert offsets(reader, "latest-tiered") == (NO_EPOCH, 3)
    assert offsets(reader, "latest") == (1, 6)

    # Inside the local log: the local log start offset moves with the log start offset, though the
    # segment holding offset 4 stays on disk (UnifiedLog.maybeIncrementLogStartOffset).
    _delete_records(root, store, storage, tip, 5, [])
    assert offsets(reader, "earliest") == (1, 5)
    assert offsets(reader, "earliest-local") == (1, 5)


def test_max_timestamp_names_the_first_record_holding_the_largest_timestamp(cluster):
    reader, *_ = cluster
    assert offsets(reader, "max-timestamp") == (1, 5)
