"""A partition's two tiers: where its directory is, its offsets, bytes and segments locally and
remotely, and the rules that relate them — each stated here once.

KIP-405's names: Lx local log start offset, Ly high watermark, Lz log end offset; Rx / Ry the
remote log start / end offset. The partition's log start offset moves only by kts's remote
retention and DeleteRecords; the broker's log-start-offset-checkpoint bounds the local log alone
(:func:`log_start_offset`). Plain paths and the metadata store in, plain values out: no Dagster,
no PySpark, so ``kts status`` (and every command that only looks) starts fast.
"""

from __future__ import annotations

import bisect
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from kts_resources.kafka.checkpoints import EpochEntry
from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.kafka.logdir import LogDir, PartitionDir, SegmentFiles, parse_partition_dir_name, partition_dir_present
from kts_resources.remote_log import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

if TYPE_CHECKING:
    from kts_resources.metadata.store import RemoteLogMetadataStore

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


# --- where a partition is ------------------------------------------------------------------------


@dataclass(frozen=True)
class LocatedPartition:
    """A partition key's directory, the log dir holding it, and whether kts owns that dir."""

    key: str
    log_dir: LogDir
    partition: PartitionDir
    owned: bool


def _resolved(paths: Iterable[Path]) -> set[Path]:
    return {Path(p).expanduser().resolve() for p in paths}


def locate_partitions(log_dirs: Iterable[Path], keys: Iterable[str], *,
                      owned_log_dirs: Iterable[Path] = ()) -> tuple[dict[str, LocatedPartition], list[str]]:
    """(key → where it is, keys found in no log dir). The first log dir holding a key wins, as in
    the discovery sensor; a log dir in ``owned_log_dirs`` is one kts may apply retention to."""
    owned = _resolved(owned_log_dirs)
    dirs = [(LogDir(p), Path(p).expanduser().resolve() in owned) for p in log_dirs if Path(p).is_dir()]
    located: dict[str, LocatedPartition] = {}
    missing: list[str] = []
    for key in keys:
        tp = parse_partition_dir_name(key)
        for log_dir, is_owned in dirs if tp is not None else []:
            partition = log_dir.partition_dir(tp)
            if partition_dir_present(partition.path):  # a link loop too: its reading fails, naming it
                located[key] = LocatedPartition(key, log_dir, partition, is_owned)
                break
        else:
            missing.append(key)
    return located, missing


def log_dir_partitions(log_dirs: Iterable[Path], *, owned_log_dirs: Iterable[Path] = ()) -> Iterator[LocatedPartition]:
    """Every partition dir of every existing log dir, in log-dir order (a key in two log dirs twice)."""
    owned = _resolved(owned_log_dirs)
    for path in log_dirs:
        if Path(path).is_dir():
            log_dir = LogDir(path)
            is_owned = Path(path).expanduser().resolve() in owned
            for partition in log_dir.partitions():
                yield LocatedPartition(partition.topic_partition.dir_name, log_dir, partition, is_owned)


# --- the topic id of a partition -----------------------------------------------------------------


def partition_topic_id(partition: PartitionDir, store: "RemoteLogMetadataStore") -> uuid.UUID | None:
    """partition.metadata's topic id; for a topic that predates topic ids, the one kts recorded
    for the name (None: kts has never seen the topic)."""
    metadata = partition.metadata()
    return metadata.topic_id if metadata is not None else store.topic_id(partition.topic)


def topic_id_partition(partition: PartitionDir, store: "RemoteLogMetadataStore") -> TopicIdPartition | None:
    """The partition under its topic id; None when kts has never seen the topic, so nothing of it
    can be remote."""
    topic_id = partition_topic_id(partition, store)
    return None if topic_id is None else TopicIdPartition(topic_id, partition.topic_partition)


