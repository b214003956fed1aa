"""The remote log metadata store: Kafka's RemoteLogMetadataManager on PostgreSQL.

What is where in the remote tier, per topic-partition: each remote segment's life through
KIP-405's states, each partition's log start offset, highest copied offset and delete state, and
each topic's configs, with an append-only event for every change. Also the data-loss alarm's
record: each partition's first observed offset and its lost ranges, open until acknowledged.

Kafka's semantics, kept:
- ``add_remote_log_segment_metadata`` accepts COPY_SEGMENT_STARTED only; every later state goes
  through ``update_remote_log_segment_metadata``, validated by ``check_segment_transition``
  (remote_log.py, the one place transitions are defined) under a row lock.
- ``remote_log_segment_metadata(tip, epoch, offset)`` is RemoteLogMetadataCache's epoch-aware
  lookup: only COPY_SEGMENT_FINISHED segments, searched through the epoch's offset map that
  RemoteLogLeaderEpochState keeps (a later upload covering the same epoch range replaces the
  earlier one), bounded by the epoch's end offset within the segment.
- ``list_remote_log_segments`` lists every state but DELETE_SEGMENT_FINISHED, so failed copies
  and half-done deletes stay visible to whoever cleans up.

Every operation is one transaction. Every operation is also safe to retry after a dropped
connection: reads trivially, writes because a retry recognises its own earlier commit (a commit
can succeed on the server and still lose its reply), so ``database.in_transaction`` retries them
all and only a store that stays unreachable surfaces, as one ``MetadataStoreUnavailable``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, insert as pg_insert
from sqlalchemy.engine import Connection, Engine

from kts_resources.kafka.checkpoints import EpochEntry
from kts_resources.kafka.partition import TopicPartition, topic_name_problem
from kts_resources.metadata import database
from kts_resources.metadata.lineage import current_lineage
from kts_resources.metadata.models import (
    LostRange,
    Partition,
    RemoteLogEvent,
    RemoteSegment,
    RemoteSegmentLeaderEpoch,
    Topic,
    VerifiedObject,
    broker_configs,
    verified_objects,
)
from kts_resources.metadata.quota_config import QuotaConfig
from kts_resources.metadata.topic_config import TopicConfig, parse_value
from kts_resources.remote_log import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundError,  # the one not-found type, shared with the remote tier; re-exported
    TopicIdPartition,
    check_partition_delete_transition,
    check_segment_transition,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
S = RemoteLogSegmentState

TOPICS = Topic.__table__
PARTITIONS = Partition.__table__
SEGMENTS = RemoteSegment.__table__
EPOCHS = RemoteSegmentLeaderEpoch.__table__
EVENTS = RemoteLogEvent.__table__
LOST = LostRange.__table__
VERIFIED = verified_objects

# A finished segment whose manifest the store has not recorded (the partial index
# "remote_segments_without_manifest" holds exactly these rows, so the copy pass's check is cheap).
WITHOUT_MANIFEST_SQL = "state = 'COPY_SEGMENT_FINISHED' AND NOT (custom_metadata ? 'manifest.key')"

# What Kafka's listRemoteLogSegments returns: everything not yet DELETE_SEGMENT_FINISHED.
LISTED_STATES = frozenset(S) - {S.DELETE_SEGMENT_FINISHED}


class EventKind:
    """``remote_log_events.kind`` values."""

    TOPIC_CREATED = "TOPIC_CREATED"
    TOPIC_RECREATED = "TOPIC_RECREATED"  # same name, new topic ID; the old ID's rows stay
    TOPIC_CONFIG_SET = "TOPIC_CONFIG_SET"
    TOPIC_CONFIG_DELETED = "TOPIC_CONFIG_DELETED"
    PARTITION_CREATED = "PARTITION_CREATED"
    SEGMENT_ADDED = "SEGMENT_ADDED"  # new_state COPY_SEGMENT_STARTED
    SEGMENT_STATE_CHANGED = "SEGMENT_STATE_CHANGED"
    LOG_START_OFFSET_CHANGED = "LOG_START_OFFSET_CHANGED"
    PARTITION_DELETE_STATE_CHANGED = "PARTITION_DELETE_STATE_CHANGED"
    FIRST_OFFSET_OBSERVED = "FIRST_OFFSET_OBSERVED"
    LINEAGE_CHANGED = "LINEAGE_CHANGED"  # a replica's newer leader-epoch lineage became the partition's
    LOST_RANGE_DETECTED = "LOST_RANGE_DETECTED"
    LOST_RANGE_ACKNOWLEDGED = "LOST_RANGE_ACKNOWLEDGED"
    SEGMENT_DAMAGE_FOUND = "SEGMENT_DAMAGE_FOUND"  # a finished segment's objects are missing or wrong in the tier
    SEGMENT_DAMAGE_CLEARED = "SEGMENT_DAMAGE_CLEARED"  # found whole in the tier again (the damage was seen in another)
    SEGMENT_MANIFEST_RECORDED = "SEGMENT_MANIFEST_RECORDED"  # a finished segment's manifest written afterwards
    SEGMENT_RECOVERED = "SEGMENT_RECOVERED"  # `kts recover` restored it, COPY_SEGMENT_FINISHED, from its manifest
    SEGMENT_MANIFEST_LOST = "SEGMENT_MANIFEST_LOST"  # its manifest was found missing or wrong; the copy pass rewrites it


class DuplicateRemoteLogSegmentIdError(ValueError):
    """A segment ID was added twice: every copy attempt must bring a fresh UUID."""


class StaleTopicIdError(ValueError):
    """A topic ID the store already saw replaced under that name (a stale view of the cluster)."""


class PartitionLockTimeout(TimeoutError):
    """Another writer held the partition lock for longer than the caller would wait."""


class PartitionLockLost(RuntimeError):
    """The connection holding a partition lock died, and the server released the lock with it."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition's remote-tier bookkeeping; -1 highest copied offset means nothing copied yet."""

    log_start_offset: int = 0
    highest_copied_offset: int = -1
    delete_state: RemotePartitionDeleteState | None = None
    # The partition's current leader-epoch lineage (empty: none recorded yet; kts_resources/tiering/lineage.py).
    lineage: tuple[EpochEntry, ...] = ()


# Each leader epoch's first offset in the partition's offset maps ("referenced" rows are finished
# segments' epochs): walk the distinct epochs one index probe at a time, then one probe for each
# epoch's lowest start offset, both on the partial "_lookup" index.
# A partition's store rows as one digest (partition_change_marks): equal, nothing of it changed.
_CHANGE_MARK_SQL = """
    SELECT p.topic_id, p.partition, md5(
        row(p.*)::text
        || coalesce((SELECT string_agg(row(s.*)::text, ',' ORDER BY s.segment_id) FROM remote_segments s
                     WHERE s.topic_id = p.topic_id AND s.partition = p.partition), '')
        || coalesce((SELECT string_agg(row(l.*)::text, ',' ORDER BY l.id) FROM lost_ranges l
                     WHERE l.topic_id = p.topic_id AND l.partition = p.partition), '')) AS mark
    FROM partitions p"""

_EPOCH_STARTS_SQL = """
WITH RECURSIVE e(epoch) AS (
    SELECT min(leader_epoch) FROM remote_segment_leader_epochs WHERE topic_id = :t AND partition = :p AND referenced
  UNION ALL
    SELECT (SELECT min(leader_epoch) FROM remote_segment_leader_epochs
            WHERE topic_id = :t AND partition = :p AND referenced AND leader_epoch > e.epoch)
    FROM e WHERE e.epoch IS NOT NULL
)
SELECT epoch, (SELECT min(start_offset) FROM remote_segment_leader_epochs
               WHERE topic_id = :t AND partition = :p AND referenced AND leader_epoch = e.epoch)
FROM e WHERE epoch IS NOT NULL
"""


@dataclass(frozen=True, slots=True)
class FinishedSummary:
    """Aggregates over a partition's COPY_SEGMENT_FINISHED segments (−1 offsets: there are none)."""

    segments: int
    bytes: int
    start_offset: int
    end_offset: int
    epoch_starts: dict[int, int]  # leader epoch → its first offset in the finished segments


