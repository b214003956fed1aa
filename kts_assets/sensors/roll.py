"""The segment roll sensor: copy runs for the partitions that gained eligible segments.

A segment is eligible for the remote tier once it is not the active segment and every offset in
it is below min(high watermark, recovery point) — committed and flushed (``kts_resources.tiering.tiers``,
whose rule the copier applies too).
Per tick the sensor reads each log dir's two checkpoints once, lists each known partition's
segment base offsets from file names alone (one ``os.scandir`` per partition dir, no file is
opened), and compares each partition's newest eligible base offset with the cursor. Partitions
that changed are batched into a few ranged runs of ``copy_job`` (see ``kts_assets.batching``).

The cursor records what was requested, not what was copied. A copy that failed is retried here,
with backoff (:func:`retry_delay_ms`: 1, 2, 4 … minutes, at most 32): per tick the sensor reads
the copy runs that finished since its last tick (one query of the run storage, however many
partitions there are) and the ones still in flight; a partition of a failed or cancelled run whose
newest eligible segment is still not copied gets a retry time, and is requested again once it has
come and no run covers it. A later run that succeeds for it, or its segments found copied, clears
its retries. The skip message names the partitions waiting and when. The reconcile schedule
(``kts_assets.schedules``) still sweeps every partition hourly. ``kts sync`` moves the cursor for
what it copied (:func:`advance_roll_cursor`).

Copy lag is observed here too, before any copy: from the same file-name survey and every
partition's highest copied offset (one query of the metadata store per tick), each partition whose
lag changed since the last tick gets an ``AssetObservation`` of ``remote_segments``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import dagster as dg

from kts_assets import broker_scope
from kts_assets.assets import remote_segments
from kts_assets.batching import (
    MAX_PARTITIONS_PER_RUN,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    KeyRangeBatch,
    batch_key_ranges,
    range_run_request,
)
from kts_assets.dagster_internals import update_sensor_cursor
from kts_assets.jobs import COPY_JOB_NAME
from kts_assets.partitions import topic_partitions
from kts_assets.sensors.cursor import REQUESTED, decode_cursor_maps, encode_cursor, is_state_cursor, sensor_state, state_cursor
from kts_assets.sizes import counted, human_bytes
from kts_resources.kafka.checkpoints import PARTITION_METADATA, CheckpointError, read_partition_metadata
from kts_resources.kafka.logdir import LOG_SUFFIX, LogDir, offset_file_name, parse_offset_file_name
from kts_resources.kafka.partition import TopicPartition, parse_topic_partition
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.tiers import copy_lag_base_offsets, newest_eligible_base_offset

if TYPE_CHECKING:
    from kts_resources.metadata.store import PartitionState
    from kts_resources.remote_log import TopicIdPartition

# Runs started per tick, at most; the rest wait for the next tick (their cursor entries are not
# advanced), so a burst of rolls never launches more than this many Spark applications at once.
MAX_RUNS_PER_TICK = 10
# Copy-lag observations per tick, at most (each is an event the daemon writes); the rest are
# reported on later ticks, their cursor entries left as they were.
MAX_LAG_OBSERVATIONS_PER_TICK = 1000
# The cursor's maps of the copy lag last reported per partition.
LAG_SEGMENTS, LAG_BYTES = "copy_lag_segments", "copy_lag_bytes"
# The cursor's maps of the retries: when a failed partition's next copy is due (epoch ms), and
# how many retries it has had; and how far the finished copy runs were read (their update time, µs).
RETRY_AT, RETRIES, RUNS_READ = "retry_at", "retries", "runs_read"
RUNS_READ_UNTIL = "updated_us"
FIRST_RETRY_MS = 60_000
MAX_RETRY_MS = 32 * 60_000
# Finished copy runs read per tick at most (the rest on the next tick); on a first tick, runs
# finished within this long before it are read.
MAX_FINISHED_RUNS_PER_TICK = 500
FIRST_TICK_LOOKBACK_MS = 60 * 60_000
# How many partitions a message names before "and N more".
NAMED_IN_MESSAGE = 10
SENSOR_NAME = "segment_roll_sensor"


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
    base_offsets: dict[str, list[int]] = field(default_factory=dict)  # key → its segments' base offsets
    directories: dict[str, str] = field(default_factory=dict)  # key → its partition directory
    checked: int = 0  # known partitions whose directory was listed
    not_found: list[str] = field(default_factory=list)  # known, but in no log dir
    without_checkpoints: int = 0  # listed, but missing from the HW or recovery-point checkpoint
    unreadable_log_dirs: list[str] = field(default_factory=list)  # checkpoint unreadable: skipped this tick


def _may_be_dir(entry: os.DirEntry) -> bool:
    """A directory, or a link that cannot be followed (a loop: DirEntry.is_dir raises on it)."""
    try:
        return entry.is_dir()
    except OSError:
        return True


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
                here = [e.name for e in entries if e.name in pending and _may_be_dir(e)]
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
            directory = os.path.join(path, key)
            try:
                bases = segment_base_offsets(directory)
            except OSError:
                # Removed since the log dir was listed, or unreadable (a symbolic link loop): nothing
                # to request; the partition's own copy names what is wrong.
                continue
            survey.checked += 1
            survey.base_offsets[key], survey.directories[key] = bases, directory
            hw, rp = high_watermarks.get(key), recovery_points.get(key)
            if hw is None or rp is None:
                survey.without_checkpoints += 1
                continue
            base = newest_eligible_base_offset(bases, hw, rp)
            if base is not None:
                survey.eligible[key] = base
    survey.not_found = sorted(pending)
    return survey


# --- copy lag from the survey (no Dagster) ---------------------------------------------------------


def highest_copied_offsets(survey: RollSurvey, states: Mapping["TopicIdPartition", "PartitionState"]) -> dict[str, int]:
    """Each surveyed partition's highest copied offset (−1: nothing copied) from the store's
    partition states. A name the store knows under several topic ids (a topic deleted and
    re-created) is resolved by the partition's own ``partition.metadata``; unreadable, left out."""
    by_name: dict[TopicPartition, list[tuple[object, int]]] = {}
    for tip, state in states.items():
        by_name.setdefault(tip.topic_partition, []).append((tip.topic_id, state.highest_copied_offset))
    offsets: dict[str, int] = {}
    for key, directory in survey.directories.items():
        candidates = by_name.get(parse_topic_partition(key), [])
        if len(candidates) <= 1:
            offsets[key] = candidates[0][1] if candidates else -1
            continue
        try:
            topic_id = read_partition_metadata(os.path.join(directory, PARTITION_METADATA)).topic_id
        except (OSError, ValueError):
            continue
        offsets[key] = next((offset for tid, offset in candidates if tid == topic_id), -1)
    return offsets