@dataclass(frozen=True)
class TopicIdDisagreement:
    """A partition dir whose partition.metadata names another topic id than its siblings' do."""

    partition: PartitionDir
    topic_id: uuid.UUID
    siblings_topic_id: uuid.UUID | None  # None: the topic's dirs split evenly, no id is the siblings'

    def __str__(self) -> str:
        theirs = (f"its sibling partition dirs have {self.siblings_topic_id}" if self.siblings_topic_id is not None
                  else "its sibling partition dirs are split evenly between topic ids")
        return (f"{self.partition.path}: partition.metadata has topic id {self.topic_id} but {theirs}; "
                f"the partition is not copied until they agree")


def topic_id_disagreements(partitions: Iterable[PartitionDir]) -> dict[Path, TopicIdDisagreement]:
    """Partition dirs (by path) whose topic id is not the one most of their topic's dirs have.

    A topic deleted and re-created while a broker was away can leave a dir of the old incarnation
    beside the new ones; copying it under either id would mix two topics' data. Dirs without
    partition.metadata (topics that predate ids) are not compared.
    """
    by_topic: dict[str, list[tuple[PartitionDir, uuid.UUID]]] = {}
    for partition in partitions:
        try:
            metadata = partition.metadata()
        except (KafkaFormatError, OSError):
            continue  # an unreadable partition.metadata fails that partition's own pass, not its siblings'
        if metadata is not None:
            by_topic.setdefault(partition.topic, []).append((partition, metadata.topic_id))
    found: dict[Path, TopicIdDisagreement] = {}
    for dirs in by_topic.values():
        counts = Counter(topic_id for _, topic_id in dirs).most_common()
        if len(counts) < 2:
            continue
        tie = counts[0][1] == counts[1][1]
        majority = None if tie else counts[0][0]
        for partition, topic_id in dirs:
            if topic_id != majority:
                found[partition.path] = TopicIdDisagreement(partition, topic_id, majority)
    return found


# --- the rules -----------------------------------------------------------------------------------


def eligible_segment_count(base_offsets: Sequence[int], high_watermark: int, recovery_point: int) -> int:
    """How many of the partition's segments (``base_offsets`` ascending, the last one active) may go
    to the remote tier: the leading non-active ones whose next segment's base offset is
    ≤ min(high watermark, recovery point), so that every offset in them is committed and flushed
    (KAFKA_FORMATS.md §7). An unknown high watermark or recovery point (−1) makes none eligible.

    File names alone decide it: the roll sensor's survey and the copier both ask this function.
    """
    # The largest base ≤ bound starts the first segment NOT wholly below it; those before it are.
    return max(bisect.bisect_right(base_offsets, min(high_watermark, recovery_point)) - 1, 0)


def newest_eligible_base_offset(base_offsets: Sequence[int], high_watermark: int, recovery_point: int) -> int | None:
    """Base offset of the newest eligible segment; None when no segment is eligible."""
    n = eligible_segment_count(base_offsets, high_watermark, recovery_point)
    return base_offsets[n - 1] if n else None


def copy_lag_base_offsets(base_offsets: Sequence[int], highest_copied_offset: int) -> list[int]:
    """Base offsets of the segments that make up the copy lag (``base_offsets`` ascending, the last
    one active): the closed segments not yet in the remote tier — base offset ≥ the highest copied
    offset, as UnifiedLog's onlyLocalLogSegmentsSize counts them — eligible or not. File names
    alone decide it: the roll sensor's survey and :func:`partition_view.tiers_of` both ask this function."""
    return [base for base in base_offsets[:-1] if base >= highest_copied_offset]


