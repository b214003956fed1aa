"""Reading ahead for a consumer that fetches a partition's remote records in order, as
``PartitionReader.replay`` prefetches its next chunks.

After a fetch the remote tier answered, the partition's next fetch most likely asks the same max
bytes from the offset this one ended at, and the one after that from where that read ends. So up
to ``DEPTH`` reads are kept ahead of the consumer, one after the other: each started in the
server's pool when the one before it is done (its end is the next one's offset), on the same kept
reader (the one read path: the remote log index, one ranged read or the chunk cache, every batch
CRC-checked, the fetch quota asked and charged), while the responses go out and the client works on
them. Measured on a loaded two-core machine: a cold 1 MiB remote fetch costs ~10–25 ms in the
server, librdkafka comes back for the next in a few; one read ahead was not enough to keep up
(README, "Over the Kafka protocol").

A fetch takes the first read ahead only if it asks exactly that (the same offset, max bytes and
isolation) and its reader reads those offsets alike (``PartitionReader.reads_alike``: the kept
reader is renewed every half second, open_partitions.py, and the reads ahead go on across it);
anything else drops them all. Bounded: ``DEPTH`` per partition, and at most
``MAX_BYTES`` asked by all of them at once (past it none is started). A read ahead not started yet
when its fetch arrives is cancelled and the fetch reads for itself (no thread waits for a queued
task); one that failed or was throttled is dropped with those after it, and the fetch reads again,
so an error is always the fetch's own. A read that reaches the end of what is fetchable, or that
the remote tier did not answer, is the last one ahead.
"""

from __future__ import annotations

import collections
import functools
import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from kts_resources.reading.reader import FetchResult, PartitionReader

MAX_BYTES = 32 * 1024 * 1024
DEPTH = 4


@dataclass
class _Ahead:
    reader: PartitionReader
    offset: int
    max_bytes: int
    isolation: str
    future: Future

    def asks(self, offset: int, max_bytes: int, isolation: str) -> bool:
        return (self.offset, self.max_bytes, self.isolation) == (offset, max_bytes, isolation)


class ReadAhead:
    def __init__(self, pool: Executor, max_bytes: int = MAX_BYTES, depth: int = DEPTH) -> None:
        self.pool, self.max_bytes, self.depth = pool, max_bytes, depth
        self.taken = 0  # fetches answered by a read ahead (for tests and the bench)
        self.started = 0  # reads ahead started
        self._held = 0
        self._ahead: dict[tuple[str, int], collections.deque[_Ahead]] = {}
        # Re-entrant: a read done before its callback is added runs the callback at once, lock held.
        self._lock = threading.RLock()

    def start(self, topic: str, partition: int, reader: PartitionReader, offset: int, max_bytes: int, isolation: str) -> None:
        """Read ``reader.fetch(offset, max_bytes, isolation)`` and what follows it in the background
        for the partition's next fetches (nothing new when that is already what is read ahead)."""
        key = (topic, partition)
        with self._lock:
            chain = self._ahead.get(key)
            if chain and chain[0].asks(offset, max_bytes, isolation):
                self._extend(key)
                return
            self._drop(key)
            self._submit(key, reader, offset, max_bytes, isolation)

    def take(self, topic: str, partition: int, reader: PartitionReader, offset: int, max_bytes: int,
             isolation: str, *, wait: bool = True) -> FetchResult | None:
        """The read ahead for exactly this fetch, else None (the fetch reads for itself). With
        ``wait=False`` (on the server's loop), None as well while it is still being read."""
        key = (topic, partition)
        with self._lock:
            chain = self._ahead.get(key)
            if not chain:
                return None
            ahead = chain[0]
            if not ahead.asks(offset, max_bytes, isolation):
                self._drop(key)
                return None
            if not wait and not ahead.future.done():
                return None
            chain.popleft()
            self._held -= ahead.max_bytes
            if not chain:
                del self._ahead[key]
        if ahead.future.cancel():
            return None  # still queued: reading here is sooner than waiting for a pool thread
        try:
            result = ahead.future.result()
        except Exception:  # noqa: BLE001 — the fetch reads again and reports its own error
            return None
        if result.throttled:
            return None
        if ahead.reader is not reader and not ahead.reader.reads_alike(reader, offset, result.next_offset):
            with self._lock:
                self._drop(key)  # read on an older view that no longer holds: read again on this one
            return None
        with self._lock:
            self.taken += 1
            self._extend(key)
        return result

    def waiting(self, topic: str, partition: int, reader: PartitionReader, offset: int, max_bytes: int,
                isolation: str) -> Future | None:
        """The read ahead this fetch would take (done or not), for the server's loop to await
        instead of a pool thread; None when there is none."""
        with self._lock:
            chain = self._ahead.get((topic, partition))
            if chain and chain[0].asks(offset, max_bytes, isolation):
                return chain[0].future
        return None

    def pending(self, topic: str, partition: int) -> list[int]:
        """The offsets read ahead for the partition, in order (for tests)."""
        with self._lock:
            return [ahead.offset for ahead in self._ahead.get((topic, partition), ())]

    # --- with the lock held ---

    def _submit(self, key: tuple[str, int], reader: PartitionReader, offset: int, max_bytes: int, isolation: str) -> None:
        if self._held + max_bytes > self.max_bytes:
            return
        try:
            future = self.pool.submit(reader.fetch, offset, max_bytes, isolation)
        except RuntimeError:  # the pool is shut down: the server is stopping
            return
        ahead = _Ahead(reader, offset, max_bytes, isolation, future)
        self._held += max_bytes
        self.started += 1
        self._ahead.setdefault(key, collections.deque()).append(ahead)
        # Not a closure over ``ahead``: a future keeps its callbacks, and future → callback → ahead
        # → future would be a cycle holding each read's chunk until the cyclic GC got round to it.
        future.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: tuple[str, int], future: Future) -> None:
        with self._lock:
            chain = self._ahead.get(key)
            if chain and chain[-1].future is future:
                self._extend(key)

    def _extend(self, key: tuple[str, int]) -> None:
        """One more read after the last of the partition's, once it is done, while fewer than DEPTH are ahead."""
        chain = self._ahead.get(key)
        if not chain or len(chain) >= self.depth:
            return
        last = chain[-1]
        if not last.future.done() or last.future.cancelled() or last.future.exception() is not None:
            return
        result = last.future.result()
        if result.throttled or not result.remote_bytes or result.next_offset >= last.reader.fetch_limit(last.isolation):
            return  # the end of what is fetchable, or the local log (read at once): nothing more ahead
        self._submit(key, last.reader, result.next_offset, last.max_bytes, last.isolation)

    def _drop(self, key: tuple[str, int]) -> None:
        """Forget the partition's reads ahead, cancelling those still queued."""
        for ahead in self._ahead.pop(key, ()):
            self._held -= ahead.max_bytes
            ahead.future.cancel()
