"""The remote log metadata store against a real PostgreSQL, as Kafka's RemoteLogMetadataManager
behaves: migrations (idempotent, concurrent), topics and their re-creation, segment add/update
with every invalid state transition rejected, the epoch-aware lookup and highest offset per epoch
of RemoteLogMetadataCache / RemoteLogLeaderEpochState (cases mirror RemoteLogSegmentLifecycleTest,
RemoteLogMetadataCacheTest and RemoteLogLeaderEpochStateTest), listing and remote log size,
partition state, an event for every change written in the same transaction, the partition lock
across threads and processes, and what a lost or unreachable database looks like."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.kafka.partition import TopicPartition
from kts_resources.metadata import database, store as store_module
from kts_resources.metadata.models import metadata as models_metadata
from kts_resources.metadata.store import (
    DuplicateRemoteLogSegmentIdError,
    EventKind,
    PartitionLockLost,
    PartitionLockTimeout,
    PartitionState,
    RemoteLogMetadataStore,
    RemoteResourceNotFoundError,
    StaleTopicIdError,
    partition_lock_keys,
)
from kts_resources.metadata.topic_config import InvalidTopicConfig
from kts_resources.remote_log import (
    PARTITION_DELETE_TRANSITIONS,
    SEGMENT_TRANSITIONS,
    InvalidStateTransition,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tests.conftest import REPO_ROOT

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
SEG_SIZE = 1048576
TABLES = {"topics", "partitions", "remote_segments", "remote_segment_leader_epochs", "remote_log_events", "quota_samples",
          "lost_ranges", "group_offsets"}


@pytest.fixture
def tip(metadata_store: RemoteLogMetadataStore) -> TopicIdPartition:
    topic_id = uuid.uuid4()
    metadata_store.ensure_topic("foo", topic_id)
    return TopicIdPartition(topic_id, TopicPartition("foo", 0))


def segment(tip: TopicIdPartition, epochs: dict[int, int], start: int, end: int, *, size: int = SEG_SIZE,
            custom: dict[str, str] | None = None) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId.generate(tip), start, end, max_timestamp_ms=-1, broker_id=0,
        event_timestamp_ms=1_000, segment_size_in_bytes=size, segment_leader_epochs=epochs,
        custom_metadata=custom or {},
    )


def upsert(store: RemoteLogMetadataStore, tip: TopicIdPartition, epochs: dict[int, int], start: int, end: int,
           state: RemoteLogSegmentState = S.COPY_SEGMENT_FINISHED, **kwargs) -> RemoteLogSegmentMetadata:
    """Add a segment and move it to ``state`` along the valid path (upsertSegmentState in Kafka's tests)."""
    md = segment(tip, epochs, start, end, **kwargs)
    store.add_remote_log_segment_metadata(md)
    path = {
        S.COPY_SEGMENT_STARTED: [],
        S.COPY_SEGMENT_FINISHED: [S.COPY_SEGMENT_FINISHED],
        S.DELETE_SEGMENT_STARTED: [S.DELETE_SEGMENT_STARTED],
        S.DELETE_SEGMENT_FINISHED: [S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED],
    }[state]
    for i, step in enumerate(path, start=1):
        md = store.update_remote_log_segment_metadata(md.segment_id, step, 1_000 + i, broker_id=1)
    return md


def ids(segments) -> list[uuid.UUID]:
    return [md.segment_id.id for md in segments]


# -- migrations -----------------------------------------------------------------------------------


def test_migration_creates_the_schema_the_models_describe(pg_unmigrated_url):
    engine = database.create_engine(pg_unmigrated_url)
    try:
        assert database.current_revision(engine) is None
        database.migrate(engine)
        assert database.current_revision(engine) == database.head_revision()
        assert TABLES <= set(sa.inspect(engine).get_table_names())
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": database.VERSION_TABLE, "compare_type": True})
            assert compare_metadata(context, models_metadata) == []
    finally:
        engine.dispose()


def test_migrating_again_changes_nothing(pg_url):
    engine = database.create_engine(pg_url)
    try:
        store = RemoteLogMetadataStore(engine)
        store.ensure_topic("foo", uuid.uuid4())
        database.migrate(engine)
        database.migrate(engine)
        assert database.current_revision(engine) == database.head_revision()
        assert list(store.topics()) == ["foo"]
    finally:
        engine.dispose()


def test_opening_a_store_already_at_head_runs_no_alembic(pg_url, monkeypatch):
    # Every kts process opens the store; loading Alembic's scripts each time cost ~0.3 s of a sync.
    from alembic import command

    def refused(*_args, **_kwargs):
        raise AssertionError("Alembic ran on a database already at head")

    monkeypatch.setattr(command, "upgrade", refused)
    RemoteLogMetadataStore.from_url(pg_url).close()
    engine = database.create_engine(pg_url)
    try:
        with engine.begin() as conn:  # one revision behind, as after an upgrade of kts: Alembic runs
            conn.execute(sa.text(f"UPDATE {database.VERSION_TABLE} SET version_num = 'older'"))
        with pytest.raises(database.MetadataStoreMisconfigured, match="'older', which this kts does not know"):
            database.migrate(engine)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {database.VERSION_TABLE} SET version_num = :head"), {"head": database.head_revision()})
        engine.dispose()


def test_concurrent_migrations_queue_on_the_advisory_lock(pg_unmigrated_url):
    engines = [database.create_engine(pg_unmigrated_url) for _ in range(4)]
    barrier = threading.Barrier(len(engines))

    def migrate(engine):
        barrier.wait()
        database.migrate(engine)

    try:
        with ThreadPoolExecutor(len(engines)) as pool:
            list(pool.map(migrate, engines))
        assert database.current_revision(engines[0]) == database.head_revision()
    finally:
        for engine in engines:
            engine.dispose()


def test_quota_samples_table_is_keyed_by_quota_and_window(metadata_store):
    from kts_resources.metadata.models import quota_samples

    with metadata_store.engine.begin() as conn:
        conn.execute(quota_samples.insert().values(quota="copy", window_start_ms=1000, bytes=10))
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(quota_samples.insert().values(quota="copy", window_start_ms=1000, bytes=5))
        conn.execute(quota_samples.insert().values(quota="fetch", window_start_ms=1000, bytes=5))


# -- topics ---------------------------------------------------------------------------------------


def test_ensure_topic_records_a_topic_once(metadata_store):
    topic_id = uuid.uuid4()
    assert metadata_store.topic_id("foo") is None
    metadata_store.ensure_topic("foo", topic_id, {"retention.ms": "1000"})
    metadata_store.ensure_topic("foo", topic_id, {"retention.ms": "2000"})  # configs apply on creation only
    assert metadata_store.topic_id("foo") == topic_id
    assert metadata_store.topic_configs("foo").retention_ms == 1000
    assert [e.kind for e in metadata_store.events()] == [EventKind.TOPIC_CREATED]


def test_an_illegal_topic_name_is_refused(metadata_store):
    with pytest.raises(ValueError, match="characters outside"):
        metadata_store.ensure_topic("../x", uuid.uuid4())


def test_one_topic_id_cannot_name_two_topics(metadata_store):
    topic_id = uuid.uuid4()
    metadata_store.ensure_topic("foo", topic_id)
    with pytest.raises(ValueError, match="already belongs to topic 'foo'"):
        metadata_store.ensure_topic("bar", topic_id)


def test_a_recreated_topic_gets_its_new_id_and_the_old_incarnation_is_kept(metadata_store, tip):
    old = upsert(metadata_store, tip, {0: 0}, 0, 99)
    new_id = uuid.uuid4()
    metadata_store.ensure_topic("foo", new_id)
    assert metadata_store.topic_id("foo") == new_id
    # The old incarnation's rows stay under the old id, apart from the new one's.
    assert metadata_store.list_remote_log_segments(tip) == [old]
    new_tip = TopicIdPartition(new_id, tip.topic_partition)
    assert metadata_store.list_remote_log_segments(new_tip) == []
    assert metadata_store.partition_state(new_tip) == PartitionState()
    recreated = [e for e in metadata_store.events() if e.kind == EventKind.TOPIC_RECREATED]
    assert len(recreated) == 1 and recreated[0].details["old_topic_id"] == str(tip.topic_id)
    assert set(metadata_store.partitions()) == {tip}


def test_a_recreated_topics_old_partitions_are_marked_for_deletion_and_keep_their_segments(metadata_store, tip):
    old = upsert(metadata_store, tip, {0: 0}, 0, 99)
    metadata_store.ensure_topic("foo", uuid.uuid4())
    # The old incarnation is a deleted topic now: marked (KAFKA_FORMATS.md §7), cleaned up later.
    assert metadata_store.partition_state(tip).delete_state is P.DELETE_PARTITION_MARKED
    assert metadata_store.list_remote_log_segments(tip) == [old]
    marked = [e for e in metadata_store.events() if e.kind == EventKind.PARTITION_DELETE_STATE_CHANGED]
    assert [(e.topic_id, e.partition, e.old_state, e.new_state) for e in marked] == [
        (tip.topic_id, 0, None, "DELETE_PARTITION_MARKED")]
    # A further re-creation leaves the mark (and the deletion's progress) as it was.
    metadata_store.put_partition_delete_state(tip, P.DELETE_PARTITION_STARTED)
    metadata_store.ensure_topic("foo", uuid.uuid4())
    assert metadata_store.partition_state(tip).delete_state is P.DELETE_PARTITION_STARTED


def test_nothing_new_is_copied_for_an_old_topic_id(metadata_store, tip):
    metadata_store.ensure_topic("foo", uuid.uuid4())
    with pytest.raises(StaleTopicIdError):
        metadata_store.add_remote_log_segment_metadata(segment(tip, {0: 0}, 0, 99))
    # A stale view of the cluster cannot flip the name back to the old id.
    with pytest.raises(StaleTopicIdError):
        metadata_store.ensure_topic("foo", tip.topic_id)


def test_segments_of_an_unknown_topic_are_refused(metadata_store):
    unknown = TopicIdPartition(uuid.uuid4(), TopicPartition("nope", 0))
    with pytest.raises(RemoteResourceNotFoundError, match="ensure_topic first"):
        metadata_store.add_remote_log_segment_metadata(segment(unknown, {0: 0}, 0, 9))


def test_topic_configs_are_set_and_deleted_with_kafkas_validation(metadata_store, tip):
    config = metadata_store.set_topic_config("foo", "retention.bytes", "1000")
    assert config.retention_bytes == 1000
    metadata_store.set_topic_config("foo", "local.retention.bytes", 500)
    with pytest.raises(InvalidTopicConfig) as raised:
        metadata_store.set_topic_config("foo", "local.retention.bytes", "2000")
    assert raised.value.key == "local.retention.bytes"
    # Deleting retention.bytes (back to -1, unbounded) is fine; the refused value was never stored.
    config = metadata_store.delete_topic_config("foo", "retention.bytes")
    assert config.overrides == {"local.retention.bytes": "500"}
    assert metadata_store.topic_configs("foo").overrides == {"local.retention.bytes": "500"}
    kinds = [(e.kind, e.details["key"]) for e in metadata_store.events() if e.kind.startswith("TOPIC_CONFIG")]
    assert kinds == [
        (EventKind.TOPIC_CONFIG_SET, "retention.bytes"),
        (EventKind.TOPIC_CONFIG_SET, "local.retention.bytes"),
        (EventKind.TOPIC_CONFIG_DELETED, "retention.bytes"),
    ]


def test_setting_a_config_to_its_current_value_writes_no_event(metadata_store, tip):
    metadata_store.set_topic_config("foo", "retention.ms", "1000")
    before = len(metadata_store.events())
    metadata_store.set_topic_config("foo", "retention.ms", " 1000 ")
    assert len(metadata_store.events()) == before


def test_configs_of_an_unknown_topic_are_an_error(metadata_store):
    with pytest.raises(RemoteResourceNotFoundError):
        metadata_store.topic_configs("nope")
    with pytest.raises(RemoteResourceNotFoundError):
        metadata_store.set_topic_config("nope", "retention.ms", "1")


# -- adding and updating segments -----------------------------------------------------------------


@pytest.mark.parametrize("state", [s for s in S if s is not S.COPY_SEGMENT_STARTED])
def test_only_copy_segment_started_can_be_added(metadata_store, tip, state):
    md = dataclasses.replace(segment(tip, {0: 0}, 0, 100), state=state)
    with pytest.raises(ValueError, match="COPY_SEGMENT_STARTED"):
        metadata_store.add_remote_log_segment_metadata(md)
    assert metadata_store.list_remote_log_segments(tip, states=set(S)) == []


def test_a_segment_id_cannot_be_added_twice(metadata_store, tip):
    md = segment(tip, {0: 0}, 0, 100)
    metadata_store.add_remote_log_segment_metadata(md)
    with pytest.raises(DuplicateRemoteLogSegmentIdError):
        metadata_store.add_remote_log_segment_metadata(md)
    assert [e.kind for e in metadata_store.events(tip)].count(EventKind.SEGMENT_ADDED) == 1


def test_updating_an_unknown_segment_is_an_error(metadata_store):
    with pytest.raises(RemoteResourceNotFoundError):
        metadata_store.update_remote_log_segment_metadata(uuid.uuid4(), S.COPY_SEGMENT_FINISHED, 1)


@pytest.mark.parametrize("current", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_state_transition_is_allowed_exactly_when_kip_405_allows_it(metadata_store, tip, current, target):
    md = upsert(metadata_store, tip, {0: 0}, 0, 100, current)
    events_before = len(metadata_store.events())
    if target in SEGMENT_TRANSITIONS[current]:
        updated = metadata_store.update_remote_log_segment_metadata(md.segment_id, target, 5_000)
        assert updated.state is target and updated.event_timestamp_ms == 5_000
        assert len(metadata_store.events()) == events_before + 1
    else:
        with pytest.raises(InvalidStateTransition):
            metadata_store.update_remote_log_segment_metadata(md.segment_id, target, 5_000)
        # Rejected: the row is as it was and no event was written.
        assert metadata_store.segment(md.segment_id) == md
        assert len(metadata_store.events()) == events_before


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(targets=st.lists(st.sampled_from(list(S)), max_size=6))
def test_any_sequence_of_updates_follows_the_transition_table(metadata_store, tip, targets):
    md = segment(tip, {0: 0}, 0, 100)
    metadata_store.add_remote_log_segment_metadata(md)
    state = S.COPY_SEGMENT_STARTED
    for i, target in enumerate(targets):
        if target in SEGMENT_TRANSITIONS[state]:
            metadata_store.update_remote_log_segment_metadata(md.segment_id, target, i)
            state = target
        else:
            with pytest.raises(InvalidStateTransition):
                metadata_store.update_remote_log_segment_metadata(md.segment_id, target, i)
        assert metadata_store.segment(md.segment_id).state is state


def test_concurrent_updates_cannot_both_pass_the_transition_check(metadata_store, tip):
    md = segment(tip, {0: 0}, 0, 100)
    metadata_store.add_remote_log_segment_metadata(md)
    barrier = threading.Barrier(6)

    def finish(i):
        barrier.wait()
        try:
            metadata_store.update_remote_log_segment_metadata(md.segment_id, S.COPY_SEGMENT_FINISHED, i)
            return "ok"
        except InvalidStateTransition:
            return "rejected"

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(finish, range(6)))
    assert sorted(outcomes) == ["ok"] + ["rejected"] * 5
    finished = [e for e in metadata_store.events(tip) if e.new_state == "COPY_SEGMENT_FINISHED"]
    assert len(finished) == 1


def test_custom_metadata_is_replaced_when_given_and_kept_otherwise(metadata_store, tip):
    md = segment(tip, {0: 0}, 0, 100, custom={"log": "a/b.log"})
    metadata_store.add_remote_log_segment_metadata(md)
    keys = {"log": "a/b.log", "log.sha256": "00ff", "index": "a/b.index"}
    updated = metadata_store.update_remote_log_segment_metadata(md.segment_id, S.COPY_SEGMENT_FINISHED, 2, keys)
    assert updated.custom_metadata == keys
    updated = metadata_store.update_remote_log_segment_metadata(md.segment_id, S.DELETE_SEGMENT_STARTED, 3)
    assert updated.custom_metadata == keys
    assert metadata_store.segment(md.segment_id) == updated


def test_a_segment_reads_back_exactly_as_added(metadata_store, tip):
    md = RemoteLogSegmentMetadata(
        RemoteLogSegmentId.generate(tip), 1000, 1999, max_timestamp_ms=1_700_000_000_123, broker_id=7,
        event_timestamp_ms=1_700_000_000_999, segment_size_in_bytes=2**40, segment_leader_epochs={3: 1000, 5: 1500},
        custom_metadata={"k": "v"},
    )
    metadata_store.add_remote_log_segment_metadata(md)
    assert metadata_store.segment(md.segment_id) == md
    assert metadata_store.segment(uuid.uuid4()) is None


@pytest.mark.parametrize(
    "epochs", [{0: 5}, {0: 0, 1: 101}, {0: 0, 1: 50, 2: 50}, {1: 50, 0: 60}, {-1: 0}],
    ids=["before start", "after end", "two epochs one start", "offsets falling", "negative epoch"],
)
def test_leader_epochs_must_start_within_the_segment_at_rising_offsets(metadata_store, tip, epochs):
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tip), 10, 100, -1, 0, 1, 1, epochs)
    with pytest.raises(ValueError):
        metadata_store.add_remote_log_segment_metadata(md)