def copy_lags(survey: RollSurvey, highest_copied: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """``key → (copy lag segments, copy lag bytes)``: the closed segments not yet copied
    (``tiers.copy_lag_base_offsets``), their sizes from one ``stat`` each."""
    lags = {}
    for key, copied in highest_copied.items():
        directory = survey.directories[key]
        lagging = copy_lag_base_offsets(survey.base_offsets[key], copied)
        size = 0
        for base in lagging:
            try:
                size += os.stat(os.path.join(directory, offset_file_name(base, LOG_SUFFIX))).st_size
            except FileNotFoundError:
                pass  # deleted by the broker's retention since the listing
        lags[key] = (len(lagging), size)
    return lags


def lag_observation(key: str, segments: int, size: int) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=remote_segments.key, partition=key, metadata={
        LAG_SEGMENTS: segments, LAG_BYTES: size, "copy_lag": f"{counted(segments, 'segment')}, {human_bytes(size)}"})


# --- retries of failed copies (no Dagster but the run records they read) -------------------------


def retry_delay_ms(retries: int) -> int:
    """How long a partition whose copy failed waits before its next one, after ``retries``
    retries already: 1, 2, 4 … minutes, at most MAX_RETRY_MS (the hourly reconcile is later)."""
    return min(FIRST_RETRY_MS << min(retries, 20), MAX_RETRY_MS)


