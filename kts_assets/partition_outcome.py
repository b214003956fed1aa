"""How a run over partitions ends when the environment is wrong, or a partition failed.

A step over a range of partitions (single-run backfill) materialises every partition of the range,
so the checks that follow it run for all of them. A partition whose copy or retention pass failed
fails its ``copy_completed`` / ``retention_completed`` check (``RUN_FAILING_CHECKS`` in
kts_assets.checks), which names the cause. Those checks do not block: a blocking check fails its
step, and Dagster then skips every later step for every partition of the run, the healthy ones
too. The run's last pipeline step fails the run instead (:func:`fail_run_for_failed_partitions`),
one line per failed partition; ``kts sync`` reads the causes from the check evaluations. A run none
of whose partitions is in the log dirs fails its step outright: nothing was done, and that is
never a success.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Sequence

import dagster as dg

from kts_assets.sizes import counted

FAILED_PARTITIONS = "failed_partitions"  # Failure metadata: JSON {partition key: one-line cause}


class PartitionsFailed(dg.Failure):
    """The end of a run some partitions of which failed: its description says each one's key and
    cause on a line of its own (the first thing the run's page shows of its failure). Its class
    name, not Dagster's, heads that message."""


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


def failed_partitions_of_run(instance: dg.DagsterInstance, run_id: str,
                             checks: Collection[dg.AssetCheckKey]) -> dict[str, str]:
    """partition key → one line: each partition whose latest evaluation in run ``run_id`` of one
    of ``checks`` failed, with the check and its description (several checks: joined by "; ")."""
    latest: dict[tuple[dg.AssetCheckKey, str], dg.AssetCheckEvaluation] = {}
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    for record in records:  # oldest first: a retried step's later evaluation replaces its earlier one
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        check = dg.AssetCheckKey(evaluation.asset_key, evaluation.check_name)
        if check in checks:
            latest[(check, evaluation.partition or "")] = evaluation
    causes: dict[str, list[str]] = {}
    for (check, partition), evaluation in sorted(latest.items(), key=lambda item: (item[0][1], item[0][0].name)):
        if not evaluation.passed:
            causes.setdefault(partition, []).append(f"{check.name} failed: {one_line(evaluation.description or '')}")
    return {partition or "(no partition)": "; ".join(lines) for partition, lines in causes.items()}


def fail_run_for_failed_partitions(context: dg.AssetExecutionContext, checks: Collection[dg.AssetCheckKey]) -> None:
    """Fail the run when a partition failed one of ``checks`` in it: one line per partition, its
    key and cause, as the failure's description (what the run's failure message shows) and as
    JSON under FAILED_PARTITIONS. Not retried: the same step would meet the same segment again; the
    next copy or retention pass is the retry."""
    causes = failed_partitions_of_run(context.instance, context.run.run_id, checks)
    if causes:
        raise PartitionsFailed(
            description="\n".join([f"{counted(len(causes), 'partition')} of the run failed:",
                                   *(f"{key}: {cause}" for key, cause in causes.items())]),
            metadata={FAILED_PARTITIONS: dg.MetadataValue.json(causes)},
            allow_retries=False,
        )


def one_line(text: str) -> str:
    """A cause as one line of a summary (errors from boto3 or psycopg2 span several)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " / ".join(lines[:3]) if lines else "failed"