def test_copy_segment_finished_raises_the_highest_copied_offset_never_lowers_it(metadata_store, tip):
    later = segment(tip, {0: 200}, 200, 299)
    earlier = segment(tip, {0: 100}, 100, 199)
    metadata_store.add_remote_log_segment_metadata(later)
    metadata_store.add_remote_log_segment_metadata(earlier)
    assert metadata_store.partition_state(tip).highest_copied_offset == -1
    metadata_store.update_remote_log_segment_metadata(later.segment_id, S.COPY_SEGMENT_FINISHED, 2)
    assert metadata_store.partition_state(tip).highest_copied_offset == 299
    metadata_store.update_remote_log_segment_metadata(earlier.segment_id, S.COPY_SEGMENT_FINISHED, 3)
    assert metadata_store.partition_state(tip).highest_copied_offset == 299


# -- the epoch-aware lookup (RemoteLogSegmentLifecycleTest.testRemoteLogSegmentLifeCycle) -----------


def test_lookup_by_epoch_and_offset_follows_kafkas_lifecycle_test(metadata_store, tip):
    # segment 0: offsets 0-100, epochs (0,0) (1,20) (2,80); added, not yet finished.
    seg0 = segment(tip, {0: 0, 1: 20, 2: 80}, 0, 100)
    metadata_store.add_remote_log_segment_metadata(seg0)
    assert metadata_store.remote_log_segment_metadata(tip, 1, 40) is None  # still being copied
    assert all(metadata_store.highest_offset_for_epoch(tip, e) is None for e in range(3))
    seg0 = metadata_store.update_remote_log_segment_metadata(seg0.segment_id, S.COPY_SEGMENT_FINISHED, 2, broker_id=1)
    seg1 = upsert(metadata_store, tip, {2: 101}, 101, 200)
    seg2 = upsert(metadata_store, tip, {2: 201, 3: 240}, 201, 300)
    seg3 = upsert(metadata_store, tip, {3: 250, 4: 370}, 250, 400)  # overlaps seg2

    expected = {
        (1, 40): seg0, (2, 110): seg1, (3, 240): seg2, (3, 250): seg3, (4, 375): seg3,
        (1, 110): None,  # offset beyond epoch 1's end (79)
        (4, 401): None,  # offset beyond the last segment
        (5, 301): None,  # no such epoch
    }
    for (epoch, offset), want in expected.items():
        assert metadata_store.remote_log_segment_metadata(tip, epoch, offset) == want, (epoch, offset)

    metadata_store.update_remote_log_segment_metadata(seg0.segment_id, S.DELETE_SEGMENT_STARTED, 3)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 10) is None
    metadata_store.update_remote_log_segment_metadata(seg0.segment_id, S.DELETE_SEGMENT_FINISHED, 4)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 10) is None

    # Highest offsets per epoch still count the deleted segment, as Kafka's cache does.
    highest = {epoch: metadata_store.highest_offset_for_epoch(tip, epoch) for epoch in range(6)}
    assert highest == {0: 19, 1: 79, 2: 239, 3: 369, 4: 400, 5: None}


