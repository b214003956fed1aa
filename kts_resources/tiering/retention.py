"""Retention rules, once (KAFKA_FORMATS.md §4 and §7; KIP-33 and KIP-405): what in a partition has
expired in the remote tier and in the local log. Pure: values in, a plan out — the retention_state
asset, the expiry procedure, the retention sensor and `kts status` all ask these functions.

Remote (RemoteLogManager's expiration task), per partition, oldest segment first, stopping at the
first segment that is kept:

* ``retention.bytes``: the local-only bytes (segments not yet copied, the active one included)
  plus the remote bytes over the limit are deleted oldest first while what stays is ≥ the limit;
* ``retention.ms``: a segment whose largest timestamp ≤ now − retention.ms (a segment without
  timestamps carries its file's modification time, as Kafka's ``largestTimestamp`` does);
* log start offset breach: a segment whose end offset < the log start offset (DeleteRecords);

each segment weighing only the bytes of the offsets it serves on the partition's current
leader-epoch lineage (kts_resources/tiering/lineage.py: overlapping copies count once). Outside that walk,
segments a reader never reads go without moving the log start offset: those off the lineage (an
old leader's records after an unclean election: Kafka's isRemoteSegmentWithinLeaderEpochs) and
those wholly covered by others (two replicas' copies of the same offsets). Segments deleted by
size or time move the log start offset past the last offset they served; the new log start offset
is recorded before any object is deleted.

Local (UnifiedLog.deleteOldSegments with remote storage on): ``local.retention.ms`` /
``local.retention.bytes`` (−2: the topic's retention.*) in three passes — time, then size, then
the log start offset — each taking the oldest segments while its rule holds; only closed segments
wholly below the high watermark and already in the remote tier (end offset ≤ the highest offset
copied) may go. With ``remote.log.copy.disable`` the local log falls back to retention.* and its
segments need not be copied first, as in Kafka.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kts_resources.kafka.checkpoints import EpochEntry
from kts_resources.tiering.lineage import readable_spans, unused_segments
from kts_resources.remote_log import RemoteLogSegmentMetadata

BY_SIZE = "retention.bytes"
BY_TIME = "retention.ms"
BY_LOG_START_OFFSET = "log start offset"
BY_LINEAGE = "leader-epoch lineage"
BY_COVERED = "covered by other segments"
LOCAL_BY_TIME = "local.retention.ms"
LOCAL_BY_SIZE = "local.retention.bytes"


@dataclass(frozen=True)
class RetentionConfig:
    """The topic's retention settings as Kafka resolves them (−1: unbounded)."""

    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    local_retention_ms: int = -1  # effective: −2 already resolved to retention.ms
    local_retention_bytes: int = -1
    copy_enabled: bool = True

    @classmethod
    def from_topic_config(cls, config, topic: str, broker: Mapping[str, str] | None = None) -> "RetentionConfig":
        """From a metadata.topic_config.TopicConfig; a key the topic does not set falls back to
        the broker-level default (``log.retention.ms`` etc., as ``kts broker-config`` stores them),
        then to Kafka's default — as a topic's config falls back to the broker's in Kafka."""
        broker = broker or {}

        def resolved(key: str, broker_key: str, value: int) -> int:
            return value if config.is_set(key) or broker_key not in broker else int(broker[broker_key])

        retention_ms = resolved("retention.ms", "log.retention.ms", config.retention_ms)
        retention_bytes = resolved("retention.bytes", "log.retention.bytes", config.retention_bytes)
        local_ms = resolved("local.retention.ms", "log.local.retention.ms", config.local_retention_ms)
        local_bytes = resolved("local.retention.bytes", "log.local.retention.bytes", config.local_retention_bytes)
        copy_enabled = config.copy_enabled(topic)
        if not copy_enabled:  # the local log keeps the topic's retention.*, as Kafka falls back to it
            local_ms, local_bytes = retention_ms, retention_bytes
        return cls(
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            local_retention_ms=retention_ms if local_ms == SAME_AS_RETENTION else local_ms,
            local_retention_bytes=retention_bytes if local_bytes == SAME_AS_RETENTION else local_bytes,
            copy_enabled=copy_enabled,
        )


# Broker-level retention defaults kts keeps in the store (Kafka's names), and their lowest values.
BROKER_RETENTION_DEFAULTS = {"log.retention.ms": -1, "log.retention.bytes": -1,
                             "log.local.retention.ms": -2, "log.local.retention.bytes": -2}
SAME_AS_RETENTION = -2


@dataclass(frozen=True)
class Expired:
    """One segment retention takes, and by which rule."""

    start_offset: int
    end_offset: int
    size_bytes: int
    reason: str
    segment_id: uuid.UUID | None = None  # remote segments: the one to delete (the plan's own, not a stale row)


@dataclass(frozen=True)
class ClosedSegment:
    """A closed (rolled) local segment, the only kind local retention deletes, as its rules weigh
    it. (The simulated broker's own view of its segments, active one included, is
    ``kafka.simulator.broker_log.LocalSegment``.)"""

    base_offset: int
    end_offset: int  # the next segment's base offset − 1
    size_bytes: int
    largest_timestamp: int  # the largest record timestamp, or the file's mtime without timestamps


