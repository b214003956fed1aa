"""Batched expiry (issue 33 item 2): many remote segments go through DELETE_SEGMENT_STARTED →
objects → DELETE_SEGMENT_FINISHED together, one store transaction per batch of transitions, their
objects in S3 DeleteObjects requests of at most 1,000 keys; a key the tier will not delete keeps its
segment DELETE_SEGMENT_STARTED (never FINISHED with an object left) and the next pass finishes it.

S3 is moto's HTTP server; what the tier was asked is read from the requests it received, and a tier
refusing some keys answers as S3 does (per key, in DeleteObjects' Errors), from a WSGI layer in
front of moto — nothing in kts is patched.
"""

from __future__ import annotations

import io
import math
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs
from xml.etree import ElementTree

import pytest

from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import (InvalidStateTransition, RemoteLogSegmentMetadata, RemoteLogSegmentState, RemoteResourceNotFoundError,
                                      RemoteStorageError, TopicIdPartition)
from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage
from kts_resources.tiering.copier import DELETE_BATCH_SEGMENTS, delete_remote_log_segments
from kts_resources.tiering.expiry import expire_partition, plan_partition
from kts_resources.tiering.quotas import ManualClock

from .fault_harness import S3Server
from .fixtures_s3 import _FAKE_CREDENTIALS, make_s3_storage

S = RemoteLogSegmentState
T0 = 1_700_000_000_000
NOW = T0 * 2  # every segment below is older than retention.ms


class DeleteObjectsTier:
    """A WSGI layer in front of moto: records the keys of every DeleteObjects request, and answers
    the keys in ``refused`` as S3 answers a key it may not delete (an AccessDenied error for that
    key in the response; the request's other keys are deleted)."""

    def __init__(self):
        self.requests: list[list[str]] = []
        self.refused: set[str] = set()

    def __call__(self, app: Callable) -> Callable:
        def wsgi(environ, start_response):
            if environ["REQUEST_METHOD"] != "POST" or "delete" not in parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True):
                return app(environ, start_response)
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            request = ElementTree.fromstring(body)
            objects = [o for o in request if o.tag.endswith("Object")]
            keys = [next(e.text for e in o if e.tag.endswith("Key")) for o in objects]
            self.requests.append(keys)
            refused = [k for k in keys if k in self.refused]
            for key in refused:
                body = re.sub(rb"<Object>\s*<Key>" + re.escape(key.encode()) + rb"</Key>.*?</Object>", b"", body, flags=re.S)
            if refused:
                # The body changed: its checksum headers no longer hold (moto checks none beyond these).
                for name in [n for n in environ if n.startswith("HTTP_X_AMZ_CHECKSUM") or n == "HTTP_CONTENT_MD5"]:
                    del environ[name]
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
            if not refused:
                return app(environ, start_response)
            captured = {}
            answer = b"".join(app(environ, lambda status, headers, exc_info=None: captured.update(status=status, headers=headers)))
            errors = "".join(f"<Error><Key>{k}</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error>" for k in refused)
            answer = re.sub(rb"</DeleteResult>\s*$", errors.encode() + b"</DeleteResult>", answer)
            headers = [(n, v) for n, v in captured["headers"] if n.lower() != "content-length"]
            start_response(captured["status"], [*headers, ("Content-Length", str(len(answer)))])
            return [answer]

        return wsgi


@pytest.fixture(scope="module")
def s3_server():
    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_tier(s3_server, monkeypatch):
    for name, value in _FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    tier = DeleteObjectsTier()
    s3_server.middlewares.append(tier)
    bucket = f"kts-batched-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    try:
        yield tier, make_s3_storage(s3_server.url, bucket)
    finally:
        s3_server.middlewares.remove(tier)


def finished_segments(store, count: int, *, topic: str = "expiring") -> tuple[TopicIdPartition, list[RemoteLogSegmentMetadata]]:
    """``count`` COPY_SEGMENT_FINISHED segments of 100 offsets, one a second, all older than the
    topic's retention.ms. Their rows are written in two statements, as ``bench/retention_bench.py``
    does: a thousand segments through the copy's transactions would take most of the test's time."""
    tip = TopicIdPartition(uuid.uuid4(), TopicPartition(topic, 0))
    store.ensure_topic(topic, tip.topic_id, {"retention.ms": 3_600_000})
    rows = {"id": tip.topic_id, "t0": T0, "n": count}
    with store.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO partitions (topic_id, partition, topic, highest_copied_offset) VALUES (%s, 0, %s, %s)",
                             (tip.topic_id, topic, count * 100 - 1))
        conn.exec_driver_sql(
            """INSERT INTO remote_segments (segment_id, topic_id, partition, start_offset, end_offset, max_timestamp_ms,
                                            size_bytes, leader_epochs, state, broker_id, event_timestamp_ms)
               SELECT gen_random_uuid(), %(id)s, 0, i * 100, i * 100 + 99, %(t0)s + i * 1000, 1000,
                      jsonb_build_object('0', i * 100), 'COPY_SEGMENT_FINISHED', 0, %(t0)s
               FROM generate_series(0, %(n)s - 1) AS i""", rows)
        conn.exec_driver_sql(
            """INSERT INTO remote_segment_leader_epochs (segment_id, leader_epoch, topic_id, partition, start_offset,
                                                         end_offset, referenced, copied)
               SELECT segment_id, 0, topic_id, 0, start_offset, end_offset, true, true
               FROM remote_segments WHERE topic_id = %(id)s""", rows)
    return tip, sorted(store.list_remote_log_segments(tip), key=lambda md: md.start_offset)


