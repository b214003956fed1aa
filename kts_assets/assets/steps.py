"""How the pipeline's three steps run (``local_and_remote_segments``, ``retention_state``,
``remote_log_index``), in one place: each is a multi_asset over topic-partitions that

- covers a whole partition range in one run (single-run backfills: one Spark session, not one per partition);
- runs any subset of its assets and checks alone (``can_subset``: the UI's "execute check", a job that
  selects one asset of the copy step);
- takes a slot of the ``spark`` pool (dagster.yaml), so a busy tick never runs two Spark steps at once
  on a host; beside a cluster the pool is the broker's (``spark_broker_<id>``, kts_assets.broker_scope),
  so no broker's run waits for another broker's slot;
- retries a failure twice (5 s, then 10 s; ``KTS_STEP_RETRY_DELAY_S`` sets the first wait): a store
  or bucket that was briefly away. A check that cannot run fails without a retry
  (``kts_assets.checks.checks_that_must_run``);
- runs its partitions with one skeleton (``for_each_partition``): each partition's work, its
  report as the partition's metadata, a failure that is that partition's alone;
- ends with ``end_step``: the run's last step fails the run for the partitions that failed in it, so
  that a failed partition never costs the others the steps after it (kts_assets.partition_outcome).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TypeVar

import dagster as dg

from kts_assets import broker_scope
from kts_assets.checks import RUN_FAILING_CHECKS
from kts_assets.dagster_internals import add_partition_metadata
from kts_assets.partition_outcome import fail_run_for_failed_partitions
from kts_assets.partitions import topic_partitions
from kts_assets.sizes import size_first
from kts_resources import settings

PIPELINE_STEP = dict(
    partitions_def=topic_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    can_subset=True,
    pool=broker_scope.current().pool,
    retry_policy=dg.RetryPolicy(max_retries=2, delay=settings.step_retry_delay_s(), backoff=dg.Backoff.EXPONENTIAL),
)

# The steps in the order a run runs them: each depends on those before it when both are in a run
# (remote_segments → retention_state → remote_log_index), so the last one in a run sees every
# partition's outcome of it.
STEP_ORDER = ("local_and_remote_segments", "retention_state", "remote_log_index")

T = TypeVar("T")  # a partition's work
R = TypeVar("R")  # what doing it gave


class PartitionFailed(Exception):
    """One partition's step failed, and only that partition: ``line`` goes to the run's log after
    the partition key, ``error`` to the partition's metadata under the step's error key, beside
    ``metadata`` (what the step still knows of the partition)."""

    def __init__(self, line: str, error: str, metadata: Mapping[str, object] | None = None):
        super().__init__(line)
        self.line, self.error, self.metadata = line, error, dict(metadata or {})


@dataclass(frozen=True)
class PartitionStep:
    """How a step names a partition's failure: the metadata keys it reports it under, and what it
    calls itself when every partition failed."""

    name: str  # "the copy pass": "… failed for every partition of the run"
    failed_key: str  # 1 on a failed partition
    error_key: str  # its cause
    asset_key: dg.AssetKey | None = None  # None: the step's only asset
    # An exception of the work that is not a PartitionFailed: the partition's failure (this says how
    # it reads), or None: the step's (a bug, or the store gone, fails the run and is retried).
    unexpected: Callable[[Exception], PartitionFailed] | None = None


def for_each_partition(
    context: dg.AssetExecutionContext,
    step: PartitionStep,
    work: Mapping[str, T],
    do: Callable[[str, T], R],
    report: Callable[[str, T, R], Mapping[str, object]] | None = None,
    *,
    report_together: Callable[[Mapping[str, tuple[T, R]]], Iterable[tuple[str, Mapping[str, object]]]] | None = None,
    threads: int = 0,
) -> list[str]:
    """The skeleton of a step over the run's partitions: ``do`` each partition's work, report what
    it did as the partition's metadata, and fail a partition alone when its work raised
    ``PartitionFailed`` (logged as an error, recorded under the step's keys). ``dg.Failure`` when
    every partition failed: nothing worked (the store or the bucket is down), so the RetryPolicy
    tries again. Returns the failed partitions' keys.

    Reported by one of: ``report``, each partition's metadata as its work is done; or
    ``report_together``, handed every partition whose work was done (key → work, result) once all
    are, giving each one's metadata: for numbers read for many partitions at once.

    ``threads``: 0, each partition in turn in the step's thread; n, n partitions side by side in
    worker threads (each procedure takes its own partition lock), reported in the step's thread as
    they finish."""
    if (report is None) == (report_together is None):
        raise TypeError("for_each_partition reports with one of report and report_together")
    failed: list[str] = []
    succeeded: dict[str, tuple[T, R]] = {}

    def done(key: str, item: T, outcome: Callable[[], R]) -> None:
        try:
            result = outcome()
        except PartitionFailed as e:
            failure = e
        except Exception as e:  # noqa: BLE001 - the step says whether it is the partition's
            if step.unexpected is None:
                raise
            failure = step.unexpected(e)
        else:
            if report is None:
                succeeded[key] = (item, result)
            else:
                add_partition_metadata(context, size_first(dict(report(key, item, result))),
                                       asset_key=step.asset_key, partition_key=key)
            return
        failed.append(key)
        context.log.error(f"{key}: {failure.line}")
        add_partition_metadata(context, {**failure.metadata, step.failed_key: 1, step.error_key: failure.error},
                               asset_key=step.asset_key, partition_key=key)

    if threads <= 0:
        for key, item in work.items():
            done(key, item, lambda: do(key, item))
    else:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kts-partition") as pool:
            futures = {pool.submit(do, key, item): (key, item) for key, item in work.items()}
            for future in as_completed(futures):
                key, item = futures[future]
                done(key, item, future.result)
    if report_together is not None and succeeded:
        for key, metadata in report_together(succeeded):
            add_partition_metadata(context, size_first(dict(metadata)), asset_key=step.asset_key, partition_key=key)
    if work and len(failed) == len(work):
        raise dg.Failure(f"{step.name} failed for every partition of the run: {', '.join(failed[:20])}")
    return failed


def end_step(context: dg.AssetExecutionContext) -> None:
    """The end of a step: the run's last step fails the run, one line per partition that failed a
    RUN_FAILING_CHECKS check in it (``PartitionsFailed``, not retried). An earlier step leaves it
    to the last one, which runs for every partition: a failed partition's run still takes the
    healthy ones through retention and the remote log index."""
    if _last_step_of_run(context):
        fail_run_for_failed_partitions(context, RUN_FAILING_CHECKS)


def _last_step_of_run(context: dg.AssetExecutionContext) -> bool:
    """Whether no step after this one in STEP_ORDER is in the run (a job's subset, a re-execution's
    chosen steps)."""
    in_run = {node.name for node in context.job_def.nodes}
    chosen = context.run.step_keys_to_execute
    if chosen is not None:
        in_run &= set(chosen)
    this = context.op_execution_context.node_handle.name
    return not in_run.intersection(STEP_ORDER[STEP_ORDER.index(this) + 1:])