def test_a_copy_in_progress_is_listed_but_not_readable(metadata_store, tip):
    md = upsert(metadata_store, tip, {0: 0}, 0, 50, S.COPY_SEGMENT_STARTED)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 0) is None
    assert metadata_store.list_remote_log_segments(tip, 0) == [md]
    assert metadata_store.list_remote_log_segments(tip) == [md]


def test_a_finished_copy_is_readable_and_listed(metadata_store, tip):
    md = upsert(metadata_store, tip, {0: 101}, 101, 200)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 150) == md
    assert metadata_store.list_remote_log_segments(tip, 0) == [md]


def test_a_segment_being_deleted_is_listed_but_not_readable(metadata_store, tip):
    md = upsert(metadata_store, tip, {0: 201}, 201, 300, S.DELETE_SEGMENT_STARTED)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 250) is None
    assert metadata_store.list_remote_log_segments(tip, 0) == [md]


def test_a_deleted_segment_is_neither_readable_nor_listed(metadata_store, tip):
    md = upsert(metadata_store, tip, {0: 301}, 301, 400, S.DELETE_SEGMENT_FINISHED)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 350) is None
    assert metadata_store.list_remote_log_segments(tip, 0) == []
    assert metadata_store.list_remote_log_segments(tip) == []
    assert metadata_store.list_remote_log_segments(tip, states={S.DELETE_SEGMENT_FINISHED}) == [md]


