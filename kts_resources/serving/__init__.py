"""`kts serve`: the read side of the Kafka protocol over both tiers, as one node leading every
partition kts knows (protocol.py: frames and the API table; handlers.py: what each API answers,
through the reader; catalog.py: the topics; server.py: the asyncio server)."""
