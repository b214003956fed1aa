"""How a step over a range of partitions ends when some of them failed.

A single-run backfill step covers many partitions, and a ``MaterializeResult`` materialises every
one of them. When some failed, the step instead records a materialisation for each partition that
worked and then fails: the run ends in failure, the UI shows the failed partitions as failed (they
were planned and not materialised) and the others as materialised, and the failure's metadata
names each failed partition with its cause (``FAILED_PARTITIONS``), which ``kts sync`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import dagster as dg

FAILED_PARTITIONS = "failed_partitions"  # Failure metadata: JSON {partition key: one-line cause}


def fail_if_no_partition_is_found(keys: list[str], missing: list[str], log_dirs: str) -> None:
    """A run none of whose partitions is in the log dirs runs in a wrong environment (KTS_LOG_DIRS
    unset or wrong, a missing mount): fail it, never report "nothing to do" as a success."""
    if keys and len(missing) == len(keys):
        raise dg.Failure(
            description=f"none of the run's {len(keys)} partitions is in the log dirs ({log_dirs or 'none set'}); is KTS_LOG_DIRS right?",
            metadata={FAILED_PARTITIONS: dg.MetadataValue.json({key: f"in none of the log dirs ({log_dirs})" for key in keys})},
            allow_retries=False,
        )


def finish_partitions(
    context: dg.AssetExecutionContext,
    metadata: Mapping[str, Mapping[str, object]],
    failed: Mapping[str, str],
    run_metadata: Mapping[str, object],
    *,
    retryable: bool = False,
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    """End the step: all good, one ``MaterializeResult`` with each partition's ``metadata``; else
    a materialisation per partition that worked, then ``dg.Failure`` naming the failed ones.
    ``retryable``: whether the step's RetryPolicy may try again (an outage, not a corrupt segment)."""
    if not failed:
        for key, partition_metadata in metadata.items():
            context.add_asset_metadata(dict(partition_metadata), partition_key=key)
        yield dg.MaterializeResult(metadata=dict(run_metadata))
        return
    for key, partition_metadata in metadata.items():
        if key not in failed:
            yield dg.AssetMaterialization(asset_key=context.asset_key, partition=key, metadata=dict(partition_metadata))
    failed = {key: _one_line(cause) for key, cause in failed.items()}
    for key, cause in sorted(failed.items()):
        context.log.error(f"{key}: {cause}")
    total = len(list(context.partition_keys))
    listed = "; ".join(f"{key}: {cause}" for key, cause in sorted(failed.items())[:20])
    raise dg.Failure(
        description=f"{len(failed)} of {total} partitions failed: {listed}",
        metadata={FAILED_PARTITIONS: dg.MetadataValue.json(dict(sorted(failed.items()))), **run_metadata},
        allow_retries=retryable,
    )


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " / ".join(lines[:3]) if lines else "failed"
