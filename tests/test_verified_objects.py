"""The routine bucket check reads a remote object's bytes once: afterwards, while the tier lists the
object at the same version (a file's inode and times, S3's ETag), it is not read again. A rewrite,
even of the same size, is a new version, read and judged; a look handed its own listing (the deep
scrub's) reads every byte; an expiring segment's record goes. On both tiers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.maintenance.remote_integrity import RoutineLooks, inspect_finished_segments
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import stored_objects
from .partition_steps import copy_each_partition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.fixture
def copied(tmp_path, metadata_store, remote_storage):
    """One partition of several segments, copied: (its tip, its finished segments)."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=4, topics=("orders",), partitions=1, total_bytes=120 * 1024, segment_bytes=24 * 1024))
    [result] = copy_each_partition(LogDir(root), metadata_store, remote_storage)
    assert result.stopped is None and len(result.copied) >= 3
    partition = LogDir(root).partitions()[0]
    tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
    return tip, metadata_store.list_remote_log_segments(tip, states={FINISHED})


def _look(store, storage, tip, finished):
    """A routine look, as the bucket check makes it: with what was verified, recording what it read whole."""
    looks = RoutineLooks(store, storage)
    looks.read(finished)
    found = looks.inspect(tip, finished)
    looks.write()
    return found


def test_a_verified_object_is_read_again_only_once_the_tier_lists_another_version_of_it(copied, metadata_store, remote_storage):
    store, storage = metadata_store, remote_storage
    tip, finished = copied

    first = _look(store, storage, tip, finished)
    assert first.intact and first.objects_read == first.objects_checked > 3 * len(finished)  # every small object, manifests too
    second = _look(store, storage, tip, finished)
    assert second.intact and second.objects_read == 0 and second.objects_checked == first.objects_checked

    # One byte of an index flipped, the size unchanged: a new version, read, and the segment is damaged.
    victim = finished[1]
    key = stored_objects(victim.custom_metadata)["index"].key
    data = bytearray(storage.fetch_object(key))
    data[3] ^= 0x40
    storage.put_object(key, bytes(data))
    third = _look(store, storage, tip, finished)
    assert third.objects_read == 1 and [md.segment_id for md, _ in third.damaged] == [victim.segment_id]
    assert "CRC-32C" in third.problems[0]
    # Still damaged at the next look: the bad bytes were never recorded as verified.
    assert [md.segment_id for md, _ in _look(store, storage, tip, finished).damaged] == [victim.segment_id]

    # A look handed its own listing (the deep scrub's) reads every small object, whatever was verified.
    listed = {o.key: o.size for o in storage.list_objects(storage.keys.partition_prefix(tip))}
    deep = inspect_finished_segments(storage, tip, finished, listed=listed,
                                     verified=store.verified_objects_of(md.segment_id.id for md in finished))
    assert deep.objects_read == first.objects_read - 1 and deep.verified_now == []  # the damaged segment's other objects are read too


def test_an_expiring_segment_forgets_what_was_verified_of_its_objects(copied, metadata_store, remote_storage):
    store, storage = metadata_store, remote_storage
    tip, finished = copied
    _look(store, storage, tip, finished)
    ids = [md.segment_id.id for md in finished]
    assert {sid for sid, _ in store.verified_objects_of(ids)} == set(ids)

    store.update_remote_log_segments_delete_state([finished[0].segment_id], RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 1)
    store.update_remote_log_segment_metadata(finished[1].segment_id, RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 1)
    assert {sid for sid, _ in store.verified_objects_of(ids)} == set(ids[2:])
    # A look that read them before its segment's delete began records nothing of it after.
    again = inspect_finished_segments(storage, tip, finished, verified={})
    store.record_verified_objects(again.verified_now)
    assert {sid for sid, _ in store.verified_objects_of(ids)} == set(ids[2:])