def copy_candidates(
    segments: Sequence[SegmentFiles],
    *,
    high_watermark: int,
    recovery_point: int,
    log_start_offset: int,
    highest_copied_offset: int,
    copy_limit: int | None = None,
) -> list[SegmentFiles]:
    """The eligible segments not yet copied, ascending: those reaching max(highest copied offset
    + 1, log start offset) by their file names. The copier takes the one holding that offset from
    there on (after a leader change, or an unclean election, the tier holds this replica's lineage
    only up to there: kts_resources/tiering/segment_slice.py); one whose last batch turns out to lie below
    it (a segment vanished after it, so file names overstate it) it skips once it has read it.

    ``copy_limit``: the first offset not to copy (a replica behind the partition's leader-epoch
    lineage copies only below where it diverges, ``lineage.diverges_at``); segments reaching it
    are not candidates."""
    n = eligible_segment_count([s.base_offset for s in segments], high_watermark, recovery_point)
    from_offset = max(highest_copied_offset + 1, log_start_offset)
    return [s for s in segments[:n] if s.next_base_offset - 1 >= from_offset
            and (copy_limit is None or s.next_base_offset <= copy_limit)]


def log_start_offset(*, checkpointed: int | None, local_log_start_offset: int,
                     remote_log_start_offset: int = -1, recorded: int = -1) -> int:
    """The partition's log start offset: its oldest data in either tier, never below what kts
    recorded in the metadata store (``recorded``: its remote retention and DeleteRecords; −1 when
    nothing is recorded). −1: no data at all.

    The broker's ``checkpointed`` log start offset (log-start-offset-checkpoint) bounds only the
    LOCAL log (``local_log_start_offset``: its first segment's base offset; −1 when it has none):
    the broker's own size and time retention, its DeleteRecords, or on a follower the leader's log
    start offset can put it anywhere, and the offsets below it that kts copied stay in the remote
    tier until kts's own retention expires them (README, "Log start offset: whose retention moves it").
    """
    local = local_log_start_offset
    if local >= 0 and checkpointed is not None:
        local = max(local, checkpointed)
    remote = remote_log_start_offset
    oldest = min(local, remote) if local >= 0 and remote >= 0 else max(local, remote)
    return max(oldest, recorded)


def adopt_first_log_start_offset(store: "RemoteLogMetadataStore", tip: TopicIdPartition, partition: PartitionDir,
                                 log_dir: LogDir, segments: Sequence[SegmentFiles]) -> None:
    """On kts's first look at a partition (no first observed offset yet), nothing of it is remote:
    its log is the local log, from where the broker's checkpoint bounds it (a DeleteRecords on the
    broker can put that inside the first segment). Record that as the partition's log start offset,
    so the first segment going remote whole does not bring back offsets the broker had deleted
    before kts looked. Later, the broker's checkpoint moves nothing (see :func:`log_start_offset`);
    and since the offsets below were gone before kts looked, none of them is a lost range."""
    if store.first_observed_offset(tip) is not None:
        return
    if store.partition_state(tip).highest_copied_offset >= 0 or store.finished_summary(tip).segments:
        return  # something is remote (a store rebuilt by `kts recover`, say): only kts moves it now
    start = log_start_offset(checkpointed=log_dir.log_start_offset(partition.topic_partition),
                             local_log_start_offset=segments[0].base_offset if segments else -1)
    if start > 0:
        store.update_log_start_offset(tip, start)


def truncate_from_start(lineage: Sequence[EpochEntry], start_offset: int) -> list[EpochEntry]:
    """The leader-epoch lineage from ``start_offset`` on, as Kafka's LeaderEpochFileCache
    truncateFromStart leaves it when the log start offset moves: entries before it dropped but the
    last of them, which now starts at ``start_offset``."""
    if start_offset < 0:
        return list(lineage)
    kept = [e for e in lineage if e.start_offset >= start_offset]
    below = [e for e in lineage if e.start_offset < start_offset]
    if below and (not kept or kept[0].start_offset > start_offset):
        kept.insert(0, EpochEntry(below[-1].epoch, start_offset))
    return kept


def remote_epoch_starts(finished: Iterable[RemoteLogSegmentMetadata]) -> dict[int, int]:
    """Each leader epoch's first offset over remote segments (the store answers the same for a
    partition's finished segments with ``finished_summary``)."""
    starts: dict[int, int] = {}
    for md in finished:
        for epoch, start in md.segment_leader_epochs.items():
            starts[epoch] = min(start, starts.get(epoch, start))
    return starts


