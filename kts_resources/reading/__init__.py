"""The read path: Kafka's fetch and ListOffsets over both tiers (``reader.TieredLogReader``), the
seeds' remote log index (format, machine-local cache, versioned copy in the tier, wholeness check)
and the chunk cache of remote byte ranges."""
