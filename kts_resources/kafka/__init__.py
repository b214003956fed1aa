"""Kafka's on-disk formats: record batches, indexes, checkpoints, producer snapshots, log dirs."""
