"""The on-disk chunk cache (kts_resources/reading/chunk_cache.py) and the sequential reader: least recently
used chunks go first at the size bound; processes filling and reading one cache never see half a
chunk; a cached chunk saves the remote request; a damaged cached chunk is caught by its CRCs and
read again from the tier; replay returns exactly the batches a fetch loop returns."""

from __future__ import annotations

import multiprocessing
import time

from kts_resources.reading.chunk_cache import ChunkCache
from kts_resources.reading.reader import TieredLogReader

from .test_reader import TOPIC, tiered  # noqa: F401  (the tiered partition fixture)
from .test_reader import storage  # noqa: F401


def test_least_recently_used_chunks_go_first_at_the_size_bound(tmp_path):
    cache = ChunkCache(tmp_path, max_bytes=3000)
    for i in range(3):
        cache.put("k", i * 1000, 1000, bytes([i]) * 1000)
        time.sleep(0.01)
    assert cache.get("k", 0, 1000) == bytes([0]) * 1000  # touched: now the most recent
    time.sleep(0.01)
    cache.put("k", 3000, 1000, b"x" * 1000)
    cache.evict()
    assert cache.size() <= 3000
    assert cache.get("k", 1000, 1000) is None  # the least recently used went
    assert cache.get("k", 0, 1000) is not None and cache.get("k", 3000, 1000) is not None


def _writer(directory: str, rounds: int) -> None:
    cache = ChunkCache(directory, max_bytes=200_000)
    for r in range(rounds):
        for i in range(20):
            cache.put("obj", i, 10_000, bytes([i]) * 10_000)


def test_processes_sharing_the_cache_never_see_a_partial_chunk(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), 15)) for _ in range(2)]
    for w in writers:
        w.start()
    reader = ChunkCache(tmp_path, max_bytes=200_000)
    seen = 0
    while any(w.is_alive() for w in writers):
        for i in range(20):
            data = reader.get("obj", i, 10_000)
            if data is not None:
                assert data == bytes([i]) * 10_000
                seen += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert seen > 0


def test_a_cached_chunk_saves_the_remote_request_and_a_damaged_one_is_read_again(tiered, tmp_path):  # noqa: F811
    reader, _expected, gone = tiered
    cached = TieredLogReader(log_dirs=reader.log_dirs, store=reader.store, rsm=reader.rsm, home=reader.home,
                             chunk_cache=ChunkCache(tmp_path / "chunks"))
    part = cached.partition(TOPIC, 0)
    first = part.fetch(gone[1].start_offset, 4096)
    assert first.remote_requests == 1
    again = part.fetch(gone[1].start_offset, 4096)
    assert again.remote_requests == 0 and [b.data for b in again.batches] == [b.data for b in first.batches]
    for path in (tmp_path / "chunks").rglob("*"):
        if path.is_file():
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
    healed = part.fetch(gone[1].start_offset, 4096)
    assert healed.remote_requests == 1 and [b.data for b in healed.batches] == [b.data for b in first.batches]


def test_replay_returns_exactly_the_batches_of_a_fetch_loop(tiered):  # noqa: F811
    reader, _expected, _gone = tiered
    part = reader.partition(TOPIC, 0)
    loop, position = [], part.log_start_offset
    while position < part.high_watermark:
        result = part.fetch(position, 16 * 1024)
        loop += [b.data for b in result.batches]
        position = result.next_offset
    assert [b.data for b in part.replay(part.log_start_offset, chunk_bytes=16 * 1024)] == loop


def test_replay_of_any_range_holds_the_batches_that_cover_it_once_each_in_order(tiered):  # noqa: F811
    # Chunks are read side by side along the remote log index's entries: whatever the range, the
    # batches come back once each, in offset order, from the one holding the start.
    reader, _expected, _gone = tiered
    part = reader.partition(TOPIC, 0)
    every = list(part.replay(part.log_start_offset, chunk_bytes=16 * 1024))
    assert [b.header.base_offset for b in every] == sorted({b.header.base_offset for b in every})
    last = part.high_watermark
    for start, end in [(part.log_start_offset + 1, last), (last // 3, 2 * last // 3), (last // 2, last // 2 + 1)]:
        want = [b.data for b in every if b.header.last_offset >= start and b.header.base_offset < end]
        assert [b.data for b in part.replay(start, end, chunk_bytes=8 * 1024, ahead=3)] == want, (start, end)