def put_objects(storage, md: RemoteLogSegmentMetadata) -> list[str]:
    """Every object of the segment and its manifest, a few bytes each; their keys."""
    keys = [*storage.segment_object_keys(md).values(), storage.keys.manifest_key(md.segment_id, md.start_offset)]
    for key in keys:
        storage.put_object(key, b"x")
    return keys


def expire(store, storage, tip):
    return expire_partition(plan_partition(None, tip, store, now_ms=NOW), None, store, storage, clock=ManualClock(NOW))


def states(store, segments) -> dict[uuid.UUID, S]:
    return {md.segment_id.id: store.segment(md.segment_id).state for md in segments}


def transactions_that_finished(store, tip) -> int:
    """How many transactions wrote the partition's DELETE_SEGMENT_FINISHED rows (rows a transaction
    writes carry its id as xmin)."""
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(DISTINCT xmin::text) FROM remote_segments WHERE topic_id = %s AND state = %s",
                                    (tip.topic_id, S.DELETE_SEGMENT_FINISHED.name)).scalar_one()


def test_1100_expired_segments_go_in_deleteobjects_requests_of_at_most_1000_keys_and_a_transaction_per_batch(metadata_store, s3_tier):
    tier, storage = s3_tier
    tip, segments = finished_segments(metadata_store, 1100)  # three batches, the last one short
    sample = segments[::110]
    stored = [key for md in sample for key in put_objects(storage, md)]

    result = expire(metadata_store, storage, tip)

    assert len(result.remote_deleted) == 1100
    assert set(states(metadata_store, segments).values()) == {S.DELETE_SEGMENT_FINISHED}
    assert not set(stored) & {o.key for o in storage.list_objects()}
    asked = [key for keys in tier.requests for key in keys]
    assert set(stored) <= set(asked)
    assert max(len(keys) for keys in tier.requests) <= 1000
    batches = math.ceil(1100 / DELETE_BATCH_SEGMENTS)
    keys_per_batch = len(asked) / batches
    # Per batch: the manifests' requests, then the other objects' (full requests of 1,000 keys).
    assert len(tier.requests) <= batches * (math.ceil(DELETE_BATCH_SEGMENTS / 1000) + math.ceil(keys_per_batch / 1000))
    assert transactions_that_finished(metadata_store, tip) == batches


@pytest.mark.parametrize("refused_object", ["manifest", "log"])
def test_a_key_s3_refuses_keeps_its_segment_started_while_the_rest_finish_and_the_next_pass_finishes_it(
        metadata_store, s3_tier, refused_object):
    tier, storage = s3_tier
    tip, segments = finished_segments(metadata_store, 5)
    keys = {md.segment_id.id: put_objects(storage, md) for md in segments}
    stuck = segments[2]
    refused = next(k for k in keys[stuck.segment_id.id] if k.endswith("." + refused_object))
    tier.refused.add(refused)

    with pytest.raises(RemoteStorageError, match=re.escape(refused) + ".*AccessDenied"):
        expire(metadata_store, storage, tip)

    after = states(metadata_store, segments)
    assert after.pop(stuck.segment_id.id) is S.DELETE_SEGMENT_STARTED
    assert set(after.values()) == {S.DELETE_SEGMENT_FINISHED}
    left = {o.key for o in storage.list_objects()} - {storage.keys.log_start_offset_key(tip)}
    if refused_object == "manifest":  # the manifest names its objects: while it stays, they stay
        assert left == set(keys[stuck.segment_id.id])
    else:
        assert left == {refused}

    tier.refused.clear()
    again = expire(metadata_store, storage, tip)
    assert again.remote_deleted == []  # nothing newly due: the started delete was finished first
    assert set(states(metadata_store, segments).values()) == {S.DELETE_SEGMENT_FINISHED}
    assert {o.key for o in storage.list_objects()} == {storage.keys.log_start_offset_key(tip)}


