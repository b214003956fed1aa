"""A simulated log dir with some topics' partitions copied to a directory tier: the world of the
batched-planning and sensor-budget tests (no Spark, no Dagster run)."""

from __future__ import annotations

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.copier import copy_partition


def copied_world(tmp_path, store, topics: tuple[str, ...], partitions: int, copy_topics: tuple[str, ...],
                 bytes_per_partition: int = 12 * 1024):
    """A simulated log dir; the partitions of ``copy_topics`` copied to a directory tier."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=topics, partitions=partitions, total_bytes=bytes_per_partition * len(topics) * partitions,
                                       segment_bytes=4 * 1024))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    for partition in LogDir(log_dir).partitions():
        if partition.topic in copy_topics:
            assert copy_partition(partition, LogDir(log_dir), store, storage).copied
    return log_dir