def test_listing_by_epoch_orders_by_start_offset(metadata_store, tip):
    seg2 = upsert(metadata_store, tip, {0: 201, 1: 301}, 201, 400)
    seg0 = upsert(metadata_store, tip, {0: 0}, 0, 100)
    seg1 = upsert(metadata_store, tip, {0: 101}, 101, 200)
    assert metadata_store.list_remote_log_segments(tip, 0) == [seg0, seg1, seg2]
    assert metadata_store.list_remote_log_segments(tip) == [seg0, seg1, seg2]
    assert metadata_store.list_remote_log_segments(tip, 1) == [seg2]
    assert metadata_store.list_remote_log_segments(tip, 7) == []
    assert metadata_store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_STARTED}) == []


# -- one epoch's offset map (RemoteLogLeaderEpochStateTest) -----------------------------------------


def test_consecutive_segments_of_one_epoch_are_each_found(metadata_store, tip):
    seg1 = upsert(metadata_store, tip, {0: 10}, 10, 100)
    seg2 = upsert(metadata_store, tip, {0: 101}, 101, 200)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 90) == seg1
    assert metadata_store.remote_log_segment_metadata(tip, 0, 150) == seg2
    assert metadata_store.highest_offset_for_epoch(tip, 0) == 200


def test_a_reupload_covering_an_earlier_one_replaces_it(metadata_store, tip):
    seg1 = upsert(metadata_store, tip, {0: 10}, 10, 100)
    seg2 = upsert(metadata_store, tip, {0: 5}, 5, 150)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 11) == seg2
    # Replaced, not forgotten: still listed, so retention can clean it up.
    assert ids(metadata_store.list_remote_log_segments(tip, 0)) == ids([seg2, seg1])
    assert metadata_store.highest_offset_for_epoch(tip, 0) == 150
    finished = [e for e in metadata_store.events(tip) if e.segment_id == seg2.segment_id.id and e.new_state == "COPY_SEGMENT_FINISHED"]
    assert finished[0].details["unreferenced_segment_ids"] == [str(seg1.segment_id.id)]


