"""Who this broker is and who leads each partition, from the broker's own files.

The small interface the rest of kts calls to decide whether its broker copies a partition (only
the leader does, as Kafka's RemoteLogManager copies only on the leader):

- :func:`this_broker_id` — the broker's id from ``meta.properties`` in its log dirs (``node.id``
  of a KRaft node, ``broker.id`` of a ZooKeeper-mode broker);
- :func:`partition_leadership` — each partition's leader, leader epoch, replicas and ISR, replayed
  from the KRaft metadata log ``__cluster_metadata-0`` (``kafka/metadata_log.py``), or None when the
  broker keeps none (ZooKeeper mode, or a plain log dir such as the demo's): then every replica may
  copy;
- :meth:`Leadership.is_leader`.

Callers pass ``settings.log_dirs()`` and ``settings.metadata_log_dir()`` (``KTS_METADATA_LOG_DIR``,
the broker's ``metadata.log.dir``). Nothing here caches: every call reads the files again, as a
broker's leadership changes at any time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..kafka.checkpoints import META_PROPERTIES, MissingCheckpointError, read_meta_properties
from ..kafka.errors import shown
from ..kafka.metadata_log import (
    METADATA_PARTITION_DIR,
    ClusterMetadata,
    Leadership,
    metadata_partition_dir,
    read_cluster_metadata,
)
from ..kafka.partition import TopicPartition

__all__ = [
    "BrokerReplicas", "Leadership", "MetadataLogLocationError", "broker_replicas", "cluster_metadata", "copy_refusal",
    "find_metadata_log", "partition_leadership", "replica_role", "this_broker_id",
]


class MetadataLogLocationError(ValueError):
    """The metadata log is not where it was configured to be, or more than one log dir holds one."""


def this_broker_id(log_dirs: Iterable[str | os.PathLike], metadata_log_dir: str | os.PathLike | None = None) -> int | None:
    """The broker's id, from ``meta.properties`` in each of ``log_dirs`` (and the metadata log dir):
    ``node.id`` (KRaft, version 1) or ``broker.id`` (ZooKeeper mode, version 0). None when no log
    dir has one that names an id. As Kafka's MetaPropertiesEnsemble, every file must agree:
    ValueError naming two that do not; a malformed file raises CheckpointError (file and byte)."""
    dirs = [Path(d) for d in log_dirs]
    if metadata_log_dir is not None:
        configured = Path(metadata_log_dir)
        dirs.append(configured.parent if configured.name == METADATA_PARTITION_DIR else configured)
    found: dict[int, Path] = {}
    for d in dict.fromkeys(dirs):  # each dir once, in order
        path = d / META_PROPERTIES
        try:
            meta = read_meta_properties(path)
        except MissingCheckpointError:
            continue
        if meta.node_id is not None:
            found.setdefault(meta.node_id, path)
    if len(found) > 1:
        (a, pa), (b, pb) = list(found.items())[:2]
        raise ValueError(f"the log dirs disagree on the broker id: {shown(pa)} says {a}, {shown(pb)} says {b}")
    return next(iter(found), None)


def find_metadata_log(log_dirs: Iterable[str | os.PathLike], metadata_log_dir: str | os.PathLike | None = None) -> Path | None:
    """The ``__cluster_metadata-0`` directory: under ``metadata_log_dir`` when given (the broker's
    metadata.log.dir, or that partition directory itself; MetadataLogLocationError when it holds
    none), else the one log dir of ``log_dirs`` that holds it (Kafka's default metadata.log.dir is
    the first of log.dirs; MetadataLogLocationError when several do). None: no metadata log."""
    if metadata_log_dir is not None:
        found = metadata_partition_dir(metadata_log_dir)
        if found is None:
            raise MetadataLogLocationError(
                f"{shown(metadata_log_dir)} holds no {METADATA_PARTITION_DIR} (KTS_METADATA_LOG_DIR names the broker's "
                "metadata.log.dir)")
        return found
    candidates = list(dict.fromkeys(p for d in log_dirs if (p := metadata_partition_dir(d)) is not None))
    if len(candidates) > 1:
        raise MetadataLogLocationError(
            f"more than one log dir holds a {METADATA_PARTITION_DIR}: {', '.join(shown(c) for c in candidates)}; "
            "set KTS_METADATA_LOG_DIR to the broker's metadata.log.dir")
    return candidates[0] if candidates else None


def cluster_metadata(log_dirs: Iterable[str | os.PathLike], metadata_log_dir: str | os.PathLike | None = None) -> ClusterMetadata | None:
    """The whole replay (leadership, topic ids, features, where it started and ended), or None
    when there is no metadata log. MetadataLogError names the file and byte of anything unreadable."""
    found = find_metadata_log(log_dirs, metadata_log_dir)
    return None if found is None else read_cluster_metadata(found)


def partition_leadership(log_dirs: Iterable[str | os.PathLike],
                         metadata_log_dir: str | os.PathLike | None = None) -> dict[TopicPartition, Leadership] | None:
    """Each partition's current leadership, replayed from the broker's KRaft metadata log; None when
    the broker keeps none (ZooKeeper mode, a plain log dir): then no replica can tell the leader,
    and every replica may copy."""
    metadata = cluster_metadata(log_dirs, metadata_log_dir)
    return None if metadata is None else dict(metadata.partitions)


NO_METADATA_LOG = "-"  # the replica's role when the broker keeps no metadata log: every replica copies


def replica_role(leaders: Mapping[TopicPartition, Leadership] | None, tp: TopicPartition, broker_id: int | None) -> str:
    """This broker's replica of ``tp``, in a few words (`kts status`'s ``replica``): ``-`` without a
    metadata log, else ``leader``, ``follower of broker N``, ``no leader``, or ``not in the
    metadata log`` (a topic the replay does not know yet, or deleted)."""
    if leaders is None:
        return NO_METADATA_LOG
    leadership = leaders.get(tp)
    if leadership is None:
        return "not in the metadata log"
    if not leadership.has_leader:
        return "no leader"
    if leadership.is_leader(broker_id):
        return "leader"
    return f"follower of broker {leadership.leader}"


def copy_refusal(leaders: Mapping[TopicPartition, Leadership] | None, tp: TopicPartition, broker_id: int | None) -> str | None:
    """Why this broker's kts must not copy ``tp`` — only the leader's copies, as only the leader's
    RemoteLogManager does — or None when it may: it leads, or the broker keeps no metadata log
    (ZooKeeper mode, a plain log dir), where every replica copies and the copy rules keep the tier
    whole, only at more cost."""
    role = replica_role(leaders, tp, broker_id)
    if role in (NO_METADATA_LOG, "leader"):
        return None
    if broker_id is None:
        return "this broker's id is unknown (no meta.properties names it), so it cannot tell whether it leads; nothing is copied"
    epoch = leaders[tp].leader_epoch if leaders is not None and tp in leaders else None
    at = f" (leader epoch {epoch})" if epoch is not None else ""
    return f"{role}{at}: only the leader's kts copies"


@dataclass(frozen=True)
class BrokerReplicas:
    """This broker and who leads each partition, read once from its files (for a run, a check, a
    status): :func:`replica_role` and :func:`copy_refusal` for any partition."""

    broker_id: int | None
    leaders: Mapping[TopicPartition, Leadership] | None  # None: no metadata log

    def role(self, tp: TopicPartition) -> str:
        return replica_role(self.leaders, tp, self.broker_id)

    def copy_refusal(self, tp: TopicPartition) -> str | None:
        return copy_refusal(self.leaders, tp, self.broker_id)


def broker_replicas(log_dirs: Iterable[str | os.PathLike], metadata_log_dir: str | os.PathLike | None = None) -> BrokerReplicas:
    """:func:`this_broker_id` and :func:`partition_leadership` together; their errors (a file named
    with its byte position, log dirs that disagree) pass to the caller, who decides what an
    unknown leadership means for its work."""
    return BrokerReplicas(this_broker_id(log_dirs, metadata_log_dir), partition_leadership(log_dirs, metadata_log_dir))
