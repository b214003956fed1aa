"""What a pass over a partition would start from, as one digest per partition, read for every
partition at once: ``kts sync`` compares it with the digest recorded after the partition's last
pass, and leaves out partitions where nothing changed (kts_assets.sync).

A partition's digest covers everything its steps read and report:

- its directory's files (name, size, modification time: a roll, an append, a deleted or rewritten
  segment or index; the leader-epoch checkpoint and partition.metadata by content, which a broker
  rewrites unchanged when it opens the partition);
- its log dir's checkpoints' entries for it (high watermark, recovery point, log start offset);
- the store's rows of it (``store.partition_change_marks``: partition row, remote segments with
  their states, damage and manifests, lost ranges) and its topic's configs, the broker's configs;
- its remote log index cache and its inventory on this machine (``KTS_HOME``);
- this broker's replica role, whether its log dir is kts's own, and ``salt`` (the caller's: what
  kts code reported it).

Time changes a partition too: ``due_ms`` is the earliest time retention.ms or local.retention.ms
could take a segment of it — the oldest remote segment's largest timestamp plus the shorter of
the two (a copied local segment's records are in a remote segment no older, so no segment is
due earlier). A topic that does not copy gets no digest: its local retention reads timestamps
only the segments have. Plain files and the store in, no Dagster.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.kafka.files import file_tree
from kts_resources.kafka.partition import TopicPartition
from kts_resources.reading.remote_index_cache import cache_directory
from kts_resources.remote_log import RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.spark.inventory import inventory_path
from kts_resources.tiering.retention import RetentionConfig
from kts_resources.tiering.tiers import log_dir_partitions

if TYPE_CHECKING:
    from kts_resources.metadata.store import RemoteLogMetadataStore


# Bumped when what goes into a digest changes: digests recorded before then no longer match.
FINGERPRINT_VERSION = "1"


@dataclass(frozen=True)
class Fingerprint:
    """A partition's digest, and when time alone makes a pass over it do something (None: never)."""

    tip: TopicIdPartition
    digest: str
    due_ms: int | None
    # Its finished remote segments as read for ``due_ms``: what the tier inspection then looks at.
    finished: tuple[RemoteLogSegmentMetadata, ...] = field(default=(), compare=False)


# Small files a broker rewrites whole, unchanged, when it opens a partition (a restart): their
# content is what counts, not their modification time.
_READ_WHOLE = {"leader-epoch-checkpoint", "partition.metadata"}
_INDEX_SUFFIXES = (".index", ".timeindex")


def _partition_files(path: Path) -> list[tuple]:
    """Each file of a partition dir as (name, size, modification time ns), sorted — a broker's
    rewritten-whole files as (name, their bytes' digest), and the active segment's preallocated
    indexes left out (the broker rewrites them on opening; what the active segment holds is its
    .log, and no check reads its indexes)."""
    entries = []
    with os.scandir(path) as found:
        for entry in found:
            if entry.name in _READ_WHOLE:
                entries.append((entry.name, hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()))
            else:
                st = entry.stat()
                entries.append((entry.name, st.st_size, st.st_mtime_ns))
    logs = [e[0] for e in entries if e[0].endswith(".log")]
    if logs:
        active = max(logs)[: -len(".log")]  # offsets are zero-padded: the highest name is the highest offset
        entries = [e for e in entries if not (e[0].startswith(active) and e[0].endswith(_INDEX_SUFFIXES))]
    return sorted(entries)


def due_ms(finished_max_timestamps: Iterable[int], config: RetentionConfig) -> int | None:
    """The earliest time retention.ms or local.retention.ms could take a segment of a partition
    whose finished remote segments have these largest timestamps (None: never, by time)."""
    limits = [ms for ms in (config.retention_ms, config.local_retention_ms) if ms >= 0]
    oldest = min(finished_max_timestamps, default=None)
    if oldest is None or not limits:
        return None
    return oldest + min(limits)


def pass_fingerprints(log_dirs: Iterable[Path], store: "RemoteLogMetadataStore", home: Path, *,
                      owned_log_dirs: Iterable[Path] = (), role: Callable[[TopicPartition], str] = lambda tp: "",
                      salt: str = "") -> dict[str, Fingerprint]:
    """Each partition's fingerprint (key ``topic-partition``), for every partition in the log dirs
    that can have one: a partition whose files or checkpoints cannot be read, of a topic kts does
    not know or does not copy, or in two log dirs is absent — a pass always takes it."""
    topics = store.topics()
    configs = store.all_topic_configs()
    broker = store.broker_configs()
    marks = store.partition_change_marks()
    common = repr((FINGERPRINT_VERSION, salt, sorted(broker.items()))).encode()
    made: dict[str, tuple] = {}  # key → (tip, digest, retention config)
    seen: set[str] = set()
    for loc in log_dir_partitions(log_dirs, owned_log_dirs=owned_log_dirs):
        key, partition, tp = loc.key, loc.partition, loc.partition.topic_partition
        if key in seen:  # in two log dirs: the pass says which one it reads
            made.pop(key, None)
            continue
        seen.add(key)
        config = configs.get(tp.topic)
        if config is None or not config.copy_enabled(tp.topic):
            continue
        try:
            files = _partition_files(partition.path)
            metadata = partition.metadata()
            checkpoints = (loc.log_dir.high_watermark(tp), loc.log_dir.recovery_point(tp), loc.log_dir.log_start_offset(tp))
        except (OSError, KafkaFormatError):
            continue
        topic_id = metadata.topic_id if metadata is not None else topics.get(tp.topic)
        if topic_id is None:
            continue
        tip = TopicIdPartition(topic_id, tp)
        digest = hashlib.sha256(common)
        digest.update(repr((files, checkpoints, loc.owned, role(tp), str(topic_id), marks.get((topic_id, tp.partition)),
                            sorted(config.overrides.items()), file_tree(cache_directory(home, tip)),
                            file_tree(inventory_path(key)))).encode())
        made[key] = (tip, digest.hexdigest(), RetentionConfig.from_topic_config(config, tp.topic, broker))
    finished = store.finished_segments_of(tip for tip, _, _ in made.values())
    out: dict[str, Fingerprint] = {}
    for key, (tip, digest, retention) in made.items():
        segments = tuple(finished.get(tip, ()))
        out[key] = Fingerprint(tip, digest, due_ms((md.max_timestamp_ms for md in segments), retention), segments)
    return out