def test_a_reupload_replaces_every_overlapped_segment(metadata_store, tip):
    upsert(metadata_store, tip, {0: 10}, 10, 100)
    upsert(metadata_store, tip, {0: 5}, 5, 150)
    upsert(metadata_store, tip, {0: 148}, 148, 155)
    seg4 = upsert(metadata_store, tip, {0: 4}, 4, 200)
    for offset in (4, 11, 149, 200):
        assert metadata_store.remote_log_segment_metadata(tip, 0, offset) == seg4
    assert len(metadata_store.list_remote_log_segments(tip, 0)) == 4
    assert metadata_store.highest_offset_for_epoch(tip, 0) == 200


def test_a_duplicate_upload_replaces_the_first(metadata_store, tip):
    upsert(metadata_store, tip, {0: 10}, 10, 100)
    seg2 = upsert(metadata_store, tip, {0: 10}, 10, 100)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 11) == seg2
    assert metadata_store.highest_offset_for_epoch(tip, 0) == 100


def test_a_longer_upload_at_the_same_start_offset_replaces_the_first(metadata_store, tip):
    upsert(metadata_store, tip, {0: 10}, 10, 100)
    seg2 = upsert(metadata_store, tip, {0: 10}, 10, 150)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 11) == seg2
    assert metadata_store.remote_log_segment_metadata(tip, 0, 111) == seg2
    assert metadata_store.highest_offset_for_epoch(tip, 0) == 150


def test_a_stale_shorter_upload_does_not_unreference_later_segments(metadata_store, tip):
    # The epoch already reaches 300; a late upload ending at 150 removes nothing after its start.
    seg1 = upsert(metadata_store, tip, {0: 0}, 0, 100)
    seg2 = upsert(metadata_store, tip, {0: 101}, 101, 300)
    seg3 = upsert(metadata_store, tip, {0: 50}, 50, 150)
    assert metadata_store.remote_log_segment_metadata(tip, 0, 10) == seg1
    assert metadata_store.remote_log_segment_metadata(tip, 0, 60) == seg3
    assert metadata_store.remote_log_segment_metadata(tip, 0, 200) == seg2
    assert metadata_store.highest_offset_for_epoch(tip, 0) == 300


