"""`kts serve` looks at a partition again cheaply (TieredLogReader.partition's ``previous``, and
open_partitions.py): a reader whose inputs are unchanged is kept, and any change to what it read —
a local file, a checkpoint, the store's rows, the remote index cache — opens a new one. A Fetch
response's records are spliced into the library's encoding (protocol.frame_fetch_response), byte
for byte what the library itself writes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchResponse

from kts_resources.kafka.checkpoints import REPLICATION_OFFSET_CHECKPOINT, write_offset_checkpoint
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.reading.chunk_cache import ChunkCache
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading.reader import TieredLogReader
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.serving import protocol
from kts_resources.serving.open_partitions import OpenPartitions

from .test_serve import TOPIC, tiered  # noqa: F401 — the fixture


@pytest.fixture
def reader(tiered, metadata_store):  # noqa: F811
    env, _originals = tiered
    home = Path(env["KTS_HOME"])
    return TieredLogReader(log_dirs=[Path(env["KTS_LOG_DIRS"])], store=metadata_store,
                           rsm=remote_storage_from_uri(env["KTS_REMOTE_URI"]), home=home,
                           chunk_cache=ChunkCache(home / "chunk-cache"))


def looked_at_twice(reader: TieredLogReader):
    """A reader that carries its signature: the first look has none to compare (it is opened
    afresh), the second takes one before it opens."""
    first = reader.partition(TOPIC, 0)
    second = reader.partition(TOPIC, 0, previous=first)
    assert second is not first and second.signature is not None
    return second


def test_a_fresh_look_at_a_partition_where_nothing_changed_keeps_its_reader(reader):
    kept = looked_at_twice(reader)
    assert reader.partition(TOPIC, 0, previous=kept) is kept
    assert reader.partition(TOPIC, 0, previous=kept) is kept
    # Another partition's reader is never handed back for this one.
    other = reader.partition(TOPIC, 1)
    assert reader.partition(TOPIC, 0, previous=other) is not other


def test_a_changed_local_file_opens_a_new_reader(reader):
    kept = looked_at_twice(reader)
    active = kept.segments[-1].log
    stat = active.stat()
    os.utime(active, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # as an append leaves it
    fresh = reader.partition(TOPIC, 0, previous=kept)
    assert fresh is not kept and fresh.signature != kept.signature
    assert reader.partition(TOPIC, 0, previous=fresh) is fresh  # and kept from then on


def test_a_moved_high_watermark_shows_in_the_next_look(reader):
    kept = looked_at_twice(reader)
    log_dir = LogDir(reader.log_dirs[0])
    marks = dict(log_dir.high_watermarks().offsets)
    tp = TopicPartition(TOPIC, 0)
    marks[tp] = kept.high_watermark - 1
    write_offset_checkpoint(log_dir.path / REPLICATION_OFFSET_CHECKPOINT, marks)
    fresh = reader.partition(TOPIC, 0, previous=kept)
    assert fresh is not kept and fresh.high_watermark == kept.high_watermark - 1


def test_a_change_in_the_store_opens_a_new_reader(reader, metadata_store):
    kept = looked_at_twice(reader)
    metadata_store.update_log_start_offset(kept.tip, kept.log_start_offset + 1)  # as DeleteRecords records it
    fresh = reader.partition(TOPIC, 0, previous=kept)
    assert fresh is not kept and fresh.log_start_offset == kept.log_start_offset + 1


def test_a_change_in_the_remote_index_cache_opens_a_new_reader(reader):
    kept = looked_at_twice(reader)
    cache = index_cache.cache_directory(reader.home, kept.tip)
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "rebuilt-meanwhile").write_bytes(b"x")
    assert reader.partition(TOPIC, 0, previous=kept) is not kept


def test_a_reader_at_its_high_watermark_is_kept_only_while_very_young():
    class Reader:
        log_start_offset, high_watermark = 0, 10

    open_partitions = OpenPartitions(max_age_s=600, look_again_s=0.05)
    open_partitions.keep(TOPIC, 0, Reader())
    assert open_partitions.reader_for(TOPIC, 0, 10) is not None  # at the end, just looked at
    assert open_partitions.reader_for(TOPIC, 0, 11) is None  # past what it saw: never (a newer view may hold it)
    time.sleep(0.06)
    assert open_partitions.reader_for(TOPIC, 0, 10) is None  # at the end: a fresh look
    assert open_partitions.reader_for(TOPIC, 0, 9) is not None  # inside what it saw: kept until max_age_s
    assert open_partitions.last(TOPIC, 0) is not None


@pytest.mark.parametrize("version", range(4, 13))
def test_a_fetch_response_with_spliced_records_is_byte_for_byte_the_librarys_encoding(version):
    R = FetchResponse
    PD = R.FetchableTopicResponse.PartitionData

    def partition(i: int, records):
        return PD(partition_index=i, error_code=0, high_watermark=5, last_stable_offset=5, log_start_offset=0,
                  aborted_transactions=[PD.AbortedTransaction(producer_id=7, first_offset=3)] if i == 3 else None,
                  preferred_read_replica=-1, records=records)

    big = memoryview(os.urandom(300_000))[5:200_005]  # a view into a chunk, as a remote fetch gives
    parts = [partition(i, records) for i, records in enumerate(
        [os.urandom(protocol.SPLICE_MIN_BYTES), b"", None, os.urandom(100), big, os.urandom(2_000_000)])]
    response = R(version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=[
        R.FetchableTopicResponse(topic="orders", partitions=parts[:4]),
        R.FetchableTopicResponse(topic="page.views", partitions=parts[4:])])
    pieces = protocol.frame_fetch_response(response, 42)
    assert any(piece is big for piece in pieces)  # written as given, not copied
    plain = bytes(protocol.frame_response(response, 42))  # the response is as it was before
    assert b"".join(bytes(piece) for piece in pieces) == plain
    assert FetchResponse.decode(plain[4:], version=version, header=True).responses[1].partitions[0].records == bytes(big)