@dataclass(frozen=True, slots=True)
class LostOffsetRange:
    """Offsets ``start_offset``..``end_offset`` (inclusive) of a partition, deleted locally before
    they reached the remote tier; open until acknowledged."""

    tip: TopicIdPartition
    start_offset: int
    end_offset: int
    detected_at: dt.datetime
    how_found: str
    acknowledged_by: str | None = None
    acknowledged_at: dt.datetime | None = None
    reason: str | None = None

    @property
    def acknowledged(self) -> bool:
        return self.acknowledged_at is not None

    @property
    def offsets(self) -> int:
        return self.end_offset - self.start_offset + 1

    def __str__(self) -> str:
        return f"{self.start_offset}..{self.end_offset}"


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the append-only event log."""

    id: int
    at: dt.datetime
    topic_id: uuid.UUID | None
    partition: int | None
    segment_id: uuid.UUID | None
    kind: str
    old_state: str | None
    new_state: str | None
    details: dict[str, Any]


class PartitionLock:
    """A held partition lock: a session-level advisory lock on its own connection."""

    def __init__(self, tip: TopicIdPartition, conn: Connection, keys: tuple[int, int]) -> None:
        self.tip = tip
        self._conn = conn
        self._keys = keys

    def assert_held(self) -> None:
        """Raise ``PartitionLockLost`` unless this lock is still held (call between steps of a
        long run: a dropped connection silently takes the lock with it)."""
        classid, objid = (key & 0xFFFFFFFF for key in self._keys)
        try:
            held = self._conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                    "AND granted AND objsubid = 2 AND classid = CAST(:classid AS oid) AND objid = CAST(:objid AS oid)"
                ),
                {"classid": classid, "objid": objid},
            ).scalar_one()
        except sa.exc.SQLAlchemyError as exc:
            raise PartitionLockLost(f"lost the lock on {_tip_str(self.tip)}: {getattr(exc, 'orig', None) or exc}") from exc
        if not held:
            raise PartitionLockLost(f"lost the lock on {_tip_str(self.tip)}")

    def _release(self) -> None:
        try:
            if not self._conn.invalidated:
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k1, :k2)"), dict(zip(("k1", "k2"), self._keys)))
        except sa.exc.SQLAlchemyError as exc:
            # The server already released it with the session; never hand this connection on.
            log.warning("partition lock on %s ended with its connection: %s", _tip_str(self.tip), exc)
            _discard(self._conn)
        else:
            self._conn.close()


class RemoteLogMetadataStore:
    """Kafka's RemoteLogMetadataManager, on the PostgreSQL behind ``engine``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @classmethod
    def from_env(cls) -> "RemoteLogMetadataStore":
        """The store at ``KTS_DATABASE_URL`` (or the embedded server), migrated to head."""
        return cls.from_url(database.database_url())

    @classmethod
    def from_url(cls, url: str, *, migrate: bool = True) -> "RemoteLogMetadataStore":
        engine = database.create_engine(url)
        if migrate:
            database.migrate(engine)
        return cls(engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> "RemoteLogMetadataStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self, work: Callable[[Connection, int], T]) -> T:
        return database.in_transaction(self._engine, work)

    # -- topics -----------------------------------------------------------------------------------

    def ensure_topic(self, name: str, topic_id: uuid.UUID, configs: Mapping[str, object] | None = None) -> uuid.UUID:
        """Record ``name`` with ``topic_id``. The configs (overrides under Kafka's names) apply
        when the topic is first recorded or re-created; change them later with
        ``set_topic_config``. A new ID for a known name means the topic was deleted and
        re-created: the name moves to the new ID, and the old ID's partitions are marked
        DELETE_PARTITION_MARKED (their segments stay until topic deletion removes them). An ID the
        name had before the current one is a stale view of the cluster: StaleTopicIdError.
        """
        problem = topic_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        config = TopicConfig(configs)
        config.validate(name)
        if self.topic_id(name) == topic_id:
            return topic_id  # the common case (every copy pass asks): one read, no row lock

        def work(conn: Connection, _attempt: int) -> uuid.UUID:
            inserted = conn.execute(
                pg_insert(TOPICS).values(name=name, topic_id=topic_id, configs=config.overrides)
                .on_conflict_do_nothing().returning(TOPICS.c.name)
            ).first()
            if inserted is not None:
                _event(conn, EventKind.TOPIC_CREATED, topic_id=topic_id, details={"topic": name, "configs": config.overrides})
                return topic_id
            row = conn.execute(sa.select(TOPICS).where(TOPICS.c.name == name).with_for_update()).first()
            owner = conn.execute(sa.select(TOPICS.c.name).where(TOPICS.c.topic_id == topic_id)).scalar_one_or_none()
            if owner is not None and owner != name:
                raise ValueError(f"topic id {topic_id} already belongs to topic {owner!r}, not {name!r}")
            if row is None:
                raise RuntimeError(f"topic {name!r} vanished while being recorded")  # names are never deleted
            if row.topic_id == topic_id:
                return topic_id
            if self._was_topic_id(conn, topic_id):
                raise StaleTopicIdError(f"topic id {topic_id} is an earlier incarnation of {name!r} (now {row.topic_id})")
            conn.execute(
                TOPICS.update().where(TOPICS.c.name == name)
                .values(topic_id=topic_id, configs=config.overrides, updated_at=sa.func.now())
            )
            _event(conn, EventKind.TOPIC_RECREATED, topic_id=topic_id,
                   details={"topic": name, "old_topic_id": str(row.topic_id), "configs": config.overrides})
            # The old id's remote data belongs to a deleted topic now: its partitions are marked for
            # deletion (KAFKA_FORMATS.md §7), which the topic-deletion work carries out; nothing
            # is deleted here, and nothing new is ever added under the old id.
            marked = conn.execute(
                PARTITIONS.update()
                .where(PARTITIONS.c.topic_id == row.topic_id, PARTITIONS.c.delete_state.is_(None))
                .values(delete_state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED.name, updated_at=sa.func.now())
                .returning(PARTITIONS.c.partition)
            ).scalars().all()
            for partition in sorted(marked):
                _event(conn, EventKind.PARTITION_DELETE_STATE_CHANGED,
                       tip=TopicIdPartition(row.topic_id, TopicPartition(name, partition)),
                       old_state=None, new_state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED.name)
            return topic_id

        return self._tx(work)

    @staticmethod
    def _was_topic_id(conn: Connection, topic_id: uuid.UUID) -> bool:
        return conn.execute(
            sa.select(sa.literal(1)).where(
                EVENTS.c.topic_id == topic_id,
                EVENTS.c.kind.in_([EventKind.TOPIC_CREATED, EventKind.TOPIC_RECREATED]),
            ).limit(1)
        ).first() is not None

    def topic_id(self, name: str) -> uuid.UUID | None:
        """The current ID of topic ``name``, None when unknown."""
        return self._tx(lambda conn, _: conn.execute(
            sa.select(TOPICS.c.topic_id).where(TOPICS.c.name == name)).scalar_one_or_none())

    def topics(self) -> dict[str, uuid.UUID]:
        """Every known topic name with its current ID."""
        rows = self._tx(lambda conn, _: conn.execute(sa.select(TOPICS.c.name, TOPICS.c.topic_id).order_by(TOPICS.c.name)).all())
        return {row.name: row.topic_id for row in rows}

    def mark_topics_seen(self, names: Iterable[str], at: dt.datetime | None = None) -> None:
        """Record that these topics are in a log dir now (every kts process sharing the store does)."""
        names = sorted(set(names))
        if not names:
            return
        when = at or sa.func.now()
        self._tx(lambda conn, _: conn.execute(TOPICS.update().where(TOPICS.c.name.in_(names)).values(last_seen_at=when)))

    def topics_unseen_since(self, cutoff: dt.datetime) -> list[str]:
        """Topics no kts process has seen in a log dir since ``cutoff`` (never-seen ones count from
        when kts learned of them), whose remote data is not deleted yet."""
        deleted = RemotePartitionDeleteState.DELETE_PARTITION_FINISHED.name
        live = sa.exists().where(PARTITIONS.c.topic_id == TOPICS.c.topic_id,
                                 sa.or_(PARTITIONS.c.delete_state.is_(None), PARTITIONS.c.delete_state != deleted))
        stmt = (sa.select(TOPICS.c.name)
                .where(sa.func.coalesce(TOPICS.c.last_seen_at, TOPICS.c.created_at) < cutoff, live)
                .order_by(TOPICS.c.name))
        return list(self._tx(lambda conn, _: conn.execute(stmt).scalars().all()))

    def broker_configs(self) -> dict[str, str]:
        """Broker-level settings (the KIP-956 quotas) by Kafka's names; unset ones keep Kafka's defaults."""
        rows = self._tx(lambda conn, _: conn.execute(sa.select(broker_configs.c.name, broker_configs.c.value)).all())
        return {row.name: row.value for row in rows}

    def set_broker_config(self, name: str, value: str | None) -> None:
        """Set one broker-level setting (None: back to Kafka's default). The caller validates it."""
        def work(conn: Connection, _attempt: int) -> None:
            conn.execute(sa.delete(broker_configs).where(broker_configs.c.name == name))
            if value is not None:
                conn.execute(sa.insert(broker_configs).values(name=name, value=str(value)))
        self._tx(work)

    def quota_config(self) -> QuotaConfig:
        """The KIP-956 quota settings every process shares (QuotaConfigError for a bad stored value)."""
        return QuotaConfig.from_properties(self.broker_configs())

    def topic_configs(self, name: str) -> TopicConfig:
        configs = self._tx(lambda conn, _: conn.execute(
            sa.select(TOPICS.c.configs).where(TOPICS.c.name == name)).scalar_one_or_none())
        if configs is None:
            raise RemoteResourceNotFoundError(f"topic {name!r} is not known to the metadata store")
        return TopicConfig(configs)

    def set_topic_config(self, name: str, key: str, value: object) -> TopicConfig:
        """Set one config (validated alone and with the others, as Kafka's AlterConfigs does)."""
        parse_value(key, value)
        return self._change_config(name, lambda config: config.with_config(key, value), key)

    def delete_topic_config(self, name: str, key: str) -> TopicConfig:
        """Back to Kafka's default for ``key`` (validated: the default must fit the others)."""
        return self._change_config(name, lambda config: config.without_config(key), key)

    def _change_config(self, name: str, change: Callable[[TopicConfig], TopicConfig], key: str) -> TopicConfig:
        broker = self.broker_configs()  # the log.*retention* a topic's unset keys inherit, as Kafka validates

        def work(conn: Connection, _attempt: int) -> TopicConfig:
            row = conn.execute(sa.select(TOPICS).where(TOPICS.c.name == name).with_for_update()).first()
            if row is None:
                raise RemoteResourceNotFoundError(f"topic {name!r} is not known to the metadata store")
            old = TopicConfig(row.configs)
            new = change(old)
            new.validate(name, previous=old, broker=broker)
            if new == old:
                return new  # also how a retry finds its own earlier commit
            conn.execute(
                TOPICS.update().where(TOPICS.c.name == name).values(configs=new.overrides, updated_at=sa.func.now())
            )
            deleted = key not in new.overrides
            _event(conn, EventKind.TOPIC_CONFIG_DELETED if deleted else EventKind.TOPIC_CONFIG_SET,
                   topic_id=row.topic_id,
                   details={"topic": name, "key": key, "old": old.overrides.get(key), "new": new.overrides.get(key)})
            return new

        return self._tx(work)

    # -- segments ---------------------------------------------------------------------------------

    def add_remote_log_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        """Record a segment whose copy is starting (COPY_SEGMENT_STARTED only)."""
        if md.state is not S.COPY_SEGMENT_STARTED:
            raise ValueError(f"a remote segment is added in COPY_SEGMENT_STARTED, not {md.state.name}; "
                             "later states go through update_remote_log_segment_metadata")
        epochs = _epoch_ranges(md)
        tip = md.topic_id_partition
        segment_id = md.segment_id.id
        values = {
            "segment_id": segment_id,
            "topic_id": tip.topic_id,
            "partition": tip.partition,
            "start_offset": md.start_offset,
            "end_offset": md.end_offset,
            "max_timestamp_ms": md.max_timestamp_ms,
            "size_bytes": md.segment_size_in_bytes,
            "leader_epochs": {str(epoch): start for epoch, (start, _end) in epochs.items()},
            "state": md.state.name,
            "broker_id": md.broker_id,
            "event_timestamp_ms": md.event_timestamp_ms,
            "custom_metadata": dict(md.custom_metadata),
        }

        def work(conn: Connection, attempt: int) -> None:
            part = self._partition_row(conn, tip, create=True)
            if part.delete_state is not None:
                raise ValueError(f"{_tip_str(tip)} is {part.delete_state}: no new remote segments")
            inserted = conn.execute(
                pg_insert(SEGMENTS).values(**values)
                .on_conflict_do_nothing(index_elements=[SEGMENTS.c.segment_id]).returning(SEGMENTS.c.segment_id)
            ).first()
            if inserted is None:
                existing = self._segment_row(conn, segment_id)
                if attempt > 1 and existing is not None and _to_metadata(existing, tip) == md:
                    return  # this call's own commit, whose reply the dropped connection lost
                raise DuplicateRemoteLogSegmentIdError(f"remote segment {segment_id} already exists")
            conn.execute(EPOCHS.insert(), [
                {"segment_id": segment_id, "leader_epoch": epoch, "topic_id": tip.topic_id, "partition": tip.partition,
                 "start_offset": start, "end_offset": end}
                for epoch, (start, end) in epochs.items()
            ])
            _event(conn, EventKind.SEGMENT_ADDED, tip=tip, segment_id=segment_id, new_state=md.state.name,
                   details={"start_offset": md.start_offset, "end_offset": md.end_offset,
                            "size_bytes": md.segment_size_in_bytes, "leader_epochs": values["leader_epochs"],
                            "broker_id": md.broker_id, "event_timestamp_ms": md.event_timestamp_ms})

        self._tx(work)

    def update_remote_log_segment_metadata(
        self,
        segment_id: RemoteLogSegmentId | uuid.UUID,
        new_state: RemoteLogSegmentState,
        event_timestamp_ms: int,
        custom_metadata: Mapping[str, str] | None = None,
        *,
        broker_id: int | None = None,
    ) -> RemoteLogSegmentMetadata:
        """Move a segment to ``new_state`` (RemoteLogSegmentMetadataUpdate). An invalid
        transition raises ``InvalidStateTransition``; ``custom_metadata``, when given, replaces
        the segment's. On COPY_SEGMENT_FINISHED the segment becomes readable and the partition's
        highest copied offset moves up to its end offset."""
        sid = segment_id.id if isinstance(segment_id, RemoteLogSegmentId) else segment_id

        def work(conn: Connection, attempt: int) -> RemoteLogSegmentMetadata:
            # Partition row first, then the segment row: one lock order for every writer, and
            # the partition lock serialises the epoch bookkeeping of concurrent COPY_SEGMENT_FINISHED.
            owner = sa.select(SEGMENTS.c.topic_id, SEGMENTS.c.partition).where(SEGMENTS.c.segment_id == sid)
            part = conn.execute(
                sa.select(PARTITIONS).where(sa.tuple_(PARTITIONS.c.topic_id, PARTITIONS.c.partition).in_(owner))
                .with_for_update()
            ).first()
            if part is None:
                raise RemoteResourceNotFoundError(f"no remote log segment metadata found for {sid}")
            tip = _row_tip(part)
            before = _to_metadata(self._segment_row(conn, sid, lock=True), tip)
            if attempt > 1 and before.state is new_state and before.event_timestamp_ms == event_timestamp_ms:
                return before  # this call's own commit, whose reply was lost
            check_segment_transition(before.state, new_state)
            after = replace(
                before, state=new_state, event_timestamp_ms=event_timestamp_ms,
                custom_metadata=before.custom_metadata if custom_metadata is None else dict(custom_metadata),
                broker_id=before.broker_id if broker_id is None else broker_id,
            )
            conn.execute(SEGMENTS.update().where(SEGMENTS.c.segment_id == sid).values(
                state=after.state.name, event_timestamp_ms=after.event_timestamp_ms,
                custom_metadata=dict(after.custom_metadata), broker_id=after.broker_id, updated_at=sa.func.now(),
            ))
            details: dict[str, Any] = {"event_timestamp_ms": event_timestamp_ms}
            if broker_id is not None:
                details["broker_id"] = broker_id
            if new_state is S.COPY_SEGMENT_FINISHED:
                replaced = self._reference_epochs(conn, after)
                if replaced:
                    details["unreferenced_segment_ids"] = sorted(str(s) for s in replaced)
                if after.end_offset > part.highest_copied_offset:
                    conn.execute(
                        PARTITIONS.update().where(*_partition_key(PARTITIONS, tip))
                        .values(highest_copied_offset=after.end_offset, updated_at=sa.func.now())
                    )
                    details["highest_copied_offset"] = after.end_offset
            elif new_state is S.DELETE_SEGMENT_STARTED:
                # No longer readable; still listed, so a failed delete is retried. Its objects go:
                # what was verified of them no longer matters.
                conn.execute(EPOCHS.update().where(EPOCHS.c.segment_id == sid).values(referenced=False))
                conn.execute(VERIFIED.delete().where(VERIFIED.c.segment_id == sid))
            _event(conn, EventKind.SEGMENT_STATE_CHANGED, tip=tip, segment_id=sid,
                   old_state=before.state.name, new_state=new_state.name, details=details)
            return after

        return self._tx(work)

    def update_remote_log_segments_delete_state(
        self,
        segment_ids: Iterable[RemoteLogSegmentId | uuid.UUID],
        new_state: RemoteLogSegmentState,
        event_timestamp_ms: int,
    ) -> list[RemoteLogSegmentMetadata]:
        """Move many segments to DELETE_SEGMENT_STARTED or DELETE_SEGMENT_FINISHED in one
        transaction (a batched delete's bookkeeping): all of them or none, with one
        SEGMENT_STATE_CHANGED event per segment as ``update_remote_log_segment_metadata`` writes.
        A segment already in ``new_state`` is left as it is, and so is one already
        DELETE_SEGMENT_FINISHED when asked for DELETE_SEGMENT_STARTED (its delete is over); any
        other invalid transition raises ``InvalidStateTransition`` and nothing is written; an
        unknown id raises RemoteResourceNotFoundError. Returns every segment's metadata after, in
        the order given."""
        if new_state not in (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
            raise ValueError(f"{new_state.name} is not a delete state: use update_remote_log_segment_metadata")
        sids = list(dict.fromkeys(s.id if isinstance(s, RemoteLogSegmentId) else s for s in segment_ids))
        if not sids:
            return []
        left = {new_state, S.DELETE_SEGMENT_FINISHED}

        def work(conn: Connection, _attempt: int) -> list[RemoteLogSegmentMetadata]:
            # The ids travel as one array parameter: a batch is one short statement, whatever its size.
            wanted = SEGMENTS.c.segment_id == sa.any_(_uuid_array(sids))
            # The same lock order as every other writer: partition rows, then segment rows (sorted,
            # so that two batches never wait on each other crosswise).
            owners = sa.select(SEGMENTS.c.topic_id, SEGMENTS.c.partition).where(wanted)
            parts = conn.execute(
                sa.select(PARTITIONS).where(sa.tuple_(PARTITIONS.c.topic_id, PARTITIONS.c.partition).in_(owners))
                .order_by(PARTITIONS.c.topic_id, PARTITIONS.c.partition).with_for_update()
            ).all()
            tips = {(p.topic_id, p.partition): _row_tip(p) for p in parts}
            rows = {r.segment_id: r for r in conn.execute(
                sa.select(SEGMENTS).where(wanted).order_by(SEGMENTS.c.segment_id).with_for_update())}
            missing = [s for s in sids if s not in rows or (rows[s].topic_id, rows[s].partition) not in tips]
            if missing:
                raise RemoteResourceNotFoundError(f"no remote log segment metadata found for {missing[0]}"
                                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            before = {s: _to_metadata(rows[s], tips[(rows[s].topic_id, rows[s].partition)]) for s in sids}
            # A retried transaction whose first commit's reply was lost finds its own rows in
            # ``new_state`` already: left as they are, like any segment already there.
            moving = [s for s in sids if before[s].state not in left]
            for s in moving:
                check_segment_transition(before[s].state, new_state)
            if not moving:
                return [before[s] for s in sids]
            moved = _uuid_array(moving)
            # The events first, from the rows as they are (their old state), in one statement.
            conn.execute(EVENTS.insert().from_select(
                ["topic_id", "partition", "segment_id", "kind", "old_state", "new_state", "details"],
                sa.select(SEGMENTS.c.topic_id, SEGMENTS.c.partition, SEGMENTS.c.segment_id,
                          sa.literal(EventKind.SEGMENT_STATE_CHANGED), SEGMENTS.c.state, sa.literal(new_state.name),
                          sa.literal({"event_timestamp_ms": event_timestamp_ms}, EVENTS.c.details.type))
                .where(SEGMENTS.c.segment_id == sa.any_(moved)).order_by(SEGMENTS.c.segment_id)))
            conn.execute(SEGMENTS.update().where(SEGMENTS.c.segment_id == sa.any_(moved)).values(
                state=new_state.name, event_timestamp_ms=event_timestamp_ms, updated_at=sa.func.now()))
            if new_state is S.DELETE_SEGMENT_STARTED:
                # No longer readable; still listed, so a failed delete is retried.
                conn.execute(EPOCHS.update().where(EPOCHS.c.segment_id == sa.any_(moved)).values(referenced=False))
                conn.execute(VERIFIED.delete().where(VERIFIED.c.segment_id == sa.any_(moved)))
            moved_ids = set(moving)
            return [replace(before[s], state=new_state, event_timestamp_ms=event_timestamp_ms) if s in moved_ids else before[s]
                    for s in sids]

        return self._tx(work)

    def finish_segment_deletes(self, segment_ids: Iterable[uuid.UUID], event_timestamp_ms: int) -> None:
        """DELETE_SEGMENT_STARTED → DELETE_SEGMENT_FINISHED for many segments in one transaction,
        as ``update_remote_log_segments_delete_state(…, DELETE_SEGMENT_FINISHED, …)`` does (the
        same events, all or nothing, a segment already FINISHED left as it is, the same errors),
        but without reading the rows back: the delete procedure has them in hand from the STARTED
        step, so only the ids and states travel."""
        sids = list(dict.fromkeys(segment_ids))
        if not sids:
            return

        def work(conn: Connection, _attempt: int) -> None:
            # Row locks in segment-id order, as every batched transition takes them.
            states = dict(conn.execute(
                sa.select(SEGMENTS.c.segment_id, SEGMENTS.c.state).where(SEGMENTS.c.segment_id == sa.any_(_uuid_array(sids)))
                .order_by(SEGMENTS.c.segment_id).with_for_update()).all())
            missing = [s for s in sids if s not in states]
            if missing:
                raise RemoteResourceNotFoundError(f"no remote log segment metadata found for {missing[0]}"
                                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            moving = [s for s in sids if states[s] != S.DELETE_SEGMENT_FINISHED.name]
            for s in moving:
                check_segment_transition(S[states[s]], S.DELETE_SEGMENT_FINISHED)
            if not moving:
                return
            # One statement: the rows move and their events are written from what the UPDATE returns.
            moved = (SEGMENTS.update().where(SEGMENTS.c.segment_id == sa.any_(_uuid_array(moving)))
                     .values(state=S.DELETE_SEGMENT_FINISHED.name, event_timestamp_ms=event_timestamp_ms, updated_at=sa.func.now())
                     .returning(SEGMENTS.c.topic_id, SEGMENTS.c.partition, SEGMENTS.c.segment_id).cte("moved"))
            conn.execute(EVENTS.insert().from_select(
                ["topic_id", "partition", "segment_id", "kind", "old_state", "new_state", "details"],
                sa.select(moved.c.topic_id, moved.c.partition, moved.c.segment_id, sa.literal(EventKind.SEGMENT_STATE_CHANGED),
                          sa.literal(S.DELETE_SEGMENT_STARTED.name), sa.literal(S.DELETE_SEGMENT_FINISHED.name),
                          sa.literal({"event_timestamp_ms": event_timestamp_ms}, EVENTS.c.details.type))
                .order_by(moved.c.segment_id)))

        self._tx(work)

    @staticmethod
    def _reference_epochs(conn: Connection, md: RemoteLogSegmentMetadata) -> set[uuid.UUID]:
        """Put a finished segment into each of its epochs' offset maps, as
        RemoteLogLeaderEpochState.handleSegmentWithCopySegmentFinishedState does: when the epoch's
        highest copied offset so far is ≤ this segment's end for the epoch, entries starting at
        or after this one's start are superseded (a new leader re-uploaded the range); an entry
        at the very same start offset is always replaced. Returns the segments unreferenced."""
        tip, sid = md.topic_id_partition, md.segment_id.id
        replaced: set[uuid.UUID] = set()
        for epoch, (start, end) in _epoch_ranges(md).items():
            in_epoch = (*_partition_key(EPOCHS, tip), EPOCHS.c.leader_epoch == epoch)
            # The epoch's highest offset before this segment joins it (NULL: nothing copied yet).
            # Both statements are shaped for their partial indexes (ORDER BY … LIMIT 1 on
            # "_highest", a range from ``start`` on "_lookup"): an epoch can span thousands of
            # segments, and neither may scan them all.
            highest = (sa.select(EPOCHS.c.end_offset).where(*in_epoch, EPOCHS.c.copied)
                       .order_by(EPOCHS.c.end_offset.desc()).limit(1).scalar_subquery())
            superseded = sa.and_(EPOCHS.c.start_offset >= start, sa.or_(EPOCHS.c.start_offset == start, highest <= end))
            replaced.update(conn.execute(
                EPOCHS.update().where(*in_epoch, EPOCHS.c.referenced, superseded)
                .values(referenced=False).returning(EPOCHS.c.segment_id)
            ).scalars())
        # Epochs are independent of each other, so all of the segment's join their maps at once.
        conn.execute(EPOCHS.update().where(EPOCHS.c.segment_id == sid).values(referenced=True, copied=True))
        replaced.discard(sid)
        return replaced

    # -- manifests and recovery -------------------------------------------------------------------

    def finished_segments_without_manifest(self, tip: TopicIdPartition, limit: int = 1000) -> list[RemoteLogSegmentMetadata]:
        """Up to ``limit`` of the partition's COPY_SEGMENT_FINISHED segments whose manifest is not
        recorded (copied before manifests existed), by start offset. One probe of a partial index
        that is empty once every segment has its manifest."""
        stmt = (sa.select(SEGMENTS).where(*_partition_key(SEGMENTS, tip), sa.text(WITHOUT_MANIFEST_SQL))
                .order_by(SEGMENTS.c.start_offset).limit(limit))
        rows = self._tx(lambda conn, _: conn.execute(stmt).all())
        return [_to_metadata(row, tip) for row in rows]

    def record_segment_manifest(self, segment_id: RemoteLogSegmentId | uuid.UUID, manifest: Mapping[str, str]) -> bool:
        """Add the manifest's ``manifest.key`` / ``.size`` / ``.crc32c`` to a COPY_SEGMENT_FINISHED
        segment's custom metadata (a manifest written after the fact). Not a state change; False
        when the segment is no longer finished (deleted meanwhile) or already has these."""
        sid = segment_id.id if isinstance(segment_id, RemoteLogSegmentId) else segment_id

        def work(conn: Connection, _attempt: int) -> bool:
            row = self._segment_row(conn, sid, lock=True)
            if row is None or row.state != S.COPY_SEGMENT_FINISHED.name:
                return False
            custom = {**row.custom_metadata, **manifest}
            if custom == row.custom_metadata:
                return False  # also how a retry finds its own earlier commit
            conn.execute(SEGMENTS.update().where(SEGMENTS.c.segment_id == sid)
                         .values(custom_metadata=custom, updated_at=sa.func.now()))
            topic = conn.execute(sa.select(PARTITIONS.c.topic).where(
                PARTITIONS.c.topic_id == row.topic_id, PARTITIONS.c.partition == row.partition)).scalar_one()
            _event(conn, EventKind.SEGMENT_MANIFEST_RECORDED, tip=TopicIdPartition(row.topic_id, TopicPartition(topic, row.partition)),
                   segment_id=sid, details=dict(manifest))
            return True

        return self._tx(work)

    def forget_segment_manifest(self, segment_id: RemoteLogSegmentId | uuid.UUID, problem: str) -> bool:
        """Drop a finished segment's recorded manifest (found missing or wrong in the tier), so the
        next copy pass writes it again (``finished_segments_without_manifest``). True when this
        call dropped it."""
        sid = segment_id.id if isinstance(segment_id, RemoteLogSegmentId) else segment_id

        def work(conn: Connection, _attempt: int) -> bool:
            row = self._segment_row(conn, sid, lock=True)
            if row is None or row.state != S.COPY_SEGMENT_FINISHED.name or "manifest.key" not in row.custom_metadata:
                return False  # also how a retry finds its own earlier commit
            custom = {k: v for k, v in row.custom_metadata.items() if not k.startswith("manifest.")}
            conn.execute(SEGMENTS.update().where(SEGMENTS.c.segment_id == sid)
                         .values(custom_metadata=custom, updated_at=sa.func.now()))
            _event(conn, EventKind.SEGMENT_MANIFEST_LOST, topic_id=row.topic_id, segment_id=sid,
                   details={"partition": row.partition, "problem": problem})
            return True

        return self._tx(work)

    def recover_remote_log_segments(self, tip: TopicIdPartition, segments: Iterable[RemoteLogSegmentMetadata]) -> int:
        """Record segments described by their manifests (``kts recover``) straight in
        COPY_SEGMENT_FINISHED, in one transaction and in the order given (the order they finished
        in, so each epoch's offset map ends as it was). A segment whose id the store already has,
        in any state, is left as it is: a rerun is a no-op. Each segment is absent or finished,
        never COPY_SEGMENT_STARTED, so no copy pass ever takes one for a crashed copy and deletes
        its objects. Returns how many were recorded; ValueError when the partition is being deleted."""
        wanted = list(segments)
        for md in wanted:
            if md.state is not S.COPY_SEGMENT_FINISHED or md.topic_id_partition != tip:
                raise ValueError(f"segment {md.segment_id.id} is not a COPY_SEGMENT_FINISHED segment of {_tip_str(tip)}")
        if not wanted:
            return 0

        def work(conn: Connection, _attempt: int) -> int:
            part = self._partition_row(conn, tip, create=True)
            if part.delete_state is not None:
                raise ValueError(f"{_tip_str(tip)} is {part.delete_state}: no segments are recovered into it")
            present = set(conn.execute(sa.select(SEGMENTS.c.segment_id).where(
                SEGMENTS.c.segment_id.in_([md.segment_id.id for md in wanted]))).scalars())
            new: list[RemoteLogSegmentMetadata] = []
            for md in wanted:
                if md.segment_id.id not in present:
                    present.add(md.segment_id.id)
                    new.append(md)
            if not new:
                return 0
            ranges = {md.segment_id.id: _epoch_ranges(md) for md in new}
            # Rows and epochs in bulk (statements of many rows, not one per segment).
            conn.execute(SEGMENTS.insert(), [
                {"segment_id": md.segment_id.id, "topic_id": tip.topic_id, "partition": tip.partition,
                 "start_offset": md.start_offset, "end_offset": md.end_offset, "max_timestamp_ms": md.max_timestamp_ms,
                 "size_bytes": md.segment_size_in_bytes,
                 "leader_epochs": {str(e): start for e, (start, _end) in ranges[md.segment_id.id].items()},
                 "state": S.COPY_SEGMENT_FINISHED.name, "broker_id": md.broker_id,
                 "event_timestamp_ms": md.event_timestamp_ms, "custom_metadata": dict(md.custom_metadata)}
                for md in new
            ])
            conn.execute(EPOCHS.insert(), [
                {"segment_id": md.segment_id.id, "leader_epoch": epoch, "topic_id": tip.topic_id, "partition": tip.partition,
                 "start_offset": start, "end_offset": end}
                for md in new for epoch, (start, end) in ranges[md.segment_id.id].items()
            ])
            # Each segment joins its epochs' offset maps as COPY_SEGMENT_FINISHED would put it there.
            # The common case — segments one after another, all above what the maps hold — supersedes
            # nothing, so they join at once; anything else goes one segment at a time, in order.
            replaced: dict[uuid.UUID, set[uuid.UUID]] = {}
            in_order = all(a.end_offset < b.start_offset for a, b in zip(new, new[1:]))
            above = in_order and conn.execute(
                sa.select(sa.literal(1)).where(*_partition_key(EPOCHS, tip), EPOCHS.c.referenced,
                                               EPOCHS.c.start_offset >= new[0].start_offset).limit(1)).first() is None
            if above:
                conn.execute(EPOCHS.update().where(EPOCHS.c.segment_id.in_([md.segment_id.id for md in new]))
                             .values(referenced=True, copied=True))
            else:
                for md in new:
                    replaced[md.segment_id.id] = self._reference_epochs(conn, md)
            conn.execute(EVENTS.insert(), [
                {"topic_id": tip.topic_id, "partition": tip.partition, "segment_id": md.segment_id.id,
                 "kind": EventKind.SEGMENT_RECOVERED, "old_state": None, "new_state": S.COPY_SEGMENT_FINISHED.name,
                 "details": {"start_offset": md.start_offset, "end_offset": md.end_offset,
                             "size_bytes": md.segment_size_in_bytes, "event_timestamp_ms": md.event_timestamp_ms,
                             **({"unreferenced_segment_ids": sorted(map(str, replaced[md.segment_id.id]))}
                                if replaced.get(md.segment_id.id) else {})}}
                for md in new
            ])
            highest = max(md.end_offset for md in new)
            if highest > part.highest_copied_offset:
                conn.execute(PARTITIONS.update().where(*_partition_key(PARTITIONS, tip))
                             .values(highest_copied_offset=highest, updated_at=sa.func.now()))
            return len(new)

        return self._tx(work)

    def remote_log_segment_metadata(
        self, tip: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding ``offset`` written in ``leader_epoch``, or
        None (RemoteLogMetadataCache.remoteLogSegmentMetadata)."""
        stmt = (
            sa.select(SEGMENTS, EPOCHS.c.end_offset.label("epoch_end_offset"))
            .join(EPOCHS, EPOCHS.c.segment_id == SEGMENTS.c.segment_id)
            .where(*_partition_key(EPOCHS, tip), EPOCHS.c.leader_epoch == leader_epoch,
                   EPOCHS.c.referenced, EPOCHS.c.start_offset <= offset)
            .order_by(EPOCHS.c.start_offset.desc())
            .limit(1)
        )
        row = self._tx(lambda conn, _: conn.execute(stmt).first())
        # The floor entry's segment holds the offset only up to the epoch's last offset in it.
        if row is None or offset > row.epoch_end_offset:
            return None
        return _to_metadata(row, tip)

    def highest_offset_for_epoch(self, tip: TopicIdPartition, leader_epoch: int) -> int | None:
        """The highest offset of ``leader_epoch`` in any segment that reached
        COPY_SEGMENT_FINISHED (later deletion included, as in Kafka), or None."""
        stmt = sa.select(sa.func.max(EPOCHS.c.end_offset)).where(
            *_partition_key(EPOCHS, tip), EPOCHS.c.leader_epoch == leader_epoch, EPOCHS.c.copied
        )
        return self._tx(lambda conn, _: conn.execute(stmt).scalar())

    def list_remote_log_segments(
        self,
        tip: TopicIdPartition,
        leader_epoch: int | None = None,
        states: Iterable[RemoteLogSegmentState] | None = None,
    ) -> list[RemoteLogSegmentMetadata]:
        """The partition's segments (those carrying ``leader_epoch`` when given) in ``states``
        (default: all but DELETE_SEGMENT_FINISHED, as Kafka lists), by start offset."""
        stmt = self._segments_query(sa.select(SEGMENTS), tip, leader_epoch, states).order_by(
            SEGMENTS.c.start_offset, SEGMENTS.c.created_at, SEGMENTS.c.segment_id
        )
        rows = self._tx(lambda conn, _: conn.execute(stmt).all())
        return [_to_metadata(row, tip) for row in rows]

    def partition_change_marks(self) -> dict[tuple[uuid.UUID, int], str]:
        """Per recorded partition (topic id, partition), a digest of everything the store keeps of
        it — its partition row, every remote segment row (state, damage, manifest, …) and every
        lost range (acknowledged or not) — in one query: equal digests, nothing of the partition
        changed in the store between the two reads."""
        sql = sa.text(_CHANGE_MARK_SQL)
        rows = self._tx(lambda conn, _: conn.execute(sql).all())
        return {(row.topic_id, row.partition): row.mark for row in rows}

    def partition_change_mark(self, tip: TopicIdPartition) -> str | None:
        """``partition_change_marks`` of one partition (None: never recorded), in one query: what
        `kts serve` compares to keep a partition's reader rather than open it again."""
        sql = sa.text(_CHANGE_MARK_SQL + " WHERE p.topic_id = :t AND p.partition = :p")
        row = self._tx(lambda conn, _: conn.execute(sql, {"t": tip.topic_id, "p": tip.partition}).first())
        return None if row is None else row.mark

    def finished_summary(self, tip: TopicIdPartition) -> "FinishedSummary":
        """Aggregates over the partition's COPY_SEGMENT_FINISHED segments without shipping their
        rows: how many, their bytes, the lowest start and highest end offset, and each leader
        epoch's first offset in the epochs' offset maps (a loose index scan over the partial
        "_lookup" index: a few probes per epoch, however many segments) — what retention and the
        reader need of a partition with a million remote segments."""
        finished = S.COPY_SEGMENT_FINISHED.name

        def work(conn: Connection, _attempt: int) -> FinishedSummary:
            count, size, low, high = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(SEGMENTS.c.size_bytes), 0),
                          sa.func.min(SEGMENTS.c.start_offset), sa.func.max(SEGMENTS.c.end_offset))
                .where(*_partition_key(SEGMENTS, tip), SEGMENTS.c.state == finished)).one()
            epochs = conn.execute(sa.text(_EPOCH_STARTS_SQL), {"t": tip.topic_id, "p": tip.partition}).all()
            return FinishedSummary(int(count), int(size), -1 if low is None else low, -1 if high is None else high,
                                   {int(e): int(start) for e, start in epochs})

        return self._tx(work)

    def tier_totals(self) -> tuple[int, int]:
        """(segments, bytes) COPY_SEGMENT_FINISHED in the whole tier, every partition of every
        broker: what the tier holds for readers, for its plots over time."""
        stmt = (sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(SEGMENTS.c.size_bytes), 0))
                .where(SEGMENTS.c.state == S.COPY_SEGMENT_FINISHED.name))
        count, size = self._tx(lambda conn, _: conn.execute(stmt).one())
        return int(count), int(size)

    def remote_log_size(
        self,
        tip: TopicIdPartition,
        leader_epoch: int | None = None,
        states: Iterable[RemoteLogSegmentState] | None = None,
    ) -> int:
        """Bytes of the segments ``list_remote_log_segments`` returns for the same arguments:
        by default Kafka's RemoteLogSizeBytes (every segment not DELETE_SEGMENT_FINISHED) or, with
        ``leader_epoch``, RemoteLogMetadataManager.remoteLogSize. Retention by size counts
        COPY_SEGMENT_FINISHED only: pass ``states={COPY_SEGMENT_FINISHED}``."""
        stmt = self._segments_query(sa.select(sa.func.coalesce(sa.func.sum(SEGMENTS.c.size_bytes), 0)), tip, leader_epoch, states)
        return int(self._tx(lambda conn, _: conn.execute(stmt).scalar_one()))

    @staticmethod
    def _segments_query(stmt: sa.Select, tip: TopicIdPartition, leader_epoch: int | None,
                        states: Iterable[RemoteLogSegmentState] | None) -> sa.Select:
        wanted = LISTED_STATES if states is None else frozenset(states)
        stmt = stmt.where(*_partition_key(SEGMENTS, tip), SEGMENTS.c.state.in_(sorted(s.name for s in wanted)))
        if leader_epoch is not None:
            stmt = stmt.join(EPOCHS, EPOCHS.c.segment_id == SEGMENTS.c.segment_id).where(EPOCHS.c.leader_epoch == leader_epoch)
        return stmt

    def segment(self, segment_id: RemoteLogSegmentId | uuid.UUID) -> RemoteLogSegmentMetadata | None:
        """One segment by ID, in whatever state (DELETE_SEGMENT_FINISHED included)."""
        sid = segment_id.id if isinstance(segment_id, RemoteLogSegmentId) else segment_id
        stmt = (
            sa.select(SEGMENTS, PARTITIONS.c.topic)
            .join(PARTITIONS, sa.and_(PARTITIONS.c.topic_id == SEGMENTS.c.topic_id, PARTITIONS.c.partition == SEGMENTS.c.partition))
            .where(SEGMENTS.c.segment_id == sid)
        )
        row = self._tx(lambda conn, _: conn.execute(stmt).first())
        if row is None:
            return None
        return _to_metadata(row, TopicIdPartition(row.topic_id, TopicPartition(row.topic, row.partition)))

    def segment_states(self, segment_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, RemoteLogSegmentState]:
        """The current state of each of ``segment_ids`` the store has (an unknown id is absent):
        one primary-key lookup, no row read whole (expiry's re-check of a plan under the lock)."""
        sids = list(dict.fromkeys(segment_ids))
        if not sids:
            return {}
        stmt = sa.select(SEGMENTS.c.segment_id, SEGMENTS.c.state).where(SEGMENTS.c.segment_id == sa.any_(_uuid_array(sids)))
        return {sid: S[state] for sid, state in self._tx(lambda conn, _: conn.execute(stmt).all())}

    # -- partitions -------------------------------------------------------------------------------

    def partition_state(self, tip: TopicIdPartition) -> PartitionState:
        """The partition's state; the initial one (0, -1, None) for a partition never recorded."""
        row = self._tx(lambda conn, _: conn.execute(
            sa.select(PARTITIONS).where(*_partition_key(PARTITIONS, tip))).first())
        return PartitionState() if row is None else _partition_state(row)

    def partition_states(self) -> dict[TopicIdPartition, PartitionState]:
        """Every recorded partition's state, in one query (status views over many partitions)."""
        rows = self._tx(lambda conn, _: conn.execute(
            sa.select(PARTITIONS).order_by(PARTITIONS.c.topic, PARTITIONS.c.partition, PARTITIONS.c.topic_id)).all())
        return {_row_tip(row): _partition_state(row) for row in rows}

    def partitions(self) -> list[TopicIdPartition]:
        """Every recorded partition, old topic incarnations included, by topic then partition."""
        return list(self.partition_states())

    # -- many partitions in one query (a sensor tick planning thousands) ---------------------------

    def partition_states_of(self, tips: Iterable[TopicIdPartition]) -> dict[TopicIdPartition, PartitionState]:
        """``partition_state`` of each of ``tips``, in one query (the initial state for one never recorded)."""
        wanted, rows = self._rows_of_tips(tips, lambda pairs: sa.select(PARTITIONS).join(pairs, _on_tips(PARTITIONS, pairs)))
        states = {tip: PartitionState() for tip in wanted.values()}
        states.update({wanted[(row.topic_id, row.partition)]: _partition_state(row) for row in rows})
        return states

    def finished_segments_of(self, tips: Iterable[TopicIdPartition]) -> dict[TopicIdPartition, list[RemoteLogSegmentMetadata]]:
        """Each of ``tips``' COPY_SEGMENT_FINISHED segments by start offset, in one query: what
        ``list_remote_log_segments(tip, states={COPY_SEGMENT_FINISHED})`` gives, for many partitions."""
        wanted, rows = self._rows_of_tips(tips, lambda pairs: (
            sa.select(SEGMENTS).join(pairs, _on_tips(SEGMENTS, pairs))
            .where(SEGMENTS.c.state == S.COPY_SEGMENT_FINISHED.name)
            .order_by(SEGMENTS.c.topic_id, SEGMENTS.c.partition, SEGMENTS.c.start_offset, SEGMENTS.c.created_at,
                      SEGMENTS.c.segment_id)))
        finished: dict[TopicIdPartition, list[RemoteLogSegmentMetadata]] = {tip: [] for tip in wanted.values()}
        for row in rows:
            tip = wanted[(row.topic_id, row.partition)]
            finished[tip].append(_to_metadata(row, tip))
        return finished

    def lost_ranges_of(self, tips: Iterable[TopicIdPartition]) -> dict[TopicIdPartition, list[LostOffsetRange]]:
        """``lost_ranges(tip)`` (the open ones) of each of ``tips``, in one query."""
        wanted, rows = self._rows_of_tips(tips, lambda pairs: (
            sa.select(LOST).join(pairs, _on_tips(LOST, pairs))
            .where(LOST.c.acknowledged_at.is_(None))
            .order_by(LOST.c.topic_id, LOST.c.partition, LOST.c.start_offset, LOST.c.end_offset)))
        lost: dict[TopicIdPartition, list[LostOffsetRange]] = {tip: [] for tip in wanted.values()}
        for row in rows:
            tip = wanted[(row.topic_id, row.partition)]
            lost[tip].append(_lost_range(row, tip))
        return lost

    def damaged_counts_of(self, tips: Iterable[TopicIdPartition]) -> dict[TopicIdPartition, int]:
        """``len(damaged_segments(tip))`` of each of ``tips``, in one query."""
        wanted, rows = self._rows_of_tips(tips, lambda pairs: (
            sa.select(SEGMENTS.c.topic_id, SEGMENTS.c.partition, sa.func.count())
            .join(pairs, _on_tips(SEGMENTS, pairs))
            .where(SEGMENTS.c.damage.is_not(None), SEGMENTS.c.state == S.COPY_SEGMENT_FINISHED.name)
            .group_by(SEGMENTS.c.topic_id, SEGMENTS.c.partition)))
        counts = dict.fromkeys(wanted.values(), 0)
        counts.update({wanted[(topic_id, partition)]: n for topic_id, partition, n in rows})
        return counts

    def verified_objects_of(self, segment_ids: Iterable[uuid.UUID]) -> dict[tuple[uuid.UUID, str], VerifiedObject]:
        """What was verified of these segments' objects (``record_verified_objects``), by
        (segment id, object key), in one query."""
        sids = list(dict.fromkeys(segment_ids))
        if not sids:
            return {}
        rows = self._tx(lambda conn, _: conn.execute(
            sa.select(VERIFIED.c.segment_id, VERIFIED.c.key, VERIFIED.c.size, VERIFIED.c.tag, VERIFIED.c.crc32c)
            .where(VERIFIED.c.segment_id == sa.any_(_uuid_array(sids)))).all())
        return {(row.segment_id, row.key): VerifiedObject(row.segment_id, row.key, row.size, row.tag, row.crc32c)
                for row in rows}

    def record_verified_objects(self, verified: Iterable[VerifiedObject]) -> None:
        """Remember objects whose bytes were just read and matched their recorded CRC-32C, at the
        version the tier listed them (the latest look replaces an earlier one). A segment no
        longer in the store is skipped: its objects are gone or going."""
        rows = {(v.segment_id, v.key): v for v in verified}
        if not rows:
            return
        values = list(rows.values())
        # One statement however many: the rows as arrays, a segment's only while it is FINISHED
        # (an expiry that began meanwhile deletes them, and must not find them again).
        statement = sa.text(
            "INSERT INTO verified_objects (segment_id, key, size, tag, crc32c) "
            "SELECT v.segment_id, v.key, v.size, v.tag, v.crc32c "
            "FROM unnest(CAST(:ids AS uuid[]), CAST(:keys AS text[]), CAST(:sizes AS bigint[]), CAST(:tags AS text[]), "
            "CAST(:crcs AS bigint[])) AS v(segment_id, key, size, tag, crc32c) "
            "WHERE EXISTS (SELECT 1 FROM remote_segments s WHERE s.segment_id = v.segment_id AND s.state = :finished) "
            "ON CONFLICT (segment_id, key) DO UPDATE SET size = excluded.size, tag = excluded.tag, "
            "crc32c = excluded.crc32c, verified_at = now()"
        ).bindparams(ids=[str(v.segment_id) for v in values], keys=[v.key for v in values], sizes=[v.size for v in values],
                     tags=[v.tag for v in values], crcs=[v.crc32c for v in values], finished=S.COPY_SEGMENT_FINISHED.name)
        self._tx(lambda conn, _: conn.execute(statement))

    def _rows_of_tips(self, tips: Iterable[TopicIdPartition], query: Callable[[sa.Subquery], sa.Select]
                      ) -> tuple[dict[tuple[uuid.UUID, int], TopicIdPartition], list[sa.Row]]:
        """The rows of ``query`` (handed ``tips`` as a table to join on, ``_tips_table``) in one
        statement, and ``tips`` by (topic id, partition), to put each row with its partition."""
        wanted = {(t.topic_id, t.partition): t for t in tips}
        if not wanted:
            return wanted, []
        statement = query(_tips_table(list(wanted.values())))
        return wanted, self._tx(lambda conn, _: conn.execute(statement).all())

    def all_topic_configs(self) -> dict[str, TopicConfig]:
        """Every known topic's configs by name, in one query (``topic_configs`` of each)."""
        rows = self._tx(lambda conn, _: conn.execute(sa.select(TOPICS.c.name, TOPICS.c.configs)).all())
        return {row.name: TopicConfig(row.configs) for row in rows}

    def update_log_start_offset(self, tip: TopicIdPartition, offset: int) -> int:
        """Raise the partition's log start offset to ``offset`` (never lowers it, as Kafka's
        maybeIncrementLogStartOffset); returns the resulting log start offset."""
        if offset < 0:
            raise ValueError(f"log start offset {offset} is negative")

        def work(conn: Connection, _attempt: int) -> int:
            part = self._partition_row(conn, tip, create=True)
            if offset <= part.log_start_offset:
                return part.log_start_offset
            conn.execute(
                PARTITIONS.update().where(*_partition_key(PARTITIONS, tip))
                .values(log_start_offset=offset, updated_at=sa.func.now())
            )
            _event(conn, EventKind.LOG_START_OFFSET_CHANGED, tip=tip,
                   details={"old": part.log_start_offset, "new": offset})
            return offset

        return self._tx(work)

    def record_lineage(self, tip: TopicIdPartition, own: Iterable[EpochEntry]) -> tuple[EpochEntry, ...]:
        """Make a replica's leader-epoch lineage (``own``) the partition's when it is newer than
        the recorded one (``metadata.lineage.current_lineage``: the higher newest epoch wins, so an old
        leader that has not truncated yet never takes it back); returns the partition's lineage."""
        own = list(own)

        def work(conn: Connection, _attempt: int) -> tuple[EpochEntry, ...]:
            part = self._partition_row(conn, tip, create=True)
            recorded = _lineage(part.leader_epochs)
            merged = tuple(current_lineage(recorded, own))
            if merged != recorded:
                conn.execute(PARTITIONS.update().where(*_partition_key(PARTITIONS, tip)).values(
                    leader_epochs=[[e.epoch, e.start_offset] for e in merged], updated_at=sa.func.now()))
                _event(conn, EventKind.LINEAGE_CHANGED, tip=tip, details={
                    "old": [[e.epoch, e.start_offset] for e in recorded], "new": [[e.epoch, e.start_offset] for e in merged]})
            return merged

        return self._tx(work)

    def highest_finished_offset_for_epoch(self, tip: TopicIdPartition, leader_epoch: int) -> int | None:
        """The highest offset of ``leader_epoch`` in a segment that is COPY_SEGMENT_FINISHED now,
        or None: where copying that epoch goes on (``lineage.copy_start_offset``). Unlike
        Kafka's highestOffsetForEpoch, deleted segments do not count: a segment retention took off
        the lineage may be on it again after a later election, and then it must be copied again
        (what retention took by time or size lies below the log start offset, never copied again)."""
        stmt = (sa.select(sa.func.max(EPOCHS.c.end_offset))
                .join(SEGMENTS, SEGMENTS.c.segment_id == EPOCHS.c.segment_id)
                .where(*_partition_key(EPOCHS, tip), EPOCHS.c.leader_epoch == leader_epoch,
                       SEGMENTS.c.state == S.COPY_SEGMENT_FINISHED.name))
        return self._tx(lambda conn, _: conn.execute(stmt).scalar())

    def observe_first_offset(self, tip: TopicIdPartition, local_log_start_offset: int) -> int:
        """Record ``local_log_start_offset`` as the first offset kts observed for the partition,
        unless one is recorded already; returns the recorded one. Offsets below it were gone
        before kts looked, so the data-loss rule never counts them."""
        if local_log_start_offset < 0:
            raise ValueError(f"local log start offset {local_log_start_offset} is negative")

        def work(conn: Connection, _attempt: int) -> int:
            part = self._partition_row(conn, tip, create=True)
            if part.first_observed_offset is not None:
                return part.first_observed_offset  # also how a retry finds its own earlier commit
            conn.execute(
                PARTITIONS.update().where(*_partition_key(PARTITIONS, tip))
                .values(first_observed_offset=local_log_start_offset, updated_at=sa.func.now())
            )
            _event(conn, EventKind.FIRST_OFFSET_OBSERVED, tip=tip, details={"offset": local_log_start_offset})
            return local_log_start_offset

        return self._tx(work)

    def first_observed_offset(self, tip: TopicIdPartition) -> int | None:
        """The first local log start offset kts observed for the partition; None: never looked."""
        return self._tx(lambda conn, _: conn.execute(
            sa.select(PARTITIONS.c.first_observed_offset).where(*_partition_key(PARTITIONS, tip))).scalar_one_or_none())

    # -- damaged remote segments -------------------------------------------------------------------

    def record_segment_damage(self, segment_id: RemoteLogSegmentId | uuid.UUID, problem: str) -> bool:
        """Record that a COPY_SEGMENT_FINISHED segment's objects are missing or wrong in the tier.
        The first finding stays; a segment in any other state is left alone (a delete in
        progress is no loss). True when this call recorded it."""
        sid = segment_id.id if isinstance(segment_id, RemoteLogSegmentId) else segment_id

        def work(conn: Connection, _attempt: int) -> bool:
            row = conn.execute(
                SEGMENTS.update()
                .where(SEGMENTS.c.segment_id == sid, SEGMENTS.c.state == S.COPY_SEGMENT_FINISHED.name, SEGMENTS.c.damage.is_(None))
                .values(damage=problem, damage_found_at=sa.func.now())
                .returning(SEGMENTS.c.topic_id, SEGMENTS.c.partition)
            ).first()
            if row is None:
                return False
            _event(conn, EventKind.SEGMENT_DAMAGE_FOUND, topic_id=row.topic_id, segment_id=sid,
                   details={"partition": row.partition, "problem": problem})
            return True

        return self._tx(work)

    def clear_segment_damage(self, segment_id: RemoteLogSegmentId | uuid.UUID, why: str) -> bool:
        """Forget the damage recorded on a segment that a later look found whole in the tier (the
        damage was seen in another tier, or the objects came back). True when there was some."""
        sid = segment_id.id if isinstance(segment_id, RemoteLogSegmentId) else segment_id

        def work(conn: Connection, _attempt: int) -> bool:
            row = conn.execute(
                SEGMENTS.update().where(SEGMENTS.c.segment_id == sid, SEGMENTS.c.damage.is_not(None))
                .values(damage=None, damage_found_at=None)
                .returning(SEGMENTS.c.topic_id, SEGMENTS.c.partition)
            ).first()
            if row is None:
                return False
            _event(conn, EventKind.SEGMENT_DAMAGE_CLEARED, topic_id=row.topic_id, segment_id=sid,
                   details={"partition": row.partition, "why": why})
            return True

        return self._tx(work)

    def damaged_segments(self, tip: TopicIdPartition) -> list[tuple[RemoteLogSegmentMetadata, str]]:
        """The partition's COPY_SEGMENT_FINISHED segments recorded damaged, with what was found,
        by start offset."""
        stmt = (sa.select(SEGMENTS).where(*_partition_key(SEGMENTS, tip), SEGMENTS.c.damage.is_not(None),
                                          SEGMENTS.c.state == S.COPY_SEGMENT_FINISHED.name)
                .order_by(SEGMENTS.c.start_offset, SEGMENTS.c.created_at))
        rows = self._tx(lambda conn, _: conn.execute(stmt).all())
        return [(_to_metadata(row, tip), row.damage) for row in rows]

    # -- the data-loss alarm ----------------------------------------------------------------------

    def record_lost_range(self, tip: TopicIdPartition, start_offset: int, end_offset: int, how_found: str) -> bool:
        """Record that offsets ``start_offset``..``end_offset`` (inclusive) were deleted locally
        before they reached the remote tier. Idempotent: a range already recorded (open or
        acknowledged) stays as it is. True when this call recorded it."""
        if not 0 <= start_offset <= end_offset:
            raise ValueError(f"lost range {start_offset}..{end_offset} is not 0 ≤ start ≤ end")

        def work(conn: Connection, _attempt: int) -> bool:
            self._partition_row(conn, tip, create=True)
            inserted = conn.execute(
                pg_insert(LOST).values(topic_id=tip.topic_id, partition=tip.partition, start_offset=start_offset,
                                       end_offset=end_offset, how_found=how_found)
                .on_conflict_do_nothing(constraint="lost_ranges_range_key").returning(LOST.c.id)
            ).first()
            if inserted is None:
                return False
            _event(conn, EventKind.LOST_RANGE_DETECTED, tip=tip,
                   details={"start_offset": start_offset, "end_offset": end_offset, "how_found": how_found})
            return True

        return self._tx(work)

    def lost_ranges(self, tip: TopicIdPartition, *, include_acknowledged: bool = False) -> list[LostOffsetRange]:
        """The partition's lost ranges by start offset: the open ones, or all."""
        stmt = sa.select(LOST).where(*_partition_key(LOST, tip)).order_by(LOST.c.start_offset, LOST.c.end_offset)
        if not include_acknowledged:
            stmt = stmt.where(LOST.c.acknowledged_at.is_(None))
        rows = self._tx(lambda conn, _: conn.execute(stmt).all())
        return [_lost_range(row, tip) for row in rows]

    def acknowledge_lost_range(self, tip: TopicIdPartition, start_offset: int, end_offset: int, *,
                               by: str, reason: str | None = None) -> LostOffsetRange:
        """A person accepts the loss of ``start_offset``..``end_offset``: the alarm for it stops.
        The range must be one recorded exactly; acknowledging it again changes nothing."""
        if not by:
            raise ValueError("an acknowledgement names who made it")

        def work(conn: Connection, _attempt: int) -> LostOffsetRange:
            row = conn.execute(
                sa.select(LOST).where(*_partition_key(LOST, tip), LOST.c.start_offset == start_offset,
                                      LOST.c.end_offset == end_offset).with_for_update()
            ).first()
            if row is None:
                open_ranges = conn.execute(
                    sa.select(LOST.c.start_offset, LOST.c.end_offset)
                    .where(*_partition_key(LOST, tip), LOST.c.acknowledged_at.is_(None)).order_by(LOST.c.start_offset)
                ).all()
                known = ", ".join(f"{r.start_offset}..{r.end_offset}" for r in open_ranges) or "none"
                raise RemoteResourceNotFoundError(
                    f"{tip.topic_partition} has no lost range {start_offset}..{end_offset} (open ones: {known})")
            if row.acknowledged_at is not None:
                return _lost_range(row, tip)  # already acknowledged (or this call's own commit)
            acked = conn.execute(
                LOST.update().where(LOST.c.id == row.id)
                .values(acknowledged_by=by, acknowledged_at=sa.func.now(), reason=reason).returning(*LOST.c)
            ).one()
            _event(conn, EventKind.LOST_RANGE_ACKNOWLEDGED, tip=tip,
                   details={"start_offset": start_offset, "end_offset": end_offset, "by": by, "reason": reason})
            return _lost_range(acked, tip)

        return self._tx(work)

    def put_partition_delete_state(self, tip: TopicIdPartition, state: RemotePartitionDeleteState) -> None:
        """Move the partition's deletion on (RemotePartitionDeleteMetadata), validated by
        ``check_partition_delete_transition``."""

        def work(conn: Connection, attempt: int) -> None:
            part = self._partition_row(conn, tip, create=True)
            current = None if part.delete_state is None else RemotePartitionDeleteState[part.delete_state]
            if attempt > 1 and current is state:
                return  # this call's own commit, whose reply was lost
            check_partition_delete_transition(current, state)
            conn.execute(
                PARTITIONS.update().where(*_partition_key(PARTITIONS, tip))
                .values(delete_state=state.name, updated_at=sa.func.now())
            )
            _event(conn, EventKind.PARTITION_DELETE_STATE_CHANGED, tip=tip,
                   old_state=None if current is None else current.name, new_state=state.name)

        self._tx(work)

    def _partition_row(self, conn: Connection, tip: TopicIdPartition, *, create: bool) -> sa.Row:
        """The partition's row, locked for this transaction; created (for the topic's current
        ID only) when ``create`` and missing."""
        stmt = sa.select(PARTITIONS).where(*_partition_key(PARTITIONS, tip)).with_for_update()
        row = conn.execute(stmt).first()
        if row is None:
            if not create:
                raise RemoteResourceNotFoundError(f"no remote log metadata for {_tip_str(tip)}")
            current = conn.execute(sa.select(TOPICS.c.topic_id).where(TOPICS.c.name == tip.topic)).scalar_one_or_none()
            if current is None:
                raise RemoteResourceNotFoundError(f"topic {tip.topic!r} is not known to the metadata store (ensure_topic first)")
            if current != tip.topic_id:
                raise StaleTopicIdError(f"topic {tip.topic!r} is now topic id {current}, not {tip.topic_id}")
            created = conn.execute(
                pg_insert(PARTITIONS).values(topic_id=tip.topic_id, partition=tip.partition, topic=tip.topic)
                .on_conflict_do_nothing().returning(PARTITIONS.c.partition)
            ).first()
            if created is not None:
                _event(conn, EventKind.PARTITION_CREATED, tip=tip)
            row = conn.execute(stmt).one()
        if row.topic != tip.topic:
            raise ValueError(f"topic id {tip.topic_id} is topic {row.topic!r}, not {tip.topic!r}")
        return row

    @staticmethod
    def _segment_row(conn: Connection, segment_id: uuid.UUID, *, lock: bool = False) -> sa.Row | None:
        stmt = sa.select(SEGMENTS).where(SEGMENTS.c.segment_id == segment_id)
        return conn.execute(stmt.with_for_update() if lock else stmt).first()

    # -- events -----------------------------------------------------------------------------------

    def latest_event_id(self) -> int:
        """The newest event's id (0: none yet): where a reader of the event log starts."""
        return int(self._tx(lambda conn, _: conn.execute(sa.select(sa.func.coalesce(sa.func.max(EVENTS.c.id), 0))).scalar_one()))

    def events(self, tip: TopicIdPartition | None = None, since_id: int = 0, limit: int | None = None) -> list[Event]:
        """Events after ``since_id`` (all, or one partition's), oldest first. IDs are assigned
        at insert, so under concurrent writers an ID can commit after a higher one: read with
        some overlap rather than as an exact cursor."""
        stmt = sa.select(EVENTS).where(EVENTS.c.id > since_id).order_by(EVENTS.c.id)
        if tip is not None:
            stmt = stmt.where(*_partition_key(EVENTS, tip))
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = self._tx(lambda conn, _: conn.execute(stmt).all())
        return [Event(row.id, row.at, row.topic_id, row.partition, row.segment_id, row.kind,
                      row.old_state, row.new_state, dict(row.details)) for row in rows]

    # -- partition locks --------------------------------------------------------------------------

    @contextlib.contextmanager
    def partition_lock(self, tip: TopicIdPartition, timeout_s: float | None = None) -> Iterator[PartitionLock]:
        """Hold the partition's writer lock (a session-level advisory lock on a dedicated
        connection) for the block: concurrent copy runs on one partition take turns. Waits
        forever by default; with ``timeout_s`` gives up with ``PartitionLockTimeout``."""
        keys = partition_lock_keys(tip)
        if timeout_s is None:
            conn = self._locked_connection("SELECT pg_advisory_lock(:k1, :k2)", keys)
        else:
            deadline = time.monotonic() + timeout_s
            while True:
                conn = self._try_locked_connection(keys)
                if conn is not None:
                    break
                if time.monotonic() >= deadline:
                    raise PartitionLockTimeout(f"{_tip_str(tip)} stayed locked by another writer for {timeout_s}s")
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        lock = PartitionLock(tip, conn, keys)
        try:
            yield lock
        finally:
            lock._release()

    @contextlib.contextmanager
    def try_partition_lock(self, tip: TopicIdPartition) -> Iterator[PartitionLock | None]:
        """The partition's writer lock if free right now, else None (the caller skips the partition)."""
        keys = partition_lock_keys(tip)
        conn = self._try_locked_connection(keys)
        if conn is None:
            yield None
            return
        lock = PartitionLock(tip, conn, keys)
        try:
            yield lock
        finally:
            lock._release()

    def _try_locked_connection(self, keys: tuple[int, int]) -> Connection | None:
        def attempt(_attempt: int) -> Connection | None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k1, :k2)"), {"k1": keys[0], "k2": keys[1]}).scalar_one()
            except BaseException:
                _discard(conn)
                raise
            if got:
                return conn
            conn.close()
            return None

        return database.with_retries(self._engine, attempt)

    def _locked_connection(self, sql: str, keys: tuple[int, int]) -> Connection:
        def attempt(_attempt: int) -> Connection:
            # Autocommit: waiting for or holding the lock must not keep a transaction open.
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.execute(sa.text(sql), {"k1": keys[0], "k2": keys[1]})
            except BaseException:
                # Interrupted while waiting (or the connection died): the server may grant the
                # lock to this session a moment later, so the session must go, not back to the pool.
                _discard(conn)
                raise
            return conn

        return database.with_retries(self._engine, attempt)


