"""Reading a tiered partition back the way Kafka's tiered-storage integration tests count it: how
many records a consumer gets from each tier."""

from __future__ import annotations

from kts_resources.reading.reader import TieredLogReader


def records_per_tier(reader: TieredLogReader, topic: str, start: int, partition: int = 0) -> tuple[int, int]:
    """(records fetched from the remote tier, from the local log) reading from ``start`` to the high watermark."""
    part = reader.partition(topic, partition)
    remote = local = 0
    position = start
    while position < part.high_watermark:
        result = part.fetch(position, 1 << 20)
        for batch in result.batches:
            n = sum(1 for r in result.records if batch.header.base_offset <= r.offset <= batch.header.last_offset)
            remote, local = (remote + n, local) if batch.remote else (remote, local + n)
        position = result.next_offset
    return remote, local
