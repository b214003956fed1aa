"""A broker-like writer of Kafka log dirs, byte for byte as a partition leader (and a KRaft quorum)
leaves them: what ``kts simulate`` runs and what tests use as a broker. Nothing outside
``kts_resources/kafka/`` is imported here, and nothing in the format core imports this package."""
