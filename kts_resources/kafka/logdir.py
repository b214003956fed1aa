"""A broker log dir as Kafka lays it out: partition directories, segment files, checkpoints.

Discovery and listing never guess: a directory or file that is not live partition data (Kafka's
``-delete`` / ``-future`` / ``-stray`` directories, ``.deleted`` / ``.cleaned`` / ``.swap`` / ``.tmp``
files, names Kafka would not write) is skipped, and every skip is reported with its reason.
Nothing here writes to the log dir.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, NamedTuple

from .checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    TMP_SUFFIX,
    EpochEntry,
    MissingCheckpointError,
    PartitionMetadata,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
)
from .errors import shown
from .partition import HasTopicPartition, TopicPartition, parse_topic_partition

# --- file names (LogFileUtils) ------------------------------------------------------------------

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
PRODUCER_SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

# Files in the middle of deletion, compaction or a write: never live data.
NOT_LIVE_SUFFIXES: Mapping[str, str] = {
    DELETED_SUFFIX: "scheduled for deletion (.deleted)",
    CLEANED_SUFFIX: "compaction output not yet swapped in (.cleaned)",
    SWAP_SUFFIX: "compaction swap in progress (.swap)",
    TMP_SUFFIX: "unfinished write (.tmp)",
}

DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"
STRAY_DIR_SUFFIX = "-stray"
_NOT_LIVE_DIR_SUFFIXES: Mapping[str, str] = {
    DELETE_DIR_SUFFIX: "marked for deletion (-delete)",
    FUTURE_DIR_SUFFIX: "future replica being moved between log dirs (-future)",
    STRAY_DIR_SUFFIX: "stray partition the broker no longer hosts (-stray)",
}
# Directories LogManager itself does not load as partitions.
REMOTE_LOG_INDEX_CACHE_DIR = "remote-log-index-cache"
CLUSTER_METADATA_TOPIC = "__cluster_metadata"

OFFSET_DIGITS = 20
_MAX_OFFSET = 2**63 - 1


def offset_file_name(offset: int, suffix: str) -> str:
    """``offset_file_name(42, ".log")`` → ``"00000000000000000042.log"``."""
    if not 0 <= offset <= _MAX_OFFSET:
        raise ValueError(f"offset {offset} is not a non-negative int64")
    return f"{offset:0{OFFSET_DIGITS}d}{suffix}"


def parse_offset_file_name(name: str) -> tuple[int, str]:
    """``"00000000000000000042.log"`` → ``(42, ".log")``; the suffix runs from the first dot.

    ValueError unless the name starts with exactly 20 digits and a dot.
    """
    stem, dot, rest = name.partition(".")
    if not dot or len(stem) != OFFSET_DIGITS or not (stem.isascii() and stem.isdigit()):
        raise ValueError(f"{name!r} does not start with a {OFFSET_DIGITS}-digit offset and a '.'")
    offset = int(stem)
    if offset > _MAX_OFFSET:
        raise ValueError(f"{name!r}: offset {offset} does not fit an int64")
    return offset, dot + rest


class Skipped(NamedTuple):
    """A directory or file that was not taken as live data, and why."""

    name: str
    reason: str


# --- partition directories ----------------------------------------------------------------------


def _dir_name_verdict(name: str) -> TopicPartition | str:
    """The partition a log-dir entry holds, or the reason it holds none."""
    for suffix, why in _NOT_LIVE_DIR_SUFFIXES.items():
        if name.endswith(suffix):
            # Kafka's form is <topic>-<partition>.<uniqueId><suffix>; name the partition when it parses.
            base, dot, _ = name.rpartition(".")
            try:
                return f"{parse_topic_partition(base)} {why}" if dot else why
            except ValueError:
                return why
    if name == REMOTE_LOG_INDEX_CACHE_DIR:
        return "tiered storage index cache, not a partition"
    try:
        tp = parse_topic_partition(name)
    except ValueError as e:
        return f"not a partition directory: {e}"
    if tp.topic == CLUSTER_METADATA_TOPIC:
        return "KRaft metadata log, not a topic partition"
    return tp


def parse_partition_dir_name(name: str) -> TopicPartition | None:
    """``<legal topic>-<non-negative int>`` → TopicPartition, splitting on the LAST ``-``.

    None for anything that is not a live partition: ``-delete`` / ``-future`` / ``-stray``
    directories, illegal topic names, non-numeric partitions, the KRaft metadata log.
    """
    verdict = _dir_name_verdict(name)
    return verdict if isinstance(verdict, TopicPartition) else None


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """One segment's files. ``txn_index`` is None when absent; the other index paths are where
    Kafka keeps them, present or not (Kafka rebuilds missing ones). The last segment is active."""

    base_offset: int
    log: Path
    offset_index: Path
    time_index: Path
    txn_index: Path | None
    active: bool
    # The following segment's base offset (so this segment ends at next_base_offset - 1); None when active.
    next_base_offset: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionScan:
    """Everything live in a partition directory, and what was skipped."""

    segments: list[SegmentFiles]
    snapshots: dict[int, Path]
    skipped: list[Skipped]
    # Entries named like a segment's .log that are not regular files (a dangling link, a FIFO): the
    # partition's offsets have a hole kts cannot see into, so its segments cannot be listed.
    unreadable_logs: list[Skipped] = ()  # type: ignore[assignment]


class UnreadableSegmentError(OSError):
    """A partition directory holds a ``.log`` that is not a regular file: without it the segment
    before would seem to run on to the one after, so the partition is not listed at all."""


_SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
_KNOWN_PARTITION_FILES = frozenset({LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA})
NOT_REGULAR = "not a regular file"


def scan_partition_dir(partition_dir: str | os.PathLike) -> PartitionScan:
    """Segments (offset order, last active), producer snapshots, and skipped entries with reasons."""
    directory = Path(partition_dir)
    by_suffix: dict[str, dict[int, Path]] = {suffix: {} for suffix in (*_SEGMENT_SUFFIXES, PRODUCER_SNAPSHOT_SUFFIX)}
    skipped: list[Skipped] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            reason = _file_verdict(entry, by_suffix)
            if reason is not None:
                skipped.append(Skipped(entry.name, reason))

    logs = by_suffix[LOG_SUFFIX]
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        for offset, path in by_suffix[suffix].items():
            if offset not in logs:
                skipped.append(Skipped(path.name, f"orphaned index: no {offset_file_name(offset, LOG_SUFFIX)}"))

    segments = _segments(directory, logs, by_suffix[TXN_INDEX_SUFFIX])
    snapshots = dict(sorted(by_suffix[PRODUCER_SNAPSHOT_SUFFIX].items()))
    unreadable = sorted(s for s in skipped if s.reason.startswith(NOT_REGULAR) and s.name.endswith(LOG_SUFFIX))
    return PartitionScan(segments, snapshots, sorted(skipped), unreadable)


def _file_verdict(entry: os.DirEntry, by_suffix: dict[str, dict[int, Path]]) -> str | None:
    """File the entry under its suffix and offset; return why it was skipped, or None."""
    name = entry.name
    for suffix, why in NOT_LIVE_SUFFIXES.items():
        if name.endswith(suffix):
            return why
    link_problem = _unfollowable(entry)
    if name in _KNOWN_PARTITION_FILES and (link_problem is not None or not entry.is_dir()):
        return link_problem  # a loop: read where it is used, which then names it
    suffix = next((s for s in by_suffix if name.endswith(s)), None)
    if suffix is None:
        if link_problem is not None:
            return link_problem
        return "unexpected directory in a partition directory" if entry.is_dir() else "not a Kafka partition file"
    try:
        offset, found_suffix = parse_offset_file_name(name)
    except ValueError as e:
        return f"bad file name: {e}"
    if found_suffix != suffix:
        return f"bad file name: unexpected suffix {found_suffix!r}"
    if link_problem is not None or not entry.is_file():
        return link_problem or NOT_REGULAR
    by_suffix[suffix][offset] = Path(entry.path)
    return None


def _unfollowable(entry: os.DirEntry) -> str | None:
    """Why a symbolic link cannot be followed (a loop, a self-link), or None. DirEntry.is_dir and
    is_file raise on such a link (they swallow only a dangling one's FileNotFoundError), so a
    loop in one partition dir would otherwise stop the listing of every partition."""
    if not entry.is_symlink():
        return None
    try:
        entry.stat()
    except FileNotFoundError:
        return None  # dangling: is_dir and is_file say False, and a .log is NOT_REGULAR
    except OSError as e:
        return f"{NOT_REGULAR}: a symbolic link that cannot be followed ({(e.strerror or str(e)).lower()})"
    return None


def _segments(directory: Path, logs: dict[int, Path], txn_indexes: dict[int, Path]) -> list[SegmentFiles]:
    offsets = sorted(logs)
    segments = []
    for i, base in enumerate(offsets):
        next_base = offsets[i + 1] if i + 1 < len(offsets) else None
        segments.append(SegmentFiles(
            base_offset=base,
            log=logs[base],
            offset_index=directory / offset_file_name(base, INDEX_SUFFIX),
            time_index=directory / offset_file_name(base, TIME_INDEX_SUFFIX),
            txn_index=txn_indexes.get(base),
            active=next_base is None,
            next_base_offset=next_base,
        ))
    return segments


def list_segments(partition_dir: str | os.PathLike) -> list[SegmentFiles]:
    """The partition's segments in base-offset order; the last (highest base offset) is active.
    UnreadableSegmentError when a ``.log`` there is not a regular file."""
    scan = scan_partition_dir(partition_dir)
    if scan.unreadable_logs:
        bad = scan.unreadable_logs[0]
        raise UnreadableSegmentError(f"{shown(Path(partition_dir) / bad.name)}: {bad.reason}; the partition's "
                                     "segments cannot be listed without it")
    return scan.segments


def list_producer_snapshots(partition_dir: str | os.PathLike) -> dict[int, Path]:
    """Producer snapshot files by the offset in their name, ascending."""
    return scan_partition_dir(partition_dir).snapshots


@dataclass(frozen=True, slots=True)
class PartitionDir(HasTopicPartition):
    """A live partition directory: ``<log dir>/<topic>-<partition>``."""

    path: Path
    topic_partition: TopicPartition

    @classmethod
    def at(cls, path: str | os.PathLike, *, metadata_log: bool = False) -> PartitionDir:
        """The partition directory at ``path``; ValueError if its name is not a live partition's.

        ``metadata_log=True`` also accepts the KRaft metadata log (``__cluster_metadata-0``), for
        inspection only (as Kafka's DumpLogSegments reads it): discovery never lists it, and kts
        never tiers it.
        """
        path = Path(path)
        if metadata_log and path.name.startswith(CLUSTER_METADATA_TOPIC + "-"):
            try:
                return cls(path, parse_topic_partition(path.name))
            except ValueError:
                pass
        verdict = _dir_name_verdict(path.name)
        if not isinstance(verdict, TopicPartition):
            raise ValueError(f"{shown(path)}: {verdict}")
        return cls(path, verdict)

    @property
    def leader_epoch_checkpoint_path(self) -> Path:
        return self.path / LEADER_EPOCH_CHECKPOINT

    @property
    def partition_metadata_path(self) -> Path:
        return self.path / PARTITION_METADATA

    def scan(self) -> PartitionScan:
        return scan_partition_dir(self.path)

    def segments(self) -> list[SegmentFiles]:
        return list_segments(self.path)

    def snapshots(self) -> dict[int, Path]:
        return list_producer_snapshots(self.path)

    def producer_snapshot_path(self, offset: int) -> Path:
        """Where the snapshot at ``offset`` lives (it may not exist)."""
        return self.path / offset_file_name(offset, PRODUCER_SNAPSHOT_SUFFIX)

    def leader_epochs(self, *, missing_ok: bool = True) -> list[EpochEntry]:
        """The epoch lineage; empty when the checkpoint is missing (Kafka starts such a cache empty)."""
        try:
            return read_leader_epoch_checkpoint(self.leader_epoch_checkpoint_path)
        except MissingCheckpointError:
            if missing_ok:
                return []
            raise

    def metadata(self) -> PartitionMetadata | None:
        """``partition.metadata``; None when absent (partitions created before topic ids had none)."""
        try:
            return read_partition_metadata(self.partition_metadata_path)
        except MissingCheckpointError:
            return None


# --- log dirs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Discovery:
    """The live partitions of a log dir (sorted by topic, partition) and what was skipped, with reasons."""

    log_dir: Path
    partitions: list[PartitionDir]
    skipped: list[Skipped]


def discover(log_dir: str | os.PathLike) -> Discovery:
    """Classify every directory under ``log_dir``.

    Plain files there (checkpoints, meta.properties, .lock) are neither partitions nor skips.
    """
    root = Path(log_dir)
    partitions: list[PartitionDir] = []
    skipped: list[Skipped] = []
    with os.scandir(root) as entries:
        for entry in entries:
            # A link that cannot be followed (a loop) named like a partition is still that
            # partition: reading it then fails for it alone, naming the loop. Dropped here, its
            # topic would look gone from the log dirs, and its remote data due for deletion.
            if _unfollowable(entry) is None and not entry.is_dir():
                continue
            verdict = _dir_name_verdict(entry.name)
            if isinstance(verdict, TopicPartition):
                partitions.append(PartitionDir(Path(entry.path), verdict))
            else:
                skipped.append(Skipped(entry.name, verdict))
    partitions.sort(key=lambda p: p.topic_partition)
    return Discovery(root, partitions, sorted(skipped))


def partition_dir_present(path: str | os.PathLike) -> bool:
    """A partition's directory is there: a directory, or a link that cannot be followed (a loop),
    which discovery lists too, so that reading it fails for that partition, naming the loop."""
    path = Path(path)
    if path.is_dir():
        return True
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except OSError:
        return path.is_symlink()
    return False


def discover_partitions(log_dir: str | os.PathLike) -> list[PartitionDir]:
    return discover(log_dir).partitions


@dataclass(frozen=True, slots=True)
class OffsetCheckpoint:
    """One of the log dir's offset checkpoints as read; ``note`` says why it is empty when it is missing."""

    path: Path
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    note: str | None = None

    @property
    def missing(self) -> bool:
        return self.note is not None

    def get(self, tp: TopicPartition) -> int | None:
        return self.offsets.get(tp)


# The last read of each checkpoint, under the file's identity when read (inode, mtime, size): a
# pass asks for one partition's offset thousands of times, and parsing a 4,000-line checkpoint
# each time made every pass quadratic in the partition count (bench/scale_bench.py). The broker
# replaces a checkpoint by renaming a new file over it, so a changed file has a new identity.
_READ: dict[Path, tuple[tuple[int, int, int], OffsetCheckpoint]] = {}
_READ_LOCK = threading.Lock()


def read_offset_checkpoint_or_empty(path: str | os.PathLike) -> OffsetCheckpoint:
    """The checkpoint's offsets (read-only); empty with a note when the file is missing. Malformed
    still raises. The file is parsed again only when it changed since the last read."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        identity = None  # missing or unreadable: the read says which
    else:
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        with _READ_LOCK:
            last = _READ.get(path)
        if last is not None and last[0] == identity:
            return last[1]
    try:
        checkpoint = OffsetCheckpoint(path, MappingProxyType(read_offset_checkpoint(path)))
    except MissingCheckpointError as e:
        return OffsetCheckpoint(path, {}, note=str(e))
    if identity is not None:
        with _READ_LOCK:
            _READ[path] = (identity, checkpoint)
    return checkpoint


class LogDir:
    """One broker log dir. Every call sees the files as they are now (the broker rewrites
    checkpoints every few seconds); a checkpoint is parsed again only when it changed."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"LogDir({str(self.path)!r})"

    def discover(self) -> Discovery:
        return discover(self.path)

    def partitions(self) -> list[PartitionDir]:
        return self.discover().partitions

    def partition_dir(self, tp: TopicPartition) -> PartitionDir:
        """Where ``tp``'s directory is (or would be) in this log dir."""
        return PartitionDir(self.path / tp.dir_name, tp)

    def high_watermarks(self) -> OffsetCheckpoint:
        return read_offset_checkpoint_or_empty(self.path / REPLICATION_OFFSET_CHECKPOINT)

    def recovery_points(self) -> OffsetCheckpoint:
        return read_offset_checkpoint_or_empty(self.path / RECOVERY_POINT_OFFSET_CHECKPOINT)

    def log_start_offsets(self) -> OffsetCheckpoint:
        return read_offset_checkpoint_or_empty(self.path / LOG_START_OFFSET_CHECKPOINT)

    def high_watermark(self, tp: TopicPartition) -> int | None:
        return self.high_watermarks().get(tp)

    def recovery_point(self, tp: TopicPartition) -> int | None:
        return self.recovery_points().get(tp)

    def log_start_offset(self, tp: TopicPartition) -> int | None:
        """None when not checkpointed: Kafka then takes the first segment's base offset."""
        return self.log_start_offsets().get(tp)