def leader_epoch_lineage(local: Sequence[EpochEntry], remote_epochs: "dict[int, int]",
                         log_start_offset: int) -> list[EpochEntry]:
    """The partition's leader-epoch lineage (Kafka's leader-epoch cache): the local
    leader-epoch-checkpoint, led by the remote segments' epochs (``remote_epochs``: epoch → first
    offset) below where it starts — a partition whose local log is gone or was moved keeps them only
    there — truncated at the log start offset."""
    earlier = [EpochEntry(e, s) for e, s in sorted(remote_epochs.items(), key=lambda kv: kv[1])
               if not local or (s < local[0].start_offset and e < local[0].epoch)]
    return truncate_from_start([*earlier, *local], log_start_offset)


# --- a partition's two tiers ---------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionTiers:
    """A partition's offsets, bytes and segments in both tiers (−1: unknown or none), and the copy
    lag as Kafka's RemoteCopyLagBytes / RemoteCopyLagSegments (KAFKA_FORMATS.md §7)."""

    log_start_offset: int
    local_log_start_offset: int  # Lx
    high_watermark: int  # Ly: what is committed; only segments wholly below it are copied
    log_end_offset: int  # Lz
    recovery_point: int
    remote_log_start_offset: int  # Rx
    remote_log_end_offset: int  # Ry
    highest_copied_offset: int
    local_bytes: int
    local_segments: int
    remote_bytes: int
    remote_segments: int
    copy_lag_bytes: int
    copy_lag_segments: int


def segment_bytes(segments: Iterable[SegmentFiles]) -> int:
    total = 0
    for s in segments:
        try:
            total += s.log.stat().st_size
        except FileNotFoundError:
            pass  # deleted by the broker's retention since it was listed
    return total


def active_log_end_offset(segments: Sequence[SegmentFiles]) -> int:
    """Lz exactly: the next offset after the active segment's last batch. As Kafka's
    LogSegment.readNextOffset, only the tail is read: from the batch the offset index's last entry
    points at to the end (an active segment may hold a GiB). An index that is missing, unreadable
    or points at no batch means the whole segment is scanned."""
    from kts_resources.kafka.errors import KafkaFormatError
    from kts_resources.kafka.indexes import last_offset_index_entry
    from kts_resources.kafka.segment import scan_segment_file, summarize_segment

    if not segments:
        return -1
    active = segments[-1]
    try:
        last = last_offset_index_entry(active.offset_index, active.base_offset)
        tail = last.position if last is not None else 0
        if 0 < tail:
            _size, scan = scan_segment_file(active.log, start=tail)
            first = scan.batches[0] if scan.batches else None
            # The entry names the append's largest offset (or, before Kafka 3, a record's): the batch
            # at its position starts at or below it, and the tail reaches it.
            if (first is not None and first.position == tail
                    and active.base_offset <= first.base_offset <= last.offset <= scan.batches[-1].last_offset):
                return scan.batches[-1].last_offset + 1
    except (OSError, KafkaFormatError):
        pass  # the whole segment tells
    return summarize_segment(active.log, active.base_offset, active=True).next_offset


def finished_segments(tip: TopicIdPartition | None, store: "RemoteLogMetadataStore") -> list[RemoteLogSegmentMetadata]:
    return [] if tip is None else store.list_remote_log_segments(tip, states={FINISHED})


def eligible_segments(tiers: PartitionTiers, segments: Sequence[SegmentFiles]) -> list[SegmentFiles]:
    """The segments the copy rule takes from ``tiers``' offsets (highest copied offset included)."""
    return copy_candidates(segments, high_watermark=tiers.high_watermark, recovery_point=tiers.recovery_point,
                           log_start_offset=tiers.log_start_offset, highest_copied_offset=tiers.highest_copied_offset)

