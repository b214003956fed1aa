"""Kafka's DeleteRecords and topic deletion, and the tiering switches, on kts's two tiers.

DeleteRecords moves the partition's log start offset (recorded in the store under the partition
lock, so reads stop below it at once; in owned log dirs also the log-start-offset-checkpoint and
the leader-epoch-checkpoint, truncated from the start as Kafka's cache is). The next expiry removes
the segments below it (``kts_resources.tiering.expiry``: the log start offset breach).

Topic deletion (and ``remote.storage.enable=false`` with ``remote.log.delete.on.disable=true``)
walks each partition through DELETE_PARTITION_MARKED → DELETE_PARTITION_STARTED → every remote
segment through the one delete procedure, the partition's remote log index files removed from the
tier and from ``KTS_HOME`` → DELETE_PARTITION_FINISHED. Each step is idempotent: a run that died
half-way is finished by the next.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.kafka.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
)
from kts_resources.remote_log import RemoteLogSegmentState, RemotePartitionDeleteState, TopicIdPartition
from kts_resources.tiering.partition_view import PartitionView, locked_partition
from kts_resources.tiering.tiers import LocatedPartition, truncate_from_start

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.metadata.topic_config import TopicConfig
    from kts_resources.tiering.quotas import Clock
    from kts_resources.remote_storage.base import RemoteStorageManager

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


class DeleteRecordsError(ValueError):
    """A DeleteRecords request Kafka would refuse (an offset above the high watermark)."""


class UnknownPartitionError(DeleteRecordsError):
    """A DeleteRecords request for a partition that exists nowhere kts looks: in no log dir it
    reads, and without remote data in the store (Kafka answers UNKNOWN_TOPIC_OR_PARTITION)."""


def current_log_start_offset(view: PartitionView) -> tuple[int, int]:
    """(the partition's log start offset, its high watermark; −1 when unknown). Without a
    replication-offset-checkpoint entry the log end bounds the high watermark."""
    hw = view.high_watermark
    if hw < 0 and view.located is not None:
        hw = view.log_end_offset if view.segments else view.remote_log_end_offset + 1 if view.spans else 0
    return view.log_start_offset, hw


def delete_records(located: LocatedPartition | None, tip: TopicIdPartition, store: "RemoteLogMetadataStore",
                   before: int, *, lock_timeout_s: float | None = 30.0, storage: "RemoteStorageManager | None" = None) -> int:
    """Kafka's DeleteRecords: offsets below ``before`` stop being part of the log. Returns the log
    start offset after it (unchanged when ``before`` is at or below it). With ``storage``, the
    log start offset is also written beside the partition's segments (``kts recover`` reads it:
    the segments' manifests only know it as of their copy); a failure there raises after the store
    has moved, and the same request again writes it."""
    if before < 0:
        raise DeleteRecordsError(f"{tip.topic_partition}: offset {before} is negative")
    if located is None and not store.finished_summary(tip).segments:
        # Nothing to move the start of: a row written now would make the partition, when it
        # appears, "hold" offsets from ``before`` on, never copied below it (issue 34).
        raise UnknownPartitionError(f"{tip.topic_partition}: no such partition (in no log dir kts reads, and "
                                    f"without remote data in the metadata store); nothing was changed")
    with locked_partition(store, tip, located, timeout_s=lock_timeout_s) as held:
        start, hw = current_log_start_offset(held.view)
        if hw >= 0 and before > hw:
            raise DeleteRecordsError(f"{tip.topic_partition}: offset {before} is above the high watermark {hw} "
                                     f"(Kafka answers OFFSET_OUT_OF_RANGE)")
        if before <= start:
            new = start
        else:
            new = store.update_log_start_offset(tip, before)
            if located is not None and located.owned:
                _checkpoint_log_start(located, new)
        recorded = store.partition_state(tip).log_start_offset
        if storage is not None and recorded > 0:
            from kts_resources.remote_storage.manifest import put_log_start_offset

            put_log_start_offset(storage, tip, recorded)
    return new


def _checkpoint_log_start(located: LocatedPartition, start: int) -> None:
    """In an owned log dir, the broker's own records of a moved log start offset."""
    tp = located.partition.topic_partition
    checkpoint = located.log_dir.path / LOG_START_OFFSET_CHECKPOINT
    offsets = read_offset_checkpoint(checkpoint) if checkpoint.exists() else {}
    if offsets.get(tp, -1) < start:
        offsets[tp] = start
        write_offset_checkpoint(checkpoint, offsets)
    epochs = located.partition.leader_epoch_checkpoint_path
    if epochs.exists():
        write_leader_epoch_checkpoint(epochs, truncate_from_start(read_leader_epoch_checkpoint(epochs), start))


@dataclass
class RemoteDataDeletion:
    """What deleting a partition's remote data did."""

    tip: TopicIdPartition
    segments_deleted: int = 0
    index_files_deleted: int = 0
    states: list[str] = field(default_factory=list)


def delete_partition_remote_data(tip: TopicIdPartition, store: "RemoteLogMetadataStore", storage: "RemoteStorageManager",
                                 *, clock: "Clock", home: Path | None, lock_timeout_s: float | None = 30.0) -> RemoteDataDeletion:
    """Every remote segment of the partition and its remote log index, through the partition
    delete states (idempotent: a finished deletion is a no-op, an interrupted one continues)."""
    from kts_resources.tiering.copier import delete_remote_log_segments
    from kts_resources.reading.remote_index_cache import cache_directory

    result = RemoteDataDeletion(tip)
    with store.partition_lock(tip, timeout_s=lock_timeout_s):
        state = store.partition_state(tip).delete_state
        if state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED and not store.list_remote_log_segments(tip):
            return result
        for target in (RemotePartitionDeleteState.DELETE_PARTITION_MARKED, RemotePartitionDeleteState.DELETE_PARTITION_STARTED):
            if _before(store.partition_state(tip).delete_state, target):
                store.put_partition_delete_state(tip, target)
                result.states.append(target.name)
        remaining = store.list_remote_log_segments(tip)  # every state but DELETE_SEGMENT_FINISHED
        delete_remote_log_segments(store, storage, remaining, clock)
        result.segments_deleted += len(remaining)
        prefix = storage.keys.remote_index_prefix(tip)
        keys = [o.key for o in storage.list_objects(prefix)]
        storage.delete_objects([*keys, storage.keys.log_start_offset_key(tip)])
        result.index_files_deleted = len(keys)
        if home is not None:
            shutil.rmtree(cache_directory(home, tip), ignore_errors=True)
        store.put_partition_delete_state(tip, RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)
        result.states.append(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED.name)
    return result


_ORDER = [None, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, RemotePartitionDeleteState.DELETE_PARTITION_STARTED,
          RemotePartitionDeleteState.DELETE_PARTITION_FINISHED]


def _before(current: RemotePartitionDeleteState | None, target: RemotePartitionDeleteState) -> bool:
    return _ORDER.index(current) < _ORDER.index(target)


def delete_topic_remote_data(topic: str, store: "RemoteLogMetadataStore", storage: "RemoteStorageManager", *,
                             clock: "Clock", home: Path | None) -> list[RemoteDataDeletion]:
    """Every partition of ``topic`` (its current topic id) through :func:`delete_partition_remote_data`."""
    topic_id = store.topic_id(topic)
    if topic_id is None:
        raise KeyError(topic)
    return [delete_partition_remote_data(tip, store, storage, clock=clock, home=home)
            for tip in store.partitions() if tip.topic_id == topic_id]


def delete_on_disable_applies(store: "RemoteLogMetadataStore", topic: str, *,
                              topic_configs: Mapping[str, TopicConfig] | None = None) -> bool:
    """``remote.storage.enable=false`` with ``remote.log.delete.on.disable=true``: the topic's
    remote data is to be deleted (Kafka's tiering switch-off with deletion). ``topic_configs``:
    every topic's, if the caller read them (once for many partitions); a topic not in them is read."""
    known = topic_configs.get(topic) if topic_configs is not None else None
    config = known if known is not None else store.topic_configs(topic)
    return config.is_set("remote.storage.enable") and not config.remote_storage_enable and config.remote_log_delete_on_disable


# How long no kts process may have seen a topic in any log dir before its remote data goes, as
# Kafka's topic deletion would take it (kts's own setting, kept with the broker configs).
TOPIC_ABSENCE_GRACE_KEY = "kts.topic.absence.grace.ms"
DEFAULT_TOPIC_ABSENCE_GRACE_MS = 7 * 24 * 3600 * 1000


def topics_gone_from_log_dirs(store: "RemoteLogMetadataStore", present_topics: set[str], *, clock: "Clock") -> list[str]:
    """The topics whose remote data is due to go, as Kafka's topic deletion would take it: none of
    ``present_topics`` (every topic in this process's log dirs), and no kts process sharing the
    store has seen them in a log dir for the grace period (``kts broker-config set
    kts.topic.absence.grace.ms=…``; −1 turns this off). Reads only: the topic deletion sensor asks
    it on every tick."""
    import datetime as dt

    grace_ms = int(store.broker_configs().get(TOPIC_ABSENCE_GRACE_KEY, DEFAULT_TOPIC_ABSENCE_GRACE_MS))
    if grace_ms < 0:
        return []
    cutoff = dt.datetime.fromtimestamp((clock.now_ms() - grace_ms) / 1000, tz=dt.timezone.utc)
    return [t for t in store.topics_unseen_since(cutoff) if t not in present_topics]


def delete_topics_gone_from_log_dirs(store: "RemoteLogMetadataStore", storage: "RemoteStorageManager",
                                     present_topics: set[str], *, clock: "Clock", home: Path | None) -> list[str]:
    """Mark ``present_topics`` (every topic in this process's log dirs) as seen, then delete the
    remote data of the topics :func:`topics_gone_from_log_dirs` names; those topics. Every copy
    pass marks its topics seen too, so a partition reassigned to another broker's log dir is not
    taken for a deletion while a kts beside that broker copies it. `kts sync` and the topic
    deletion job (the Dagster daemon's road) both run this."""
    store.mark_topics_seen(present_topics)
    gone = topics_gone_from_log_dirs(store, present_topics, clock=clock)
    for topic in gone:
        delete_topic_remote_data(topic, store, storage, clock=clock, home=home)
    return gone
