"""Writing a KRaft metadata log dir (``__cluster_metadata-0``) as a quorum's leader leaves it on disk,
for the cluster simulator and tests; reading it is :mod:`kts_resources.kafka.metadata_log`'s job."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..files import write_atomically
from ..logdir import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PRODUCER_SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    list_segments,
    offset_file_name,
)
from ..metadata_log import (
    LEADER_CHANGE,
    METADATA_PARTITION_DIR,
    METADATA_TOPIC_ID,
    LeaderChangeMessage,
    MetadataReplay,
    SnapshotId,
    Voter,
    control_batch,
    encode_record,
    encode_snapshot,
    replay_partition_dir,
)
from ..records import NewRecord, build_batch
from .broker_log import LogConfig, PartitionLog


class MetadataLogWriter:
    """Writes ``__cluster_metadata-0`` as a KRaft quorum's leader leaves it on disk: batches of
    metadata records (each batch stamped with the raft epoch, every record with the batch's one
    timestamp), LeaderChangeMessage control batches, segments, indexes and
    ``leader-epoch-checkpoint`` through :class:`PartitionLog`, and snapshots with header and footer.

    ``directory`` is the metadata.log.dir (or the partition directory itself). Reopening an
    existing directory continues it (its state is replayed to write later snapshots).
    """

    def __init__(self, directory: str | os.PathLike, config: LogConfig = LogConfig(), *, epoch: int = 1):
        path = Path(directory)
        self.path = path if path.name == METADATA_PARTITION_DIR else path / METADATA_PARTITION_DIR
        self.config = config
        self.epoch = epoch
        # What has been written, replayed, for snapshots; None once a record written did not replay.
        self._replay: MetadataReplay | None = MetadataReplay.of(replay_partition_dir(self.path)) if self.path.is_dir() else MetadataReplay()
        self._log = PartitionLog.open(self.path, config, topic_id=METADATA_TOPIC_ID, metadata_log=True)

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    def append(self, records: Sequence[Any], *, epoch: int | None = None, timestamp: int = 0) -> int:
        """Append one batch of metadata records; returns its base offset. Records that do not
        replay (a change to a partition that does not exist) are written all the same, for tests
        of the reader; the writer then takes no more snapshots."""
        if epoch is not None:
            self.epoch = epoch
        batch = build_batch([NewRecord(timestamp, None, encode_record(r)) for r in records], base_offset=0)
        result = self._log.append(batch, leader_epoch=self.epoch)
        try:
            for r in records:
                if self._replay is not None:
                    self._replay.apply(r)
        except ValueError:
            self._replay = None
        return result.base_offset

    def append_leader_change(self, leader_id: int, voters: Iterable[int] = (), *, epoch: int | None = None,
                             timestamp: int = 0) -> int:
        """The LeaderChangeMessage control batch a raft leader writes first in its epoch."""
        if epoch is not None:
            self.epoch = epoch
        voter_list = tuple(Voter(v) for v in voters)
        message = LeaderChangeMessage(0, leader_id, voter_list, voter_list)
        return self._log.append(control_batch(LEADER_CHANGE, message, timestamp=timestamp), leader_epoch=self.epoch).base_offset

    def snapshot(self, *, timestamp: int = 0, records_per_batch: int = 100, delete_log_before: bool = False) -> Path:
        """Write a snapshot of everything appended so far, named after the log end offset and the
        current epoch (written as ``.checkpoint.part``, fsynced, renamed, as Kafka freezes one).
        ``delete_log_before`` then deletes the segments the snapshot wholly covers, as
        KafkaMetadataLog's cleaning does once the log start offset moves to the snapshot."""
        if self._replay is None:
            raise ValueError("the log holds records that do not replay: no snapshot of it can be written")
        if self._replay._saved is not None:
            raise ValueError("a snapshot cannot be taken inside an open metadata transaction")
        self._log.flush()
        snapshot_id = SnapshotId(self.log_end_offset, self.epoch)
        path = self.path / snapshot_id.file_name
        write_atomically(path, encode_snapshot(self._replay.image_records(), epoch=self.epoch, timestamp=timestamp,
                                               records_per_batch=records_per_batch))
        if delete_log_before:
            self._delete_segments_below(snapshot_id.end_offset)
        return path

    def _delete_segments_below(self, offset: int) -> None:
        self._log.roll()
        self._log.close()
        for s in list_segments(self.path):
            if s.next_base_offset is not None and s.next_base_offset <= offset:
                for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, PRODUCER_SNAPSHOT_SUFFIX):
                    (self.path / offset_file_name(s.base_offset, suffix)).unlink(missing_ok=True)
        self._log = PartitionLog.open(self.path, self.config, topic_id=METADATA_TOPIC_ID, metadata_log=True,
                                      log_start_offset=offset)

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> MetadataLogWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["MetadataLogWriter"]
