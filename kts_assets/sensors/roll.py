"""The segment roll sensor: copy runs for the partitions that gained eligible segments.

A segment is eligible for the remote tier once it is not the active segment and every offset in
it is below min(high watermark, recovery point) — committed and flushed (``kts_resources.tiers``,
whose rule the copier applies too).
Per tick the sensor reads each log dir's two checkpoints once, lists each known partition's
segment base offsets from file names alone (one ``os.scandir`` per partition dir, no file is
opened), and compares each partition's newest eligible base offset with the cursor. Partitions
that changed are batched into a few ranged runs of ``copy_job`` (see ``kts_assets.batching``).

The cursor records what was requested, not what was copied: a run that fails is not retried by
the sensor; the reconcile schedule (``kts_assets.schedules``) sweeps every partition periodically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import dagster as dg

from kts_assets.batching import MAX_PARTITIONS_PER_RUN, KeyRangeBatch, batch_key_ranges, range_run_request
from kts_assets.jobs import COPY_JOB_NAME
from kts_assets.partitions import topic_partitions
from kts_assets.sensors.cursor import decode_cursor, encode_cursor
from kts_resources.kafka.checkpoints import CheckpointError
from kts_resources.kafka.logdir import LOG_SUFFIX, LogDir, parse_offset_file_name
from kts_resources.resources import KafkaLogDirsResource
from kts_resources.tiers import newest_eligible_base_offset

# Runs started per tick, at most; the rest wait for the next tick (their cursor entries are not
# advanced), so a burst of rolls never launches more than this many Spark applications at once.
MAX_RUNS_PER_TICK = 10


# --- the newest eligible segment from file names and checkpoints (no Dagster) ---------------------


def segment_base_offsets(partition_dir: str | os.PathLike) -> list[int]:
    """Base offsets of the partition's ``.log`` segments, ascending, from file names only.

    ``.log.deleted`` / ``.log.cleaned`` / ``.log.swap`` files end otherwise and are never counted.
    """
    bases = []
    with os.scandir(partition_dir) as entries:
        for entry in entries:
            name = entry.name
            if not name.endswith(LOG_SUFFIX):
                continue
            try:
                offset, suffix = parse_offset_file_name(name)
            except ValueError:
                continue
            if suffix == LOG_SUFFIX and entry.is_file():
                bases.append(offset)
    bases.sort()
    return bases


@dataclass
class RollSurvey:
    """What one pass over the log dirs found for the known partitions."""

    eligible: dict[str, int] = field(default_factory=dict)  # key → newest eligible base offset
    checked: int = 0  # known partitions whose directory was listed
    not_found: list[str] = field(default_factory=list)  # known, but in no log dir
    without_checkpoints: int = 0  # listed, but missing from the HW or recovery-point checkpoint
    unreadable_log_dirs: list[str] = field(default_factory=list)  # checkpoint unreadable: skipped this tick


def survey_log_dirs(log_dirs: Iterable[Path], known_keys: Iterable[str]) -> RollSurvey:
    """Newest eligible base offset of every known partition, reading each checkpoint once per log dir.

    A partition in two log dirs is taken from the first (as the discovery sensor does).
    """
    pending = set(known_keys)
    survey = RollSurvey()
    for path in log_dirs:
        if not pending:
            break
        try:
            with os.scandir(path) as entries:
                here = [e.name for e in entries if e.name in pending and e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not here:
            continue
        log_dir = LogDir(path)
        try:
            high_watermarks = {tp.dir_name: off for tp, off in log_dir.high_watermarks().offsets.items()}
            recovery_points = {tp.dir_name: off for tp, off in log_dir.recovery_points().offsets.items()}
        except CheckpointError as e:
            # A checkpoint Kafka writes atomically should never be malformed; do not guess offsets.
            survey.unreadable_log_dirs.append(f"{path}: {e}")
            pending.difference_update(here)
            continue
        for key in here:
            pending.discard(key)
            try:
                bases = segment_base_offsets(os.path.join(path, key))
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed since the log dir was listed
            survey.checked += 1
            hw, rp = high_watermarks.get(key), recovery_points.get(key)
            if hw is None or rp is None:
                survey.without_checkpoints += 1
                continue
            base = newest_eligible_base_offset(bases, hw, rp)
            if base is not None:
                survey.eligible[key] = base
    survey.not_found = sorted(pending)
    return survey


# --- the sensor -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RollPlan:
    """What a tick asks for: the batches to run now, the cursor after them, what waits."""

    batches: list[KeyRangeBatch]
    cursor: dict[str, int]
    changed: int  # partitions with new eligible segments
    deferred: int  # of those, left for the next tick by MAX_RUNS_PER_TICK


def plan_roll_runs(
    known_keys: Sequence[str],
    eligible: Mapping[str, int],
    previous: Mapping[str, int],
    *,
    max_partitions_per_run: int = MAX_PARTITIONS_PER_RUN,
    max_runs: int = MAX_RUNS_PER_TICK,
) -> RollPlan:
    """Batch the partitions whose newest eligible base offset differs from the cursor's.

    Any difference counts, not only growth: a partition recreated or truncated starts lower, and
    copying is idempotent. Cursor entries of partitions no longer known are dropped.
    """
    changed = [k for k in known_keys if k in eligible and eligible[k] != previous.get(k)]
    batches = batch_key_ranges(known_keys, changed, max_partitions_per_run=max_partitions_per_run)
    now, later = batches[:max_runs], batches[max_runs:]
    known = set(known_keys)
    cursor = {k: v for k, v in previous.items() if k in known}
    for batch in now:
        for key in batch.keys:
            cursor[key] = eligible[key]
    return RollPlan(now, cursor, len(changed), sum(len(b.keys) for b in later))


def advance_roll_cursor(instance: dg.DagsterInstance, requested: Mapping[str, int]) -> int:
    """Record in the roll sensor's stored cursor(s) that ``requested`` (partition key → newest
    eligible base offset) was copied by someone else (`kts sync`), so its next tick does not ask
    for the same work again. Returns how many stored sensor states were updated (none before the
    daemon has ticked the sensor once: its first tick then finds the work done, cheaply)."""
    from dagster._core.scheduler.instigation import InstigatorType, SensorInstigatorData

    updated = 0
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        data = state.instigator_data
        if state.instigator_name != segment_roll_sensor.name or not isinstance(data, SensorInstigatorData):
            continue
        try:
            cursor = decode_cursor(data.cursor)
        except ValueError:
            continue  # the sensor starts over from an unreadable cursor by itself
        merged = {**cursor, **requested}
        if merged != cursor:
            instance.update_instigator_state(state.with_data(data._replace(cursor=encode_cursor(merged))))
            updated += 1
    return updated


@dg.sensor(
    job_name=COPY_JOB_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests copy runs, a few partition ranges at a time, for partitions that rolled eligible segments.",
)
def segment_roll_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource) -> dg.SensorResult:
    """Copy runs for the known partitions whose newest eligible segment is not yet requested."""
    known = list(context.instance.get_dynamic_partitions(topic_partitions.name))
    try:
        previous, cursor_readable = decode_cursor(context.cursor), True
    except ValueError as e:
        context.log.warning(f"{e}; starting from an empty cursor (every partition with eligible segments is requested)")
        previous, cursor_readable = {}, False
    survey = survey_log_dirs(kafka_log_dirs.paths(), known)
    for problem in survey.unreadable_log_dirs:
        context.log.error(f"skipped a log dir this tick, checkpoint unreadable: {problem}")
    if survey.not_found:
        context.log.debug(f"{len(survey.not_found)} known partitions in no log dir: {', '.join(survey.not_found[:20])}")

    plan = plan_roll_runs(known, survey.eligible, previous,
                          max_partitions_per_run=MAX_PARTITIONS_PER_RUN, max_runs=MAX_RUNS_PER_TICK)
    checked = (f"checked {survey.checked} of {len(known)} known partitions"
               f" ({len(survey.eligible)} with eligible segments, {survey.without_checkpoints} not yet checkpointed)")
    # Unchanged, the cursor is handed back as it came: compressing 10,000 entries costs ~0.1 s.
    cursor = context.cursor if cursor_readable and plan.cursor == previous else encode_cursor(plan.cursor)
    if not plan.batches:
        return dg.SensorResult(skip_reason=f"no new eligible segments; {checked}", cursor=cursor)

    requested = sum(len(b.keys) for b in plan.batches)
    context.log.info(f"{checked}; {plan.changed} gained eligible segments → {len(plan.batches)} runs"
                     f" over {requested} partitions" + (f", {plan.deferred} deferred to the next tick" if plan.deferred else ""))
    return dg.SensorResult(
        run_requests=[range_run_request(b, tags={"kts/trigger": "segment_roll"}) for b in plan.batches],
        cursor=cursor,
    )