def test_a_file_the_directory_tier_cannot_remove_keeps_its_segment_started_and_the_next_pass_finishes_it(metadata_store, tmp_path):
    storage = FileSystemRemoteStorage(tmp_path / "remote", "tiered")
    tip, segments = finished_segments(metadata_store, 4)
    for md in segments:
        put_objects(storage, md)
    stuck = segments[1]
    log_key = storage.segment_object_keys(stuck)["log"]
    # A directory where the segment's log was: unlink fails on it (EISDIR), the other files go.
    path = Path(tmp_path / "remote" / log_key)
    path.unlink()
    (path / "held").mkdir(parents=True)

    with pytest.raises(RemoteStorageError, match=re.escape(log_key)):
        expire(metadata_store, storage, tip)
    after = states(metadata_store, segments)
    assert after.pop(stuck.segment_id.id) is S.DELETE_SEGMENT_STARTED
    assert set(after.values()) == {S.DELETE_SEGMENT_FINISHED}

    (path / "held").rmdir()
    path.rmdir()
    expire(metadata_store, storage, tip)
    assert set(states(metadata_store, segments).values()) == {S.DELETE_SEGMENT_FINISHED}
    assert {o.key for o in storage.list_objects()} == {storage.keys.log_start_offset_key(tip)}


def test_a_batch_transition_is_all_or_nothing(metadata_store):
    tip, segments = finished_segments(metadata_store, 3)
    started = metadata_store.update_remote_log_segments_delete_state(
        [md.segment_id for md in segments[:2]], S.DELETE_SEGMENT_STARTED, NOW)
    assert [md.state for md in started] == [S.DELETE_SEGMENT_STARTED] * 2
    # FINISHED straight from COPY_SEGMENT_FINISHED is no transition: the whole batch stays as it was.
    with pytest.raises(InvalidStateTransition, match="COPY_SEGMENT_FINISHED to DELETE_SEGMENT_FINISHED"):
        metadata_store.update_remote_log_segments_delete_state([md.segment_id for md in segments], S.DELETE_SEGMENT_FINISHED, NOW)
    assert list(states(metadata_store, segments).values()) == [S.DELETE_SEGMENT_STARTED] * 2 + [S.COPY_SEGMENT_FINISHED]
    events = [e for e in metadata_store.events(tip) if e.new_state == S.DELETE_SEGMENT_STARTED.name]
    assert sorted(e.segment_id for e in events) == sorted(md.segment_id.id for md in segments[:2])


def test_finishing_a_batch_of_deletes_is_all_or_nothing_and_writes_an_event_per_segment(metadata_store):
    tip, segments = finished_segments(metadata_store, 3)
    ids = [md.segment_id.id for md in segments]
    metadata_store.update_remote_log_segments_delete_state(ids[:2], S.DELETE_SEGMENT_STARTED, NOW)
    # The third is still COPY_SEGMENT_FINISHED: no transition to FINISHED, so the first two stay STARTED too.
    with pytest.raises(InvalidStateTransition, match="COPY_SEGMENT_FINISHED to DELETE_SEGMENT_FINISHED"):
        metadata_store.finish_segment_deletes(ids, NOW + 1)
    assert list(states(metadata_store, segments).values()) == [S.DELETE_SEGMENT_STARTED] * 2 + [S.COPY_SEGMENT_FINISHED]

    metadata_store.finish_segment_deletes(ids[:2], NOW + 1)
    metadata_store.finish_segment_deletes(ids[:1], NOW + 2)  # already FINISHED: left as it is, no second event
    assert list(states(metadata_store, segments).values()) == [S.DELETE_SEGMENT_FINISHED] * 2 + [S.COPY_SEGMENT_FINISHED]
    assert metadata_store.segment(segments[0].segment_id).event_timestamp_ms == NOW + 1
    events = [e for e in metadata_store.events(tip) if e.new_state == S.DELETE_SEGMENT_FINISHED.name]
    assert sorted(e.segment_id for e in events) == sorted(ids[:2])
    assert {(e.old_state, e.details["event_timestamp_ms"]) for e in events} == {(S.DELETE_SEGMENT_STARTED.name, NOW + 1)}
    with pytest.raises(RemoteResourceNotFoundError):
        metadata_store.finish_segment_deletes([uuid.uuid4()], NOW)


def test_a_refused_key_stops_the_batches_after_the_one_already_under_way(metadata_store, s3_tier):
    """Batches overlap (the next batch is STARTED while this one's objects go): a key the tier
    refuses in one batch lets the batch under way finish, and starts no further batch."""
    tier, storage = s3_tier
    tip, segments = finished_segments(metadata_store, 6)
    for md in segments:
        put_objects(storage, md)
    stuck = segments[0]
    tier.refused.add(storage.keys.manifest_key(stuck.segment_id, stuck.start_offset))

    with pytest.raises(RemoteStorageError, match="AccessDenied"):
        delete_remote_log_segments(metadata_store, storage, segments, ManualClock(NOW), batch=2)

    assert list(states(metadata_store, segments).values()) == [
        S.DELETE_SEGMENT_STARTED, *[S.DELETE_SEGMENT_FINISHED] * 3, *[S.COPY_SEGMENT_FINISHED] * 2]
    tier.refused.clear()
    deleted = delete_remote_log_segments(metadata_store, storage, segments, ManualClock(NOW), batch=2)
    assert [md.state for md in deleted] == [S.DELETE_SEGMENT_FINISHED] * 6
    assert list(storage.list_objects()) == []
