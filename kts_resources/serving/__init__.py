"""`kts serve`: the read side of the Kafka protocol over both tiers, as one node leading every
partition kts knows (protocol.py: frames and the API table; handlers.py: what each API answers,
through the reader; open_partitions.py: a partition's reader kept across its fetches; read_ahead.py: its
next remote chunk read ahead; catalog.py:
the topics; server.py: the asyncio server; stats.py: its counters and stats file), and the coordinator of
every consumer group (groups.py: the classic group protocol's state machine; group_apis.py: its
APIs, the committed offsets in the metadata store)."""
