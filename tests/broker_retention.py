"""A broker that deletes its own oldest segments, and kts's per-partition procedures run over its
log dir in-process, as one `kts sync` pass runs them — for the tests of issue 34's core use case
(tests/test_broker_retention.py, tests/test_broker_retention_week.py).

The broker (kts_resources.kafka.simulator.broker_log) is not tiering-aware, as a broker kts tiers is not:
its retention deletes segments whether they were copied or not, moves its log start offset to the
first remaining segment, truncates its leader-epoch cache there and writes
``log-start-offset-checkpoint``, as UnifiedLog.deleteOldSegments and the checkpoint task do.

One kts pass is the pipeline's own steps, without Dagster: the copy (``copy_partition`` over each
partition, which also runs the lost-range detection), the retention plans (``spark_retention.plan_partitions`` on the
driver, what ``retention_state`` asks) and ``expire_partition`` carrying out each plan with work, all with the
caller's clock as "now".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kts_resources.tiering.expiry import expire_partition
from kts_resources.kafka.checkpoints import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint, write_offset_checkpoint
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.tiering.quotas import ManualClock
from kts_resources.reading.reader import PartitionReader, TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentMetadata, RemoteLogSegmentState
from kts_resources.spark.retention_job import plan_partitions
from kts_resources.tiering.tiers import locate_partitions
from .partition_steps import copy_each_partition

HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


class RetainingBroker:
    """One partition of ``topic`` in a broker-owned log dir, everything produced remembered."""

    def __init__(self, log_dir: Path, topic: str):
        self.path = log_dir
        self.topic = topic
        self.broker = BrokerLogDir(log_dir, LogConfig(segment_bytes=1 << 20))
        self.log = self.broker.partition(topic, 0)
        self.produced: dict[int, bytes] = {}

    def produce(self, timestamp_ms: int, records: int = 2) -> None:
        """One batch of ``records`` records stamped ``timestamp_ms``; the high watermark follows."""
        offset = self.log.log_end_offset
        batch = [NewRecord(timestamp_ms, None, f"{self.topic}:{offset + i}".encode()) for i in range(records)]
        self.log.append(build_batch(batch, base_offset=0), leader_epoch=0)
        for i, record in enumerate(batch):
            self.produced[offset + i] = record.value
        self.publish()

    def roll(self) -> None:
        self.log.roll()
        self.publish()

    def delete_by_retention(self, now_ms: int, *, retention_ms: int) -> list[int]:
        """The broker's own time retention (its log.retention.ms): the deleted base offsets."""
        deleted = self.log.delete_old_segments(now_ms, retention_ms=retention_ms)
        self.publish()
        return deleted

    def publish(self) -> None:
        """Flushed, committed and checkpointed: the high watermark at the log end, the three root
        checkpoints written (log-start-offset-checkpoint with the broker's own log start)."""
        self.log.update_high_watermark(self.log.log_end_offset)
        self.broker.checkpoint()

    def checkpoint_log_start(self, offset: int) -> None:
        """log-start-offset-checkpoint says ``offset`` for the partition, as after a DeleteRecords
        sent to the broker (or, on a follower, the leader's log start offset); the next
        :meth:`publish` writes the broker's own again."""
        path = self.path / LOG_START_OFFSET_CHECKPOINT
        write_offset_checkpoint(path, {**read_offset_checkpoint(path), self.log.topic_partition: offset})

    def close(self) -> None:
        self.broker.close()


@dataclass
class KtsPass:
    """What one in-process kts pass did."""

    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    lost: list[tuple[int, int]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    remote_expired: list[tuple[int, int, str]] = field(default_factory=list)  # planned: start, end, rule
    remote_deleted: list[int] = field(default_factory=list)


def kts_pass(store: RemoteLogMetadataStore, storage, log_dir: Path, *, now_ms: int, database_url: str,
             owned: bool = False) -> KtsPass:
    """One `kts sync` pass over ``log_dir`` at ``now_ms``: copy, plan retention, expire."""
    clock = ManualClock(now_ms)
    done = KtsPass()
    for result in copy_each_partition(LogDir(log_dir), store, storage, clock=clock):
        done.copied += result.copied
        done.lost += result.lost
        done.stopped += [s for s in (result.stopped, result.skipped) if s]
    keys = [p.topic_partition.dir_name for p in LogDir(log_dir).partitions()]
    owned_dirs = [log_dir] if owned else []
    located, _missing = locate_partitions([log_dir], keys, owned_log_dirs=owned_dirs)

    def no_spark():
        raise AssertionError("a few partitions are planned on the driver")

    plans = plan_partitions(no_spark, store, keys, log_dirs=[str(log_dir)], owned_log_dirs=[str(p) for p in owned_dirs],
                            database_url=database_url, now_ms=now_ms)
    for key in keys:
        outcome = plans[key]
        assert outcome.error is None, f"{key}: retention not planned: {outcome.error}"
        plan = outcome.plan
        if plan is None:  # nothing remote
            continue
        done.remote_expired += [(e.start_offset, e.end_offset, e.reason) for e in plan.remote.expired]
        if plan.has_work:
            result = expire_partition(plan, located[key], store, storage, clock=clock)
            done.remote_deleted += result.remote_deleted
    return done


def remote_only(store: RemoteLogMetadataStore, storage, topic: str, home: Path | None = None) -> PartitionReader:
    """The partition as the remote tier alone serves it: a reader with no log dir."""
    return TieredLogReader(log_dirs=[], store=store, rsm=storage, home=home).partition(topic, 0)


def records_at(part: PartitionReader, offset: int) -> dict[int, bytes]:
    """The records a fetch at ``offset`` returns from its batch on: offset → value."""
    return {r.offset: r.value for _, records in part.fetch(offset, 1).consumed() for r in records}


def read_remote_only(store: RemoteLogMetadataStore, storage, topic: str, offset: int, home: Path | None = None) -> dict[int, bytes]:
    """The records of the batch holding ``offset`` as the remote tier alone serves them."""
    return records_at(remote_only(store, storage, topic, home), offset)