@dataclass(frozen=True)
class RemotePlan:
    expired: list[Expired] = field(default_factory=list)
    log_start_offset: int = -1  # the new log start offset (unchanged when nothing moves it)
    # The largest timestamp of the oldest segment kept (−1: none): retention.ms takes it, and the
    # rest after it, once now − this ≥ retention.ms.
    oldest_retained_timestamp: int = -1

    @property
    def bytes(self) -> int:
        return sum(e.size_bytes for e in self.expired)


@dataclass(frozen=True)
class LocalPlan:
    expired: list[Expired] = field(default_factory=list)
    local_log_start_offset: int = -1

    @property
    def bytes(self) -> int:
        return sum(e.size_bytes for e in self.expired)


def plan_remote_retention(
    segments: Iterable[RemoteLogSegmentMetadata],
    *,
    log_start_offset: int,
    lineage: Sequence[EpochEntry],
    only_local_bytes: int,
    config: RetentionConfig,
    now_ms: int,
) -> RemotePlan:
    """What the remote tier should drop. ``segments``: the partition's COPY_SEGMENT_FINISHED
    segments; ``lineage``: the partition's current leader-epoch lineage (kts_resources/tiering/lineage.py).

    Retention counts what a reader can read: the lineage's spans, each offset's bytes once.
    Segments no span uses — off the lineage, or wholly covered by others — go first, without moving
    the log start offset. Then the segments serving the spans, oldest first, by size, time and the
    log start offset, each weighing its spans' bytes, moving the log start offset past the last
    offset it served."""
    segments = sorted(segments, key=lambda md: (md.start_offset, md.end_offset))
    spans = readable_spans(segments, lineage)
    off, covered = unused_segments(segments, spans, lineage)
    expired = [Expired(md.start_offset, md.end_offset, md.segment_size_in_bytes, BY_LINEAGE, segment_uuid(md)) for md in off]
    expired += [Expired(md.start_offset, md.end_offset, md.segment_size_in_bytes, BY_COVERED, segment_uuid(md)) for md in covered]
    served: dict[int, list] = {}  # id(segment) → [segment, its bytes on the lineage, its last offset served]
    for span in spans:
        entry = served.setdefault(id(span.segment), [span.segment, 0, span.end_offset])
        entry[1] += span.size_bytes
        entry[2] = max(entry[2], span.end_offset)

    breach = None
    if config.retention_bytes >= 0:
        breach = only_local_bytes + sum(unique for _md, unique, _last in served.values()) - config.retention_bytes
    cleanup_until = now_ms - config.retention_ms if config.retention_ms >= 0 else None
    new_start = log_start_offset
    next_kept_timestamp = -1
    for md, unique, last_served in served.values():  # in span order: oldest first
        if breach is not None and breach - unique >= 0:
            breach -= unique
            reason = BY_SIZE
        elif cleanup_until is not None and md.max_timestamp_ms <= cleanup_until:
            if breach is not None:
                breach = max(0, breach - unique)
            reason = BY_TIME
        elif last_served < log_start_offset:
            reason = BY_LOG_START_OFFSET
        else:
            next_kept_timestamp = md.max_timestamp_ms
            break
        expired.append(Expired(md.start_offset, md.end_offset, unique, reason, segment_uuid(md)))
        if reason in (BY_SIZE, BY_TIME):
            new_start = max(new_start, last_served + 1)
    return RemotePlan(expired, new_start, next_kept_timestamp)


def segment_uuid(md) -> uuid.UUID:
    """A segment's UUID, whether ``md`` is RemoteLogSegmentMetadata or the store's slim row."""
    sid = getattr(md.segment_id, "id", md.segment_id)
    return sid if isinstance(sid, uuid.UUID) else uuid.UUID(str(sid))


def plan_local_retention(
    segments: Sequence[ClosedSegment],
    *,
    active_size_bytes: int,
    high_watermark: int,
    highest_copied_offset: int,
    log_start_offset: int,
    config: RetentionConfig,
    now_ms: int,
) -> LocalPlan:
    """What the local log may drop (``segments``: its closed segments, oldest first; the active
    segment is never one of them but counts in the size)."""
    ordered = sorted(segments, key=lambda s: s.base_offset)
    deletable = []
    for s in ordered:
        # Only what is committed and, while copying is on, already safely remote.
        if s.end_offset >= high_watermark or (config.copy_enabled and s.end_offset > highest_copied_offset):
            break
        deletable.append(s)
    expired: list[Expired] = []
    remaining = list(deletable)

    def take_while(rule) -> None:
        while remaining and (reason := rule(remaining[0])) is not None:
            s = remaining.pop(0)
            expired.append(Expired(s.base_offset, s.end_offset, s.size_bytes, reason))

    if config.local_retention_ms >= 0:
        take_while(lambda s: LOCAL_BY_TIME if now_ms - s.largest_timestamp > config.local_retention_ms else None)
    if config.local_retention_bytes >= 0:
        over = [active_size_bytes + sum(s.size_bytes for s in ordered) - sum(e.size_bytes for e in expired)
                - config.local_retention_bytes]

        def by_size(s: ClosedSegment) -> str | None:
            if over[0] - s.size_bytes >= 0:
                over[0] -= s.size_bytes
                return LOCAL_BY_SIZE
            return None

        take_while(by_size)
    take_while(lambda s: BY_LOG_START_OFFSET if s.end_offset < log_start_offset else None)
    rest = [s for s in ordered if s.base_offset not in {e.start_offset for e in expired}]
    start = rest[0].base_offset if rest else (expired[-1].end_offset + 1 if expired else -1)
    return LocalPlan(expired, start)
