"""The pipeline's per-partition procedures without Dagster, as tests set up and drive a partition:
the copy (``copy_partition``, what the copy asset runs for each partition of its run) over a log
dir's partitions, and retention as ``retention_state`` does it (one plan, then carrying it out)."""

from __future__ import annotations

from kts_resources.kafka.logdir import LogDir
from kts_resources.tiering.copier import PartitionCopyResult, copy_partition
from kts_resources.tiering.expiry import ExpiryResult, expire_partition, plan_partition


def copy_each_partition(log_dir: LogDir, store, storage, **options) -> list[PartitionCopyResult]:
    """One copy pass over every partition of ``log_dir``, one partition after another, in its order."""
    return [copy_partition(partition, log_dir, store, storage, **options) for partition in log_dir.partitions()]


def plan_and_expire(located, tip, store, storage, *, clock, **options) -> ExpiryResult:
    """The partition's retention planned now (``clock``'s now) and carried out."""
    plan = plan_partition(located, tip, store, now_ms=clock.now_ms())
    return expire_partition(plan, located, store, storage, clock=clock, **options)
