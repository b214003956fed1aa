"""The partitions `kts serve` has open: one ``PartitionReader`` kept across the fetches of a
partition, so a consumer's stream of fetches does not open the partition again each time.

Opening one reads both tiers' state (the log dirs, three metadata-store transactions): measured at
~35 ms a fetch on a loaded two-core machine against ~11 ms with the reader kept, a quarter of the
throughput (README, "Over the Kafka protocol"). An open reader is a view as of when it was opened,
so it is used only while it is young (``MAX_AGE_S``) and only for an offset inside what it saw
(from its log start offset to its high watermark): a consumer at the end, waiting for new records,
gets a fresh look once the reader is ``LOOK_AGAIN_S`` old, and a log start offset moved or a
segment expired shows within a second.
A fetch that fails on an open reader is tried once more on a fresh one (its view may be what failed).

A fresh look costs little when nothing changed: the reader compares what it read (its directory's
files, its checkpoint entries, one store digest) and the same reader is kept again, a new one opened
only when something did change (``TieredLogReader.partition``'s ``previous``). Without that, a
consumer at the end of a partition, or one whose other partitions are still being read, had its
partition opened afresh on every fetch: most of the server's CPU in the 4-consumer bench.

A consumer reading on does not wait for the fresh look either: once a reader is ``RENEW_AFTER_S``
old, its next fetch has a fresh one opened in the background (``due``), which replaces it when
ready, so the fetches stay on a young reader without paying the ~35 ms of opening one.
"""

from __future__ import annotations

import threading
import time

from kts_resources.reading.reader import PartitionReader

MAX_AGE_S = 1.0
RENEW_AFTER_S = 0.5
# A consumer at the high watermark is answered from a reader this young without looking again: a
# consumer whose other partitions are still being read asks for every partition in each fetch,
# tens of times a second, and each look is a store query. New records show at most this much later.
LOOK_AGAIN_S = 0.05
# Partitions kept at most; past it the oldest go (a server with this many consumers at once
# re-opens some of them now and then, no worse than without the cache).
MAX_OPEN = 1024


class OpenPartitions:
    def __init__(self, max_age_s: float = MAX_AGE_S, max_open: int = MAX_OPEN, renew_after_s: float = RENEW_AFTER_S,
                 look_again_s: float = LOOK_AGAIN_S) -> None:
        self.max_age_s, self.max_open, self.renew_after_s = max_age_s, max_open, renew_after_s
        self.look_again_s = look_again_s
        self._open: dict[tuple[str, int], tuple[float, PartitionReader]] = {}
        self._renewing: set[tuple[str, int]] = set()
        self._lock = threading.Lock()  # fetches run in the server's thread pool

    def reader_for(self, topic: str, partition: int, offset: int) -> PartitionReader | None:
        """The open reader of the partition if it is young and ``offset`` is inside what it saw (at
        its high watermark: if it is younger still, ``look_again_s``)."""
        with self._lock:
            entry = self._open.get((topic, partition))
        if entry is None:
            return None
        opened, reader = entry
        age = time.monotonic() - opened
        if age > self.max_age_s or not reader.log_start_offset <= offset <= reader.high_watermark:
            return None
        # Never past what it saw: an offset a newer view holds would get OFFSET_OUT_OF_RANGE here.
        if offset == reader.high_watermark and age > self.look_again_s:
            return None
        return reader

    def last(self, topic: str, partition: int) -> PartitionReader | None:
        """The partition's reader kept last, however old: what a fresh look compares against
        (``TieredLogReader.partition(previous=…)``) and keeps when nothing changed."""
        with self._lock:
            entry = self._open.get((topic, partition))
        return entry[1] if entry is not None else None

    def due(self, topic: str, partition: int) -> bool:
        """True once when the partition's open reader is old enough to be renewed in the background
        (the caller opens a fresh one and ``keep``s it, or calls ``forget``)."""
        key = (topic, partition)
        with self._lock:
            entry = self._open.get(key)
            if entry is None or key in self._renewing or time.monotonic() - entry[0] < self.renew_after_s:
                return False
            self._renewing.add(key)
            return True

    def keep(self, topic: str, partition: int, reader: PartitionReader) -> None:
        with self._lock:
            self._renewing.discard((topic, partition))
            self._open[(topic, partition)] = (time.monotonic(), reader)
            if len(self._open) > self.max_open:
                for key, _entry in sorted(self._open.items(), key=lambda item: item[1][0])[:len(self._open) - self.max_open]:
                    del self._open[key]

    def forget(self, topic: str, partition: int) -> None:
        with self._lock:
            self._renewing.discard((topic, partition))
            self._open.pop((topic, partition), None)