def test_listing_sorts_copy_in_progress_replaced_and_current_segments_together(metadata_store, tip):
    started = upsert(metadata_store, tip, {0: 0}, 0, 4, S.COPY_SEGMENT_STARTED)
    a = upsert(metadata_store, tip, {0: 5}, 5, 10)
    replaced = upsert(metadata_store, tip, {0: 11}, 11, 100)
    b = upsert(metadata_store, tip, {0: 9}, 9, 150)
    assert ids(metadata_store.list_remote_log_segments(tip, 0)) == ids([started, a, b, replaced])
    assert metadata_store.remote_log_segment_metadata(tip, 0, 50) == b


def test_deleting_unreferences_the_segment_in_every_epoch(metadata_store, tip):
    seg1 = upsert(metadata_store, tip, {0: 10, 1: 50}, 10, 100)
    seg2 = upsert(metadata_store, tip, {1: 101}, 101, 200)
    for md in (seg1, seg2):
        metadata_store.update_remote_log_segment_metadata(md.segment_id, S.DELETE_SEGMENT_STARTED, 9)
    for epoch, offset in ((0, 20), (1, 60), (1, 150)):
        assert metadata_store.remote_log_segment_metadata(tip, epoch, offset) is None
    assert len(metadata_store.list_remote_log_segments(tip, 1)) == 2


def test_partitions_do_not_see_each_others_segments(metadata_store, tip):
    other = TopicIdPartition(tip.topic_id, TopicPartition("foo", 1))
    md = upsert(metadata_store, tip, {0: 0}, 0, 100)
    assert metadata_store.remote_log_segment_metadata(other, 0, 50) is None
    assert metadata_store.list_remote_log_segments(other) == []
    assert metadata_store.remote_log_segment_metadata(tip, 0, 50) == md


# -- remote log size ------------------------------------------------------------------------------


def test_remote_log_size_counts_every_segment_not_yet_deleted(metadata_store, tip):
    upsert(metadata_store, tip, {0: 0}, 0, 99, S.COPY_SEGMENT_STARTED, size=1)
    upsert(metadata_store, tip, {0: 100}, 100, 199, S.COPY_SEGMENT_FINISHED, size=10)
    upsert(metadata_store, tip, {0: 200, 1: 250}, 200, 299, S.COPY_SEGMENT_FINISHED, size=100)
    upsert(metadata_store, tip, {1: 300}, 300, 399, S.DELETE_SEGMENT_STARTED, size=1000)
    upsert(metadata_store, tip, {1: 400}, 400, 499, S.DELETE_SEGMENT_FINISHED, size=10000)
    assert metadata_store.remote_log_size(tip) == 1111
    assert metadata_store.remote_log_size(tip, leader_epoch=1) == 1100
    assert metadata_store.remote_log_size(tip, states={S.COPY_SEGMENT_FINISHED}) == 110
    assert metadata_store.remote_log_size(TopicIdPartition(tip.topic_id, TopicPartition("foo", 9))) == 0


# -- partitions -----------------------------------------------------------------------------------


def test_an_unrecorded_partition_has_the_initial_state(metadata_store, tip):
    assert metadata_store.partition_state(tip) == PartitionState(0, -1, None)


def test_log_start_offset_only_moves_forward(metadata_store, tip):
    assert metadata_store.update_log_start_offset(tip, 100) == 100
    assert metadata_store.update_log_start_offset(tip, 50) == 100
    assert metadata_store.update_log_start_offset(tip, 100) == 100
    assert metadata_store.update_log_start_offset(tip, 150) == 150
    assert metadata_store.partition_state(tip).log_start_offset == 150
    moves = [(e.details["old"], e.details["new"]) for e in metadata_store.events(tip) if e.kind == EventKind.LOG_START_OFFSET_CHANGED]
    assert moves == [(0, 100), (100, 150)]


@pytest.mark.parametrize("current", [None, *P])
@pytest.mark.parametrize("target", list(P))
def test_partition_delete_states_move_as_kip_405_allows(metadata_store, tip, current, target):
    path = {None: [], P.DELETE_PARTITION_MARKED: [P.DELETE_PARTITION_MARKED],
            P.DELETE_PARTITION_STARTED: [P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED],
            P.DELETE_PARTITION_FINISHED: list(P)}[current]
    for step in path:
        metadata_store.put_partition_delete_state(tip, step)
    if target in PARTITION_DELETE_TRANSITIONS[current]:
        metadata_store.put_partition_delete_state(tip, target)
        assert metadata_store.partition_state(tip).delete_state is target
    else:
        with pytest.raises(InvalidStateTransition):
            metadata_store.put_partition_delete_state(tip, target)
        assert metadata_store.partition_state(tip).delete_state is current


def test_no_segment_is_added_to_a_partition_being_deleted(metadata_store, tip):
    metadata_store.put_partition_delete_state(tip, P.DELETE_PARTITION_MARKED)
    with pytest.raises(ValueError, match="DELETE_PARTITION_MARKED"):
        metadata_store.add_remote_log_segment_metadata(segment(tip, {0: 0}, 0, 9))