def partition_lock_keys(tip: TopicIdPartition) -> tuple[int, int]:
    """The two int4 keys of a partition's advisory lock: a hash of the topic ID, and the
    partition number itself (so one topic's partitions never collide)."""
    digest = hashlib.blake2b(tip.topic_id.bytes, digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True), tip.partition


# -- helpers --------------------------------------------------------------------------------------


def _discard(conn: Connection) -> None:
    """Close ``conn`` without returning its session to the pool (it may hold, or be about to be
    granted, an advisory lock)."""
    with contextlib.suppress(sa.exc.SQLAlchemyError):
        conn.invalidate()
    with contextlib.suppress(sa.exc.SQLAlchemyError):
        conn.close()


def _epoch_ranges(md: RemoteLogSegmentMetadata) -> dict[int, tuple[int, int]]:
    """epoch → (first, last offset of the epoch in the segment). Each epoch ends where the next
    begins; the last ends with the segment. Start offsets must rise with the epoch and lie in
    the segment, as the leader-epoch cache's entries truncated to the segment's range do."""
    items = sorted(md.segment_leader_epochs.items())
    ranges: dict[int, tuple[int, int]] = {}
    for i, (epoch, start) in enumerate(items):
        if epoch < 0:
            raise ValueError(f"leader epoch {epoch} is negative")
        if not md.start_offset <= start <= md.end_offset:
            raise ValueError(f"leader epoch {epoch} starts at {start}, outside the segment [{md.start_offset}, {md.end_offset}]")
        end = items[i + 1][1] - 1 if i + 1 < len(items) else md.end_offset
        if end < start:
            raise ValueError(f"leader epochs {dict(items)} do not start at increasing offsets")
        ranges[epoch] = (start, end)
    return ranges