def run_partition_keys(tags: Mapping[str, str], positions: Mapping[str, int], known: Sequence[str]) -> list[str]:
    """The known partition keys a run covers: its key range, or its one partition."""
    start, end = tags.get(PARTITION_RANGE_START_TAG), tags.get(PARTITION_RANGE_END_TAG)
    if start is not None and end is not None:
        if start not in positions or end not in positions:
            return []
        return list(known[positions[start]:positions[end] + 1])
    key = tags.get("dagster/partition")
    return [key] if key in positions else []


@dataclass(frozen=True)
class FinishedCopy:
    """A copy run that finished: its partitions, whether it succeeded, when it ended (epoch ms)."""

    keys: list[str]
    succeeded: bool
    ended_ms: int


@dataclass
class CopyRuns:
    """What the run storage says of copy runs this tick."""

    in_flight: set[str] = field(default_factory=set)  # partitions a queued or running copy run covers
    finished: list[FinishedCopy] = field(default_factory=list)  # oldest first
    read_until_us: int = 0  # the newest finished run's update time read


def read_copy_runs(instance: dg.DagsterInstance, known: Sequence[str], read_until_us: int | None, now_ms: int) -> CopyRuns:
    """The copy runs in flight and those finished since ``read_until_us`` (None: a first tick,
    which looks FIRST_TICK_LOOKBACK_MS back). Two queries of the run storage; the work is in the
    number of runs, not partitions."""
    positions = {key: i for i, key in enumerate(known)}
    runs = CopyRuns(read_until_us=read_until_us if read_until_us is not None else (now_ms - FIRST_TICK_LOOKBACK_MS) * 1000)
    in_progress = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                   dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    for record in instance.get_run_records(filters=dg.RunsFilter(job_name=COPY_JOB_NAME, statuses=in_progress)):
        runs.in_flight.update(run_partition_keys(record.dagster_run.tags, positions, known))
    finished = instance.get_run_records(
        filters=dg.RunsFilter(job_name=COPY_JOB_NAME,
                              statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
                              updated_after=datetime.fromtimestamp(runs.read_until_us / 1e6, tz=timezone.utc)),
        order_by="update_timestamp", ascending=True, limit=MAX_FINISHED_RUNS_PER_TICK)
    for record in finished:
        updated = record.update_timestamp
        if updated.tzinfo is None:  # the run storage keeps UTC without a zone
            updated = updated.replace(tzinfo=timezone.utc)
        runs.read_until_us = max(runs.read_until_us, int(updated.timestamp() * 1e6))
        ended = record.end_time if record.end_time is not None else updated.timestamp()
        runs.finished.append(FinishedCopy(run_partition_keys(record.dagster_run.tags, positions, known),
                                          record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, int(ended * 1000)))
    return runs


def uncopied(key: str, eligible: Mapping[str, int], highest_copied: Mapping[str, int] | None) -> bool:
    """Whether the partition's newest eligible segment is not yet in the remote tier (unknown
    offsets — the store unreachable — count as not copied: a retry is idempotent)."""
    if key not in eligible:
        return False
    if highest_copied is None or key not in highest_copied:
        return True
    return highest_copied[key] < eligible[key]


