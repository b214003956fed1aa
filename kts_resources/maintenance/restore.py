"""Restore a partition's log directory from the remote tier: the seeds' broker-rebuild case.

For each COPY_SEGMENT_FINISHED segment from the one holding the start offset on, every object that
travelled with it comes back under Kafka's file names — ``.log``, ``.index``, ``.timeindex``,
``.txnindex`` and the producer snapshot at the segment's next offset — each streamed to
``<name>.kts-restoring``, its size and CRC-32C checked against what the copy recorded, fsynced,
then renamed into place: a file under its final name is always whole. Then the last segment's
leader-epoch lineage as ``leader-epoch-checkpoint``, ``partition.metadata`` with the topic id,
and the log dir's checkpoints for the partition (high watermark and recovery point at the restored
log end, so a broker starting on the dir runs no recovery; log start offset from the store),
merged with entries of other partitions already there.

A partition dir that already holds segments is refused, unless it carries the marker an
interrupted restore of the same partition left: then a rerun skips files already whole and
finishes the rest (a SIGKILL at any point converges). Nothing in the tier is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kts_resources.kafka.crc import crc32c

from kts_resources.kafka.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    PARTITION_METADATA_VERSION,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    PartitionMetadata,
    read_offset_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)
from kts_resources.kafka.files import fsync_directory, write_atomically
from kts_resources.kafka.logdir import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PRODUCER_SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    offset_file_name,
)
from kts_resources.kafka.partition import TopicPartition
from kts_resources.tiering.lineage import readable_spans
from kts_resources.remote_log import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import RemoteStorageManager, StoredObject, stored_objects

MARKER = ".kts-restore-in-progress"
PARTIAL = ".kts-restoring"
READ_CHUNK = 8 * 1024 * 1024
# Object suffix (as the copy recorded it) → the local file's suffix, named by the segment's base offset.
_SEGMENT_FILES = {"log": LOG_SUFFIX, "index": INDEX_SUFFIX, "timeindex": TIME_INDEX_SUFFIX, "txnindex": TXN_INDEX_SUFFIX}


class RestoreError(Exception):
    """Why a restore cannot go on; one line naming the object or the directory."""


@dataclass
class RestoreResult:
    partition_dir: Path
    segments: int = 0
    files: int = 0
    bytes: int = 0
    already_whole: int = 0  # files a rerun found complete
    log_start_offset: int = -1
    log_end_offset: int = -1


Progress = Callable[[RestoreResult, int], None]  # (so far, segments in all)


def restore_partition(store, rsm: RemoteStorageManager, topic: str, partition: int, to_dir: str | os.PathLike, *,
                      from_offset: int | None = None, progress: Progress | None = None) -> RestoreResult:
    """Rebuild ``<to_dir>/<topic>-<partition>`` from the remote tier (see the module docstring)."""
    topic_id = store.topic_id(topic)
    if topic_id is None:
        raise RestoreError(f"topic {topic!r} is not known to the metadata store")
    tip = TopicIdPartition(topic_id, TopicPartition(topic, partition))
    state = store.partition_state(tip)
    # The partition's log is its current leader-epoch lineage's: the segments a reader reads, in
    # order — never an old leader's segment after an unclean election, nor one others cover.
    spans = readable_spans(store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED}),
                           list(state.lineage))
    finished = list({id(span.segment): span.segment for span in spans}.values())
    if not finished:
        raise RestoreError(f"{topic}-{partition}: nothing of it is in the remote tier")
    log_start = max(state.log_start_offset, finished[0].start_offset)
    start = log_start if from_offset is None else max(from_offset, log_start)
    chosen = [md for md in finished if md.end_offset >= start]
    if not chosen:
        raise RestoreError(f"{topic}-{partition}: offset {start} is past the remote tier's end ({finished[-1].end_offset})")
    _check_contiguous(topic, partition, chosen)

    log_dir = Path(to_dir)
    partition_dir = log_dir / tip.topic_partition.dir_name
    _claim(partition_dir)
    result = RestoreResult(partition_dir, log_start_offset=chosen[0].start_offset if from_offset is not None else log_start,
                           log_end_offset=chosen[-1].end_offset + 1)
    for md in chosen:
        objects = stored_objects(md.custom_metadata)
        if "log" not in objects:
            raise RestoreError(f"segment {md.start_offset} of {topic}-{partition}: no log object recorded; run kts scrub")
        for suffix, local_suffix in _SEGMENT_FILES.items():
            if suffix in objects:
                _restore_object(rsm, objects[suffix], partition_dir / offset_file_name(md.start_offset, local_suffix), result)
        if "snapshot" in objects:
            snapshot = partition_dir / offset_file_name(md.end_offset + 1, PRODUCER_SNAPSHOT_SUFFIX)
            _restore_object(rsm, objects["snapshot"], snapshot, result)
        result.segments += 1
        if progress is not None:
            progress(result, len(chosen))
    lineage = stored_objects(chosen[-1].custom_metadata).get("leader-epoch-checkpoint")
    if lineage is not None:
        write_atomically(partition_dir / LEADER_EPOCH_CHECKPOINT, rsm.fetch_object(lineage.key, verify_checksum=lineage.checksum))
    write_partition_metadata(partition_dir / PARTITION_METADATA, PartitionMetadata(PARTITION_METADATA_VERSION, topic_id))
    _write_checkpoints(log_dir, tip.topic_partition, result)
    (partition_dir / MARKER).unlink(missing_ok=True)
    fsync_directory(partition_dir)
    return result


def _check_contiguous(topic: str, partition: int, chosen: list[RemoteLogSegmentMetadata]) -> None:
    for a, b in zip(chosen, chosen[1:]):
        if b.start_offset <= a.end_offset:
            raise RestoreError(f"{topic}-{partition}: offsets {b.start_offset}..{a.end_offset} are in two remote segments "
                               "(replicas that rolled at other points, or a leader change): a log dir is restored from "
                               "whole segments, and these overlap")
        if b.start_offset != a.end_offset + 1:
            raise RestoreError(f"{topic}-{partition}: the remote tier has no segment for offsets {a.end_offset + 1}..{b.start_offset - 1} "
                               "(a lost range, see kts status): a log dir with a hole is not restored")


def _claim(partition_dir: Path) -> None:
    """Create the partition dir with the restore's marker; refuse one holding segments of its own."""
    if partition_dir.exists() and not partition_dir.is_dir():
        raise RestoreError(f"{partition_dir}: not a directory")
    if partition_dir.is_dir() and not (partition_dir / MARKER).exists():
        if any(p.suffix == LOG_SUFFIX for p in partition_dir.iterdir()):
            raise RestoreError(f"{partition_dir}: already holds segments; restore into an empty log dir (nothing is overwritten)")
    partition_dir.mkdir(parents=True, exist_ok=True)
    (partition_dir / MARKER).touch()
    fsync_directory(partition_dir.parent)


