"""CRC-32C (Castagnoli), the checksum of Kafka's record batches and of everything kts writes to
the tier: ``crc32c(data, value=0)``, going on from ``value`` as the crc32c library's function does.

kts's own C routine (``_batch_tally``, SSE4.2 in three lanes) when it is built, else the crc32c
library. Both are as fast on large buffers; the point is the import: the library reads every
installed package's metadata to learn its own version (~50 ms), a third of a small command's
start (`kts segments`, bench/inventory_bench.py)."""

try:
    from kts_resources.kafka._batch_tally import crc32c
except ImportError:  # installed without a C compiler: the library's (its own C, as fast)
    from crc32c import crc32c

__all__ = ["crc32c"]
