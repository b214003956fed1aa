"""How a run over partitions ends when the environment is wrong, or a partition failed.

A step over a range of partitions (single-run backfill) materialises every partition of the range,
so the checks that follow it run for all of them. A partition whose copy failed is failed by the
blocking ``copy_completed`` check, which names the cause and fails its step, so the run ends in
failure; ``kts sync`` reads the causes from the check evaluations. A run none of whose partitions
is in the log dirs fails its step outright: nothing was done, and that is never a success.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import dagster as dg

FAILED_PARTITIONS = "failed_partitions"  # Failure metadata: JSON {partition key: one-line cause}


def fail_if_no_partition_is_found(keys: list[str], missing: list[str], log_dirs: Sequence[Path]) -> None:
    """A run none of whose partitions is in the log dirs runs in a wrong environment (KTS_LOG_DIRS
    unset or wrong, a missing mount): fail it, never report "nothing to do" as a success."""
    if keys and len(missing) == len(keys):
        where = ", ".join(map(str, log_dirs)) or "none set"
        raise dg.Failure(
            description=f"none of the run's {len(keys)} partitions is in the log dirs ({where}); is KTS_LOG_DIRS right?",
            metadata={FAILED_PARTITIONS: dg.MetadataValue.json({key: f"in none of the log dirs ({where})" for key in keys})},
            allow_retries=False,
        )


def one_line(text: str) -> str:
    """A cause as one line of a summary (errors from boto3 or psycopg2 span several)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " / ".join(lines[:3]) if lines else "failed"