def update_retries(runs: CopyRuns, eligible: Mapping[str, int], highest_copied: Mapping[str, int] | None,
                   retry_at: dict[str, int], retries: dict[str, int]) -> None:
    """Schedule a retry for each partition of a failed or cancelled run whose newest eligible
    segment is still not copied (after the retries it had: :func:`retry_delay_ms`); a run that
    succeeded, or the segments found copied, clear a partition's retries."""
    for run in runs.finished:
        for key in run.keys:
            if run.succeeded or not uncopied(key, eligible, highest_copied):
                retry_at.pop(key, None)
                retries.pop(key, None)
            elif key not in runs.in_flight and key not in retry_at:
                retry_at[key] = run.ended_ms + retry_delay_ms(retries.get(key, 0))
    for key in list(retry_at):
        if key in runs.in_flight:
            continue
        if not uncopied(key, eligible, highest_copied):
            retry_at.pop(key, None)
            retries.pop(key, None)


def describe_waiting(retry_at: Mapping[str, int], retries: Mapping[str, int], in_flight: set[str]) -> str:
    """``2 partitions wait for a retry of a failed copy: orders-0 at 17:42:10 UTC (retry 2), …``."""
    waiting = sorted(retry_at.items(), key=lambda kv: (kv[1], kv[0]))
    if not waiting:
        return ""
    named = [f"{key} at {datetime.fromtimestamp(at / 1000, tz=timezone.utc):%H:%M:%S} UTC (retry {retries.get(key, 0) + 1})"
             + (", its run still in flight" if key in in_flight else "") for key, at in waiting[:NAMED_IN_MESSAGE]]
    more = f" and {len(waiting) - NAMED_IN_MESSAGE} more" if len(waiting) > NAMED_IN_MESSAGE else ""
    return f"{counted(len(waiting), 'partition')} {'waits' if len(waiting) == 1 else 'wait'} for a retry of a failed copy: {', '.join(named)}{more}"


def now_ms() -> int:
    return int(time.time() * 1000)


# --- the sensor -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RollPlan:
    """What a tick asks for: the batches to run now, the cursor after them, what waits."""

    batches: list[KeyRangeBatch]
    cursor: dict[str, int]
    changed: int  # partitions with new eligible segments
    deferred: int  # of those and the retries, left for the next tick by MAX_RUNS_PER_TICK
    retried: tuple[str, ...] = ()  # the retries requested now


def plan_roll_runs(
    known_keys: Sequence[str],
    eligible: Mapping[str, int],
    previous: Mapping[str, int],
    *,
    retry: Iterable[str] = (),
    max_partitions_per_run: int = MAX_PARTITIONS_PER_RUN,
    max_runs: int = MAX_RUNS_PER_TICK,
) -> RollPlan:
    """Batch the partitions whose newest eligible base offset differs from the cursor's, and
    those whose failed copy is due for a retry (``retry``).

    Any difference counts, not only growth: a partition recreated or truncated starts lower, and
    copying is idempotent. Cursor entries of partitions no longer known are dropped.
    """
    changed = [k for k in known_keys if k in eligible and eligible[k] != previous.get(k)]
    retry_set = set(retry)
    batches = batch_key_ranges(known_keys, [*changed, *retry_set], max_partitions_per_run=max_partitions_per_run)
    now, later = batches[:max_runs], batches[max_runs:]
    known = set(known_keys)
    cursor = {k: v for k, v in previous.items() if k in known}
    retried = []
    for batch in now:
        for key in batch.keys:
            if key in eligible:
                cursor[key] = eligible[key]
            if key in retry_set:
                retried.append(key)
    return RollPlan(now, cursor, len(changed), sum(len(b.keys) for b in later), tuple(retried))