def test_partitions_lists_every_recorded_partition(metadata_store, tip):
    other = TopicIdPartition(tip.topic_id, TopicPartition("foo", 3))
    metadata_store.update_log_start_offset(other, 7)
    upsert(metadata_store, tip, {0: 0}, 0, 9)
    assert metadata_store.partitions() == [tip, other]
    assert metadata_store.partition_states()[other] == PartitionState(7, -1, None)


# -- events and atomicity -------------------------------------------------------------------------


def test_every_change_appends_one_event(metadata_store, tip):
    md = upsert(metadata_store, tip, {0: 0}, 0, 99, S.DELETE_SEGMENT_FINISHED)
    metadata_store.update_log_start_offset(tip, 100)
    metadata_store.put_partition_delete_state(tip, P.DELETE_PARTITION_MARKED)
    events = metadata_store.events(tip)
    assert [(e.kind, e.old_state, e.new_state) for e in events] == [
        (EventKind.PARTITION_CREATED, None, None),
        (EventKind.SEGMENT_ADDED, None, "COPY_SEGMENT_STARTED"),
        (EventKind.SEGMENT_STATE_CHANGED, "COPY_SEGMENT_STARTED", "DELETE_SEGMENT_STARTED"),
        (EventKind.SEGMENT_STATE_CHANGED, "DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"),
        (EventKind.LOG_START_OFFSET_CHANGED, None, None),
        (EventKind.PARTITION_DELETE_STATE_CHANGED, None, "DELETE_PARTITION_MARKED"),
    ]
    assert all(e.segment_id == md.segment_id.id for e in events[1:4])
    assert [e.id for e in metadata_store.events(tip, since_id=events[3].id)] == [events[4].id, events[5].id]
    assert metadata_store.events(TopicIdPartition(uuid.uuid4(), TopicPartition("bar", 0))) == []


def test_a_failure_mid_operation_leaves_nothing_half_written(metadata_store, tip, monkeypatch):
    def broken_event(*args, **kwargs):
        raise RuntimeError("disk full")

    md = segment(tip, {0: 0}, 0, 99)
    monkeypatch.setattr(store_module, "_event", broken_event)
    with pytest.raises(RuntimeError, match="disk full"):
        metadata_store.add_remote_log_segment_metadata(md)
    monkeypatch.undo()
    # Neither the segment, its epochs, the partition row nor any event survived.
    assert metadata_store.segment(md.segment_id) is None
    assert metadata_store.partitions() == []
    with metadata_store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM remote_segment_leader_epochs")).scalar_one() == 0
    metadata_store.add_remote_log_segment_metadata(md)  # and the same call works afterwards
    assert metadata_store.segment(md.segment_id) == md


# -- the partition lock ---------------------------------------------------------------------------


def test_the_partition_lock_serialises_writers_in_threads(metadata_store, tip):
    timeline: list[str] = []
    holding = threading.Event()

    def first():
        with metadata_store.partition_lock(tip):
            timeline.append("first in")
            holding.set()
            time.sleep(0.3)
            timeline.append("first out")

    def second():
        holding.wait()
        with metadata_store.partition_lock(tip):
            timeline.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert timeline == ["first in", "first out", "second in"]


