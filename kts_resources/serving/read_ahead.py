"""Reading ahead for a consumer that fetches a partition's remote records in order, as
``PartitionReader.replay`` prefetches its next chunks.

After a fetch the remote tier answered, the partition's next fetch most likely asks the same max
bytes from the offset this one ended at. That read is started at once in the server's pool, on
the same kept reader (the one read path: the remote log index, one ranged read or the chunk
cache, every batch CRC-checked, the chunk cache filled), while the response goes out and the
client works on it. Measured on a loaded two-core machine: a cold 1 MiB remote fetch costs
~10–25 ms in the server, most of it writing the chunk to the chunk cache; with it read ahead the
consumer's next fetch finds it done or under way (README, "Over the Kafka protocol").

The next fetch takes it only if it asks exactly that (the same reader, offset, max bytes and
isolation); anything else drops it. Bounded: one read ahead per partition, and at most
``MAX_BYTES`` asked by all of them at once (past it none is started). A read ahead not started
yet when its fetch arrives is cancelled and the fetch reads for itself (no thread waits for a
queued task); one that failed or was throttled is dropped, and the fetch reads again, so an
error is always the fetch's own.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from kts_resources.reading.reader import FetchResult, PartitionReader

MAX_BYTES = 32 * 1024 * 1024


@dataclass
class _Ahead:
    reader: PartitionReader
    offset: int
    max_bytes: int
    isolation: str
    future: Future


class ReadAhead:
    def __init__(self, pool: Executor, max_bytes: int = MAX_BYTES) -> None:
        self.pool, self.max_bytes = pool, max_bytes
        self.taken = 0  # fetches answered by a read ahead (for tests and the bench)
        self._held = 0
        self._ahead: dict[tuple[str, int], _Ahead] = {}
        self._lock = threading.Lock()  # fetches run in the server's thread pool

    def start(self, topic: str, partition: int, reader: PartitionReader, offset: int, max_bytes: int, isolation: str) -> None:
        """Read ``reader.fetch(offset, max_bytes, isolation)`` in the background for the partition's next fetch."""
        with self._lock:
            self._drop(self._ahead.pop((topic, partition), None), cancel=True)
            if self._held + max_bytes > self.max_bytes:
                return
            try:
                future = self.pool.submit(reader.fetch, offset, max_bytes, isolation)
            except RuntimeError:  # the pool is shut down: the server is stopping
                return
            self._held += max_bytes
            self._ahead[(topic, partition)] = _Ahead(reader, offset, max_bytes, isolation, future)

    def take(self, topic: str, partition: int, reader: PartitionReader, offset: int, max_bytes: int,
             isolation: str) -> FetchResult | None:
        """The read ahead for exactly this fetch, else None (the fetch reads for itself)."""
        with self._lock:
            ahead = self._ahead.pop((topic, partition), None)
            self._drop(ahead)
        if ahead is None:
            return None
        if ahead.reader is not reader or (ahead.offset, ahead.max_bytes, ahead.isolation) != (offset, max_bytes, isolation):
            ahead.future.cancel()
            return None
        if ahead.future.cancel():
            return None  # still queued: reading here is sooner than waiting for a pool thread
        try:
            result = ahead.future.result()
        except Exception:  # noqa: BLE001 — the fetch reads again and reports its own error
            return None
        if result.throttled:
            return None
        with self._lock:
            self.taken += 1
        return result

    def _drop(self, ahead: _Ahead | None, cancel: bool = False) -> None:
        """Release what ``ahead`` holds of MAX_BYTES (the lock held); with ``cancel``, cancel it if still queued."""
        if ahead is not None:
            self._held -= ahead.max_bytes
            if cancel:
                ahead.future.cancel()
