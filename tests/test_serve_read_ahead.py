"""`kts serve` reads ahead for a consumer that fetches a partition's remote records in order
(kts_resources/serving/read_ahead.py): the next fetch is answered from the read started after the
last one, with the same bytes the reader gives, and a fetch that asks anything else is not."""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kts_resources.reading.chunk_cache import ChunkCache
from kts_resources.reading.reader import READ_UNCOMMITTED, TieredLogReader
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.serving.handlers import ReadSide
from kts_resources.serving.open_partitions import OpenPartitions
from kts_resources.serving.read_ahead import ReadAhead

from .test_serve import TOPIC, tiered  # noqa: F401 — the fixture

MAX_BYTES = 16 * 1024  # a few batches a fetch: many fetches over the remote part


@pytest.fixture
def side(tiered, metadata_store):  # noqa: F811
    env, _originals = tiered
    home = Path(env["KTS_HOME"])
    reader = TieredLogReader(log_dirs=[Path(env["KTS_LOG_DIRS"])], store=metadata_store,
                             rsm=remote_storage_from_uri(env["KTS_REMOTE_URI"]), home=home,
                             chunk_cache=ChunkCache(home / "chunk-cache"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        side = ReadSide(reader, pool, advertised=("127.0.0.1", 9092), draining=asyncio.Event())
        # Kept for the whole test: a reader re-opened on the way would (rightly) drop its read ahead.
        side.open_partitions = OpenPartitions(max_age_s=600)
        yield side, reader


def expected_records(reader: TieredLogReader, offset: int) -> tuple[bytes, int]:
    result = reader.partition(TOPIC, 0).fetch(offset, MAX_BYTES, READ_UNCOMMITTED)
    return b"".join(bytes(b.buffer[b.position:b.position + b.size]) for b in result.batches), result.next_offset


def test_a_consumer_fetching_the_remote_tier_in_order_is_answered_from_the_read_ahead_with_the_same_bytes(side):
    side, reader = side
    partition = reader.partition(TOPIC, 0)
    offset, remote_fetches = partition.log_start_offset, 0
    while offset < partition.local_log_start_offset:
        out = side._fetch_partition(TOPIC, 0, offset, MAX_BYTES, READ_UNCOMMITTED)
        records, next_offset = expected_records(reader, offset)
        assert out.error_code == 0 and out.remote_bytes > 0
        assert bytes(out.records) == records, f"fetch at {offset}"
        offset, remote_fetches = next_offset, remote_fetches + 1
    assert remote_fetches > 3
    # Every remote fetch after the first was read ahead (the one after the last too, but it is not asked).
    assert side.read_ahead.taken == remote_fetches - 1


def test_a_fetch_at_another_offset_than_the_read_ahead_gets_its_own_records_and_drops_it(side):
    side, reader = side
    start = reader.partition(TOPIC, 0).log_start_offset
    first = side._fetch_partition(TOPIC, 0, start, MAX_BYTES, READ_UNCOMMITTED)
    _records, ahead_offset = expected_records(reader, start)
    assert first.remote_bytes > 0
    # The consumer seeks back to its start instead of fetching on from ahead_offset.
    again = side._fetch_partition(TOPIC, 0, start, MAX_BYTES, READ_UNCOMMITTED)
    assert bytes(again.records) == bytes(first.records)
    assert side.read_ahead.taken == 0
    # A fetch that asks other max bytes at the read ahead's offset is not answered from it either.
    other = side._fetch_partition(TOPIC, 0, ahead_offset, MAX_BYTES // 2, READ_UNCOMMITTED)
    assert side.read_ahead.taken == 0 and other.records


def fetch_in_order(side, start: int, end: int) -> int:
    """Fetch [start, end) in order as a consumer does, through the server's own path (awaiting a
    read ahead under way rather than reading for itself), checking every answer's bytes; the number
    of fetches."""
    reader = side.reader

    async def run() -> int:
        offset, fetches = start, 0
        while offset < end:
            out = await side._partition_fetch(TOPIC, 0, offset, MAX_BYTES, READ_UNCOMMITTED)
            records, next_offset = expected_records(reader, offset)
            assert out.error_code == 0 and bytes(out.records) == records, f"fetch at {offset}"
            offset, fetches = next_offset, fetches + 1
        return fetches

    return asyncio.run(run())


def test_up_to_depth_reads_stay_ahead_of_a_consumer_reading_in_order(side):
    side, reader = side
    side.read_ahead = ReadAhead(side.pool, depth=3)
    partition = reader.partition(TOPIC, 0)
    start = partition.log_start_offset
    side._fetch_partition(TOPIC, 0, start, MAX_BYTES, READ_UNCOMMITTED)
    following, offset = [], expected_records(reader, start)[1]
    for _ in range(3):
        following.append(offset)
        offset = expected_records(reader, offset)[1]
    deadline = time.monotonic() + 30
    while side.read_ahead.pending(TOPIC, 0) != following:
        assert time.monotonic() < deadline, side.read_ahead.pending(TOPIC, 0)
        time.sleep(0.01)
    assert side.read_ahead.started == 3  # and no fourth: the depth holds
    fetches = fetch_in_order(side, following[0], partition.local_log_start_offset)
    assert side.read_ahead.taken == fetches


def test_reads_ahead_go_on_across_the_kept_readers_renewal(side):
    side, reader = side
    side.open_partitions = OpenPartitions(max_age_s=600, renew_after_s=0)  # renewed at every fetch
    partition = reader.partition(TOPIC, 0)
    renewals = []
    renew = side._renew
    side._renew = lambda *args: renewals.append(args) or renew(*args)
    fetches = fetch_in_order(side, partition.log_start_offset, partition.local_log_start_offset)
    assert fetches > 3 and renewals
    assert side.read_ahead.taken == fetches - 1  # all but the first, though most were read on an older reader


def test_two_views_of_a_partition_read_alike_only_where_both_hold_the_same_remote_segments(side):
    _side, reader = side
    old, fresh = reader.partition(TOPIC, 0), reader.partition(TOPIC, 0)
    start, remote_end = old.log_start_offset, old.highest_remote_offset + 1
    assert old.reads_alike(fresh, start, remote_end) and fresh.reads_alike(old, start + 1, start + 2)
    assert not old.reads_alike(fresh, start, remote_end + 1)  # into offsets only the local log holds
    assert not old.reads_alike(fresh, old.high_watermark - 1, old.high_watermark + 1)  # past what is held
    assert not old.reads_alike(fresh, start - 1, start + 1)  # below the log start offset