HOLD_LOCK = """
import sys, uuid
from kts_resources.kafka.partition import TopicPartition
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import TopicIdPartition
store = RemoteLogMetadataStore.from_env()
tip = TopicIdPartition(uuid.UUID(sys.argv[1]), TopicPartition("foo", 0))
with store.partition_lock(tip):
    print("locked", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def test_the_partition_lock_excludes_another_process(metadata_store, tip, pg_url):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tip.topic_id)], cwd=REPO_ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**_env(), "KTS_DATABASE_URL": pg_url},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with metadata_store.try_partition_lock(tip) as lock:
            assert lock is None
        other_partition = TopicIdPartition(tip.topic_id, TopicPartition("foo", 1))
        with metadata_store.try_partition_lock(other_partition) as lock:
            assert lock is not None  # partitions lock independently
        with pytest.raises(PartitionLockTimeout):
            with metadata_store.partition_lock(tip, timeout_s=0.2):
                pass
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        with metadata_store.partition_lock(tip, timeout_s=10) as lock:
            lock.assert_held()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_whose_connection_dies_reports_itself_lost(metadata_store, tip, pg_admin_url):
    with metadata_store.partition_lock(tip) as lock:
        lock.assert_held()
        classid, objid = (key & 0xFFFFFFFF for key in partition_lock_keys(tip))
        _terminate(pg_admin_url, f"pid IN (SELECT pid FROM pg_locks "
                                 f"WHERE locktype = 'advisory' AND objsubid = 2 AND classid = {classid} AND objid = {objid} "
                                 f"AND database = (SELECT oid FROM pg_database WHERE datname = '{_database(metadata_store)}'))")
        with pytest.raises(PartitionLockLost):
            lock.assert_held()
    # The lock is free again, and the pool handed no dead connection on.
    with metadata_store.try_partition_lock(tip) as again:
        assert again is not None
    assert metadata_store.partition_state(tip) == PartitionState()


# -- a lost or unreachable database ---------------------------------------------------------------


def _closed_port_url() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/kts"


def test_an_unreachable_database_is_one_clear_error_quickly():
    url = _closed_port_url()
    port = sa.engine.make_url(url).port
    engine = database.create_engine(url)
    attempts = []
    sa.event.listen(engine, "do_connect", lambda *_args: attempts.append(1))
    store = RemoteLogMetadataStore(engine)
    with pytest.raises(database.MetadataStoreUnavailable) as raised:
        store.partition_state(TopicIdPartition(uuid.uuid4(), TopicPartition("foo", 0)))
    # Quickly: a few attempts with a short backoff, never a retry loop without end.
    assert 1 <= len(attempts) <= database.DEFAULT_ATTEMPTS
    assert str(raised.value).startswith(f"metadata store at 127.0.0.1:{port}/kts is unreachable: ")
    assert "\n" not in str(raised.value)
    with pytest.raises(database.MetadataStoreUnavailable):
        RemoteLogMetadataStore.from_url(url)
    with pytest.raises(database.MetadataStoreUnavailable):
        with store.partition_lock(TopicIdPartition(uuid.uuid4(), TopicPartition("foo", 0))):
            pass


def _kill_own_backend_once(engine: sa.Engine, admin_url: str, when: str) -> list[int]:
    """Terminate the backend of the first statement containing ``when`` from another connection,
    just before the statement is sent: a connection dropped in the middle of an operation."""
    killed: list[int] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def kill(conn, cursor, statement, parameters, context, executemany):
        if killed or when not in statement:
            return
        pid = conn.connection.dbapi_connection.info.backend_pid
        _terminate(admin_url, f"pid = {pid}")
        killed.append(pid)

    return killed


def test_a_connection_killed_during_a_read_is_retried_transparently(metadata_store, tip, pg_admin_url):
    md = upsert(metadata_store, tip, {0: 0}, 0, 100)
    killed = _kill_own_backend_once(metadata_store.engine, pg_admin_url, "remote_segment_leader_epochs")
    assert metadata_store.remote_log_segment_metadata(tip, 0, 50) == md
    assert killed


def test_a_connection_killed_during_a_write_is_retried_and_writes_once(metadata_store, tip, pg_admin_url):
    md = segment(tip, {0: 0}, 0, 100)
    killed = _kill_own_backend_once(metadata_store.engine, pg_admin_url, "INSERT INTO remote_segments")
    metadata_store.add_remote_log_segment_metadata(md)
    assert killed
    assert metadata_store.segment(md.segment_id) == md
    assert [e.kind for e in metadata_store.events(tip)] == [EventKind.PARTITION_CREATED, EventKind.SEGMENT_ADDED]


def test_a_write_whose_commit_reply_was_lost_recognises_its_own_commit(metadata_store, tip, monkeypatch):
    """The commit reached the server, the reply did not: the retry must not report a duplicate
    or an invalid transition for what it did itself, nor write twice."""

    def lossy(engine, work, **retry):
        def once(attempt):
            with engine.begin() as conn:
                result = work(conn, attempt)
            if attempt == 1:
                raise sa.exc.OperationalError("COMMIT", {}, psycopg2.OperationalError("server closed the connection"),
                                              connection_invalidated=True)
            return result

        return database.with_retries(engine, once, backoff_s=0)

    monkeypatch.setattr(database, "in_transaction", lossy)
    md = segment(tip, {0: 0}, 0, 100)
    metadata_store.add_remote_log_segment_metadata(md)
    finished = metadata_store.update_remote_log_segment_metadata(md.segment_id, S.COPY_SEGMENT_FINISHED, 2)
    assert finished.state is S.COPY_SEGMENT_FINISHED
    metadata_store.put_partition_delete_state(tip, P.DELETE_PARTITION_MARKED)
    metadata_store.update_log_start_offset(tip, 10)
    metadata_store.set_topic_config("foo", "retention.ms", "1000")
    kinds = [e.kind for e in metadata_store.events()]
    assert kinds == [EventKind.TOPIC_CREATED, EventKind.PARTITION_CREATED, EventKind.SEGMENT_ADDED,
                     EventKind.SEGMENT_STATE_CHANGED, EventKind.PARTITION_DELETE_STATE_CHANGED,
                     EventKind.LOG_START_OFFSET_CHANGED, EventKind.TOPIC_CONFIG_SET]


def test_a_database_that_stays_away_is_reported_after_the_retries(metadata_store, tip, pg_admin_url):
    kills = []

    @sa.event.listens_for(metadata_store.engine, "before_cursor_execute")
    def kill_every_time(conn, cursor, statement, parameters, context, executemany):
        if "remote_segments" in statement:
            pid = conn.connection.dbapi_connection.info.backend_pid
            _terminate(pg_admin_url, f"pid = {pid}")
            kills.append(pid)

    with pytest.raises(database.MetadataStoreUnavailable, match="is unreachable"):
        metadata_store.list_remote_log_segments(tip)
    assert len(kills) == database.DEFAULT_ATTEMPTS


# -- helpers --------------------------------------------------------------------------------------


def _terminate(admin_url: str, where: str) -> None:
    """pg_terminate_backend for the backends matching ``where``, waiting until they are gone."""
    engine = database.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            pids = conn.execute(sa.text(f"SELECT pid FROM pg_stat_activity WHERE {where}")).scalars().all()
            for pid in pids:
                conn.execute(sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})
    finally:
        engine.dispose()
    assert pids, f"no backend matched {where}"


def _database(store: RemoteLogMetadataStore) -> str:
    return store.engine.url.database


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