def _partition_key(table: sa.Table, tip: TopicIdPartition) -> tuple:
    return table.c.topic_id == tip.topic_id, table.c.partition == tip.partition


def _tip_str(tip: TopicIdPartition) -> str:
    return f"{tip.topic_partition} (topic id {tip.topic_id})"


def _uuid_array(ids: list[uuid.UUID]) -> sa.ColumnElement:
    """``ids`` as one ``uuid[]`` parameter (for ``= ANY(...)``): one bind however many ids."""
    return sa.cast(sa.bindparam(None, [str(i) for i in ids], type_=ARRAY(sa.Text), unique=True), ARRAY(sa.Uuid()))


def _tips_table(tips: list[TopicIdPartition]) -> sa.Subquery:
    """``tips`` as a table of (topic_id, partition) to join on: two array binds however many
    partitions (an IN list of pairs would be two binds a partition)."""
    partitions = sa.cast(sa.bindparam(None, [t.partition for t in tips], type_=ARRAY(sa.Integer), unique=True),
                         ARRAY(sa.Integer))
    # unnest of two arrays in one select list zips them (PostgreSQL 10 on).
    return sa.select(sa.func.unnest(_uuid_array([t.topic_id for t in tips]), type_=sa.Uuid()).label("topic_id"),
                     sa.func.unnest(partitions, type_=sa.Integer()).label("partition")).subquery("wanted")