def _restore_object(rsm: RemoteStorageManager, obj: StoredObject, target: Path, result: RestoreResult) -> None:
    """Stream one object to ``target`` through a partial file, checking size and CRC-32C first."""
    expected = obj.crc32c
    if target.is_file() and target.stat().st_size == obj.size and _file_crc(target) == expected:
        result.already_whole += 1
        return
    partial = target.with_name(target.name + PARTIAL)
    crc, written = 0, 0
    try:
        with open(partial, "wb") as out:
            while written < obj.size:
                end = min(written + READ_CHUNK, obj.size) - 1
                chunk = rsm.fetch_range(obj.key, written, end)
                if not chunk:
                    break
                crc = crc32c(chunk, crc)
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != obj.size or crc != expected:
            raise RestoreError(f"{rsm.location(obj.key)}: {written} bytes with CRC-32C {crc:08x}, the copy recorded "
                               f"{obj.size} bytes with {expected:08x}: the remote object is damaged (kts scrub --deep); "
                               f"{target.name} not restored")
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    result.files += 1
    result.bytes += written


def _file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            crc = crc32c(chunk, crc)
    return crc


def _write_checkpoints(log_dir: Path, tp: TopicPartition, result: RestoreResult) -> None:
    """This partition's entries in the log dir's three checkpoints, other partitions' kept."""
    wanted = {REPLICATION_OFFSET_CHECKPOINT: result.log_end_offset, RECOVERY_POINT_OFFSET_CHECKPOINT: result.log_end_offset,
              LOG_START_OFFSET_CHECKPOINT: result.log_start_offset}
    for name, offset in wanted.items():
        path = log_dir / name
        entries = dict(read_offset_checkpoint(path)) if path.exists() else {}
        entries[tp] = offset
        write_offset_checkpoint(path, entries)