@dg.sensor(
    name=SENSOR_NAME,
    job_name=COPY_JOB_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests copy runs, a few partition ranges at a time, for partitions that rolled eligible "
        "segments, retries partitions whose copy failed (after 1, 2, 4 … minutes, at most 32), and records each "
        "partition's copy lag (as observations of remote_segments) whenever it changes."
    ),
)
def segment_roll_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource,
                        metadata_store: MetadataStoreResource) -> dg.SensorResult:
    """Copy runs for the known partitions whose newest eligible segment is not yet requested, or
    whose failed copy is due for a retry."""
    known = list(context.instance.get_dynamic_partitions(topic_partitions.name))
    try:
        maps, cursor_readable = decode_cursor_maps(sensor_state(context.instance, SENSOR_NAME, context.cursor)), True
    except ValueError as e:
        context.log.warning(f"{e}; starting from an empty cursor (every partition with eligible segments is requested)")
        maps, cursor_readable = {}, False
    previous = maps.get(REQUESTED, {})
    survey = survey_log_dirs(kafka_log_dirs.paths(), known)
    for problem in survey.unreadable_log_dirs:
        context.log.error(f"skipped a log dir this tick, checkpoint unreadable: {problem}")
    if survey.not_found:
        context.log.debug(f"{len(survey.not_found)} known partitions in no log dir: {', '.join(survey.not_found[:20])}")

    observations, lag_maps, highest_copied = _observe_copy_lag(context, metadata_store, survey, known, maps)
    known_set = set(known)
    retry_at = {k: v for k, v in maps.get(RETRY_AT, {}).items() if k in known_set}
    retries = {k: v for k, v in maps.get(RETRIES, {}).items() if k in known_set}
    now = now_ms()
    runs = read_copy_runs(context.instance, known, maps.get(RUNS_READ, {}).get(RUNS_READ_UNTIL), now)
    update_retries(runs, survey.eligible, highest_copied, retry_at, retries)
    due = [k for k, at in retry_at.items() if at <= now and k not in runs.in_flight]
    plan = plan_roll_runs(known, survey.eligible, previous, retry=due,
                          max_partitions_per_run=MAX_PARTITIONS_PER_RUN, max_runs=MAX_RUNS_PER_TICK)
    for key in plan.retried:  # requested: its retry time is spent, its count kept for the backoff
        retry_at.pop(key, None)
        retries[key] = retries.get(key, 0) + 1
    state_maps = {**lag_maps, RETRY_AT: retry_at, RETRIES: retries, RUNS_READ: {RUNS_READ_UNTIL: runs.read_until_us}}
    checked = (f"checked {survey.checked} of {counted(len(known), 'known partition')}"
               f" ({len(survey.eligible)} with eligible segments, {survey.without_checkpoints} not yet checkpointed)")
    unchanged = (cursor_readable and is_state_cursor(context.cursor) and plan.cursor == previous
                 and all(state_maps[name] == maps.get(name, {}) for name in state_maps))
    # Unchanged, the cursor is handed back as it came: compressing 10,000 entries costs ~0.1 s.
    cursor = context.cursor if unchanged else state_cursor(
        context.instance, SENSOR_NAME, encode_cursor(plan.cursor, state_maps), previous=context.cursor,
        partitions=len(plan.cursor), retries=len(retry_at))
    observed = f"; copy lag changed for {counted(len(observations), 'partition')}" if observations else ""
    waiting = describe_waiting(retry_at, retries, runs.in_flight)
    waiting = f"; {waiting}" if waiting else ""
    if not plan.batches:
        return dg.SensorResult(skip_reason=f"no new eligible segments and no failed copy due for a retry; {checked}{observed}{waiting}",
                               cursor=cursor, asset_events=observations)

    requested = sum(len(b.keys) for b in plan.batches)
    retried = (f"; retrying the failed copy of {', '.join(plan.retried[:NAMED_IN_MESSAGE])}"
               + (f" and {len(plan.retried) - NAMED_IN_MESSAGE} more" if len(plan.retried) > NAMED_IN_MESSAGE else "")
               if plan.retried else "")
    context.log.info(f"{checked}; {plan.changed} gained eligible segments{retried} → {counted(len(plan.batches), 'run')}"
                     f" over {counted(requested, 'partition')}" + (f", {plan.deferred} deferred to the next tick" if plan.deferred else "")
                     + observed + waiting)
    return dg.SensorResult(
        run_requests=[range_run_request(b, tags={"kts/trigger": "segment_roll"}) for b in plan.batches],
        cursor=cursor,
        asset_events=observations,
    )