def _on_tips(table: sa.Table, pairs: sa.Subquery):
    """``table``'s rows of the partitions in ``pairs`` (``_tips_table``)."""
    return sa.and_(table.c.topic_id == pairs.c.topic_id, table.c.partition == pairs.c.partition)


def _row_tip(row: sa.Row) -> TopicIdPartition:
    return TopicIdPartition(row.topic_id, TopicPartition(row.topic, row.partition))


def _partition_state(row: sa.Row) -> PartitionState:
    delete_state = None if row.delete_state is None else RemotePartitionDeleteState[row.delete_state]
    return PartitionState(row.log_start_offset, row.highest_copied_offset, delete_state, _lineage(row.leader_epochs))


def _lineage(stored: list | None) -> tuple[EpochEntry, ...]:
    return tuple(EpochEntry(int(epoch), int(start)) for epoch, start in stored or ())


def _lost_range(row: sa.Row, tip: TopicIdPartition) -> LostOffsetRange:
    return LostOffsetRange(tip, row.start_offset, row.end_offset, row.detected_at, row.how_found,
                           row.acknowledged_by, row.acknowledged_at, row.reason)


def _to_metadata(row: sa.Row, tip: TopicIdPartition) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, row.segment_id),
        start_offset=row.start_offset,
        end_offset=row.end_offset,
        max_timestamp_ms=row.max_timestamp_ms,
        broker_id=row.broker_id,
        event_timestamp_ms=row.event_timestamp_ms,
        segment_size_in_bytes=row.size_bytes,
        segment_leader_epochs={int(epoch): start for epoch, start in sorted(row.leader_epochs.items(), key=lambda kv: int(kv[0]))},
        state=S[row.state],
        custom_metadata=dict(row.custom_metadata),
    )


def _event(
    conn: Connection,
    kind: str,
    *,
    tip: TopicIdPartition | None = None,
    topic_id: uuid.UUID | None = None,
    segment_id: uuid.UUID | None = None,
    old_state: str | None = None,
    new_state: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> None:
    conn.execute(EVENTS.insert().values(
        topic_id=tip.topic_id if tip is not None else topic_id,
        partition=tip.partition if tip is not None else None,
        segment_id=segment_id,
        kind=kind,
        old_state=old_state,
        new_state=new_state,
        details=dict(details or {}),
    ))
