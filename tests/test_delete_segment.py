"""The one delete procedure for a remote segment (Kafka's RemoteLogManager.deleteRemoteLogSegment):
DELETE_SEGMENT_STARTED → every object → DELETE_SEGMENT_FINISHED, from whatever state the segment is
in, idempotent, on the filesystem tier and on S3; and the one not-found error of store and tier."""

from __future__ import annotations

import uuid

import pytest

from kts_resources.tiering.copier import delete_remote_log_segment
from kts_resources.tiering.quotas import ManualClock
from kts_resources.remote_log import (
    IndexType,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)
from kts_resources.remote_storage.keys import LOG_SUFFIX, suffix_for_index
from tests.test_remote_storage import make_segment

S = RemoteLogSegmentState


@pytest.fixture
def clock():
    return ManualClock(1_700_000_000_000)


def _copy(store, storage, tmp_path, *, finish: bool) -> RemoteLogSegmentMetadata:
    """A segment recorded COPY_SEGMENT_STARTED with all its objects uploaded, and FINISHED if asked:
    a copy that finished, or one a crash interrupted after its uploads."""
    seg = make_segment(tmp_path / "log")
    store.ensure_topic(seg.metadata.topic_id_partition.topic, seg.metadata.topic_id_partition.topic_id)
    store.add_remote_log_segment_metadata(seg.metadata)
    custom_metadata = storage.copy_log_segment_data(seg.metadata, seg.data)
    if not finish:
        return store.segment(seg.metadata.segment_id)
    return store.update_remote_log_segment_metadata(seg.metadata.segment_id, S.COPY_SEGMENT_FINISHED, 1, custom_metadata=custom_metadata)


def _states(store, md: RemoteLogSegmentMetadata) -> list[str]:
    """The segment's state changes as the event log recorded them, in order."""
    return [e.new_state for e in store.events(md.topic_id_partition) if e.segment_id == md.segment_id.id]


def _objects(storage) -> set[str]:
    return {obj.key for obj in storage.list_objects()}


@pytest.mark.parametrize("finish", [False, True], ids=["from-COPY_SEGMENT_STARTED", "from-COPY_SEGMENT_FINISHED"])
def test_delete_goes_through_delete_started_to_delete_finished_and_removes_every_object(
    metadata_store, remote_storage, tmp_path, clock, finish
):
    md = _copy(metadata_store, remote_storage, tmp_path, finish=finish)
    assert set(remote_storage.segment_object_keys(md).values()) <= _objects(remote_storage) != set()

    deleted = delete_remote_log_segment(metadata_store, remote_storage, md, clock)

    assert deleted.state is S.DELETE_SEGMENT_FINISHED
    assert metadata_store.segment(md.segment_id).state is S.DELETE_SEGMENT_FINISHED
    copied = ["COPY_SEGMENT_STARTED"] + (["COPY_SEGMENT_FINISHED"] if finish else [])
    assert _states(metadata_store, md) == copied + ["DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"]
    assert _objects(remote_storage) == set()
    assert metadata_store.list_remote_log_segments(md.topic_id_partition, states={S.COPY_SEGMENT_FINISHED}) == []


def test_an_interrupted_delete_continues_when_objects_are_partly_gone(metadata_store, remote_storage, tmp_path, clock):
    md = _copy(metadata_store, remote_storage, tmp_path, finish=True)
    md = metadata_store.update_remote_log_segment_metadata(md.segment_id, S.DELETE_SEGMENT_STARTED, 2)
    keys = remote_storage.segment_object_keys(md)
    gone = {keys[LOG_SUFFIX], keys[suffix_for_index(IndexType.OFFSET)]}
    remote_storage.delete_objects(sorted(gone))  # the crash came mid-way through the objects
    assert _objects(remote_storage) and not gone & _objects(remote_storage)

    deleted = delete_remote_log_segment(metadata_store, remote_storage, md, clock)

    assert deleted.state is S.DELETE_SEGMENT_FINISHED
    # Continued, not restarted: DELETE_SEGMENT_STARTED is not recorded twice.
    assert _states(metadata_store, md) == ["COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED", "DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"]
    assert _objects(remote_storage) == set()


def test_a_stale_metadata_is_deleted_from_the_stores_state(metadata_store, remote_storage, tmp_path, clock):
    """The caller's copy of the metadata may predate the last state change: the store's state rules."""
    stale = _copy(metadata_store, remote_storage, tmp_path, finish=False)  # says COPY_SEGMENT_STARTED
    metadata_store.update_remote_log_segment_metadata(stale.segment_id, S.DELETE_SEGMENT_STARTED, 2)

    assert delete_remote_log_segment(metadata_store, remote_storage, stale, clock).state is S.DELETE_SEGMENT_FINISHED
    assert _objects(remote_storage) == set()


def test_deleting_a_deleted_segment_again_changes_nothing(metadata_store, remote_storage, tmp_path, clock):
    md = _copy(metadata_store, remote_storage, tmp_path, finish=True)
    first = delete_remote_log_segment(metadata_store, remote_storage, md, clock)
    events = metadata_store.events(md.topic_id_partition)

    again = delete_remote_log_segment(metadata_store, remote_storage, md, clock)

    assert again == first
    assert metadata_store.events(md.topic_id_partition) == events


def test_deleting_a_segment_the_store_does_not_know_is_not_found(metadata_store, remote_storage, tmp_path, clock):
    unknown = make_segment(tmp_path / "log").metadata
    with pytest.raises(RemoteResourceNotFoundError, match=str(unknown.segment_id.id)):
        delete_remote_log_segment(metadata_store, remote_storage, unknown, clock)


def test_store_and_tier_raise_the_same_not_found_error(metadata_store, remote_storage, tmp_path):
    """One type, whichever side lacks the resource: a RemoteStorageError (as Kafka's
    RemoteResourceNotFoundException) and a LookupError (as the store's lookups were)."""
    seg = make_segment(tmp_path / "log")
    with pytest.raises(RemoteResourceNotFoundError) as from_store:
        metadata_store.update_remote_log_segment_metadata(uuid.uuid4(), S.COPY_SEGMENT_FINISHED, 1)
    with pytest.raises(RemoteResourceNotFoundError) as from_tier:
        remote_storage.fetch_index(seg.metadata, IndexType.OFFSET)  # never uploaded
    assert type(from_store.value) is type(from_tier.value) is RemoteResourceNotFoundError
    assert isinstance(from_store.value, RemoteStorageError) and isinstance(from_tier.value, LookupError)

    from kts_resources import metadata, remote_storage as tier_package
    from kts_resources.metadata import store
    from kts_resources.remote_storage import base

    assert metadata.RemoteResourceNotFoundError is store.RemoteResourceNotFoundError is RemoteResourceNotFoundError
    assert tier_package.RemoteResourceNotFoundError is base.RemoteResourceNotFoundError is RemoteResourceNotFoundError