def _observe_copy_lag(context: dg.SensorEvaluationContext, metadata_store: MetadataStoreResource, survey: RollSurvey,
                      known: Sequence[str], maps: Mapping[str, Mapping[str, int]]
                      ) -> tuple[list[dg.AssetObservation], dict[str, dict[str, int]], dict[str, int] | None]:
    """Observations for the partitions whose copy lag differs from the cursor's, the cursor's
    lag maps after them, and each surveyed partition's highest copied offset. With the store
    unreachable the lag is not observed this tick (a warning, and None for the offsets), and copy
    runs are still requested."""
    known_set = set(known)
    segments_seen = {k: v for k, v in maps.get(LAG_SEGMENTS, {}).items() if k in known_set}
    bytes_seen = {k: v for k, v in maps.get(LAG_BYTES, {}).items() if k in known_set}
    if not survey.directories:
        return [], {LAG_SEGMENTS: segments_seen, LAG_BYTES: bytes_seen}, {}
    from sqlalchemy.exc import SQLAlchemyError

    from kts_resources.metadata.database import MetadataStoreMisconfigured, MetadataStoreUnavailable
    from kts_resources.metadata.embedded import EmbeddedPostgresError

    try:
        states = metadata_store.store().partition_states()
    except (MetadataStoreUnavailable, MetadataStoreMisconfigured, EmbeddedPostgresError, SQLAlchemyError) as e:
        context.log.warning(f"copy lag not observed this tick: the metadata store is unavailable: {type(e).__name__}: {e}")
        return [], {LAG_SEGMENTS: segments_seen, LAG_BYTES: bytes_seen}, None
    observations = []
    highest_copied = highest_copied_offsets(survey, states)
    for key, (segments, size) in sorted(copy_lags(survey, highest_copied).items()):
        if (segments_seen.get(key), bytes_seen.get(key)) == (segments, size):
            continue
        if len(observations) == MAX_LAG_OBSERVATIONS_PER_TICK:
            break
        observations.append(lag_observation(key, segments, size))
        segments_seen[key], bytes_seen[key] = segments, size
    return observations, {LAG_SEGMENTS: segments_seen, LAG_BYTES: bytes_seen}, highest_copied


# --- `kts sync` moves the cursor for what it copied -------------------------------------------------

# The code location's name, as workspace.yaml, `kts ui` and `kts code-server` name it (the
# broker's beside a cluster, kts_assets.broker_scope): a sensor's stored state is found by
# (location, repository, sensor name).
CODE_LOCATION_NAME = broker_scope.current().location_name


def advance_roll_cursor(instance: dg.DagsterInstance, copied: Mapping[str, int]) -> int:
    """Record ``copied`` (partition key → newest eligible base offset a pass copied through) in the
    roll sensor's stored cursor, so that its next tick does not request those partitions again
    (failed partitions, left out of ``copied``, it still requests). Returns how many stored states
    were written.

    The stored state is the one the daemon keeps; with none yet (the daemon never ran on this
    instance), one is added as the daemon would add it, cursor included
    (``dagster_internals.update_sensor_cursor``). The copy lag the sensor last reported is left as
    it was: the next tick reports what the pass changed."""
    if not copied:
        return 0
    return update_sensor_cursor(instance, segment_roll_sensor, CODE_LOCATION_NAME,
                                lambda cursor: _advanced(instance, cursor, copied))


def _advanced(instance: dg.DagsterInstance, cursor: str | None, copied: Mapping[str, int]) -> str | None:
    try:
        maps = decode_cursor_maps(sensor_state(instance, SENSOR_NAME, cursor))
    except ValueError:
        maps = {}  # unreadable: the sensor would start over anyway
    before = maps.pop(REQUESTED, {})
    requested = {**before, **copied}
    if requested == before and cursor:
        return cursor
    return state_cursor(instance, SENSOR_NAME, encode_cursor(requested, maps), previous=cursor,
                        partitions=len(requested), retries=len(maps.get(RETRY_AT, {})))
