"""The chunk cache writing behind (kts_resources/reading/chunk_cache.py, as `kts serve` uses it): a
put returns before the disk write and the chunk is served from memory until it is on disk; what
waits is bounded; closing writes it all; a process killed while writing behind leaves no chunk a
reader would take half of, and its cut-short temporary files go at a later eviction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from kts_resources.reading import chunk_cache
from kts_resources.reading.chunk_cache import ChunkCache

CHUNK = 256 * 1024


def chunk(i: int) -> bytes:
    return bytes([i % 251]) * CHUNK


def test_a_chunk_written_behind_is_served_at_once_and_on_disk_after_close(tmp_path):
    cache = ChunkCache(tmp_path)
    cache.write_behind(4 * CHUNK)
    for i in range(3):
        cache.put("obj", i * CHUNK, CHUNK, chunk(i))
        assert cache.get("obj", i * CHUNK, CHUNK) == chunk(i)  # from memory or disk, whole either way
    cache.close()
    fresh = ChunkCache(tmp_path)  # another process's view: the files alone
    assert [fresh.get("obj", i * CHUNK, CHUNK) for i in range(3)] == [chunk(i) for i in range(3)]


class _StalledDisk(ChunkCache):
    """The chunk cache on a disk whose writes wait until ``gate`` is set."""

    def __init__(self, directory):
        super().__init__(directory)
        self.gate = threading.Event()

    def _write(self, key, position, length, data):
        self.gate.wait()
        super()._write(key, position, length, data)


def test_past_the_bound_a_chunk_goes_uncached_and_the_put_does_not_wait(tmp_path):
    cache = _StalledDisk(tmp_path)
    cache.write_behind(CHUNK)
    cache.put("obj", 0, CHUNK, chunk(0))  # taken by the writer, stalled on the disk
    cache.put("obj", CHUNK, CHUNK, chunk(1))  # the bound is full: not cached
    assert cache.get("obj", 0, CHUNK) == chunk(0)  # served from memory while the disk stalls
    cache.gate.set()
    cache.close()
    fresh = ChunkCache(tmp_path)
    assert fresh.get("obj", 0, CHUNK) == chunk(0) and fresh.get("obj", CHUNK, CHUNK) is None


# A process that queues 200 chunks to be written behind, says so, and waits to be killed.
WRITER = """
import sys, time
from kts_resources.reading.chunk_cache import ChunkCache
chunk = int(sys.argv[2])
cache = ChunkCache(sys.argv[1])
cache.write_behind(256 * chunk)
for i in range(200):
    cache.put("obj", i * chunk, chunk, bytes([i % 251]) * chunk)
print("queued", flush=True)
time.sleep(600)
"""


def test_a_process_killed_while_writing_behind_leaves_only_whole_chunks(tmp_path):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(CHUNK)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "queued"
        deadline = time.monotonic() + 30
        while not any(p.is_file() and not p.name.startswith(".") for p in tmp_path.rglob("*")):
            assert time.monotonic() < deadline, "nothing written"
            time.sleep(0.005)
        os.kill(writer.pid, signal.SIGKILL)  # mid-queue, most likely mid-write
    finally:
        writer.kill()
        writer.wait()
    cache = ChunkCache(tmp_path)
    found = [cache.get("obj", i * CHUNK, CHUNK) for i in range(200)]
    assert any(found)
    assert all(data is None or data == chunk(i) for i, data in enumerate(found))


def test_a_write_cut_short_is_never_served_and_its_temporary_file_goes_once_stale(tmp_path):
    cache = ChunkCache(tmp_path)
    path = cache._path("obj", 0, CHUNK)
    path.parent.mkdir(parents=True)
    cut = path.with_name(f".{path.name}.12345.678.tmp")  # what a crash between write and rename leaves
    cut.write_bytes(chunk(0)[: CHUNK // 2])
    fresh = path.with_name(f".{path.name}.12345.679.tmp")  # a write under way in another process
    fresh.write_bytes(b"x")
    assert cache.get("obj", 0, CHUNK) is None
    old = time.time() - chunk_cache.STALE_TMP_S - 1
    os.utime(cut, (old, old))
    cache.evict()
    assert not cut.exists() and fresh.exists()
    cache.put("obj", 0, CHUNK, chunk(0))
    assert cache.get("obj", 0, CHUNK) == chunk(0)
