"""kts resources: everything that touches the outside world, and the formats it speaks.

The Kafka format code under ``kts_resources.kafka`` imports nothing from Dagster, so it is usable
and testable on its own.
"""
