"""The segment roll sensor: copy runs for the partitions that gained eligible segments.

A segment is eligible for the remote tier once it is not the active segment and every offset in
it is below min(high watermark, recovery point) — committed and flushed (``kts_resources.tiering.tiers``,
whose rule the copier applies too).
Per tick the sensor reads each log dir's two checkpoints once, lists each known partition's
segment base offsets from file names alone (one ``os.scandir`` per partition dir, no file is
opened), and compares each partition's newest eligible base offset with the cursor. Partitions
that changed are batched into a few ranged runs of ``copy_job`` (see ``kts_assets.batching``).

The cursor records what was requested, not what was copied: a run that fails is not retried by
the sensor; the reconcile schedule (``kts_assets.schedules``) sweeps every partition periodically.
``kts sync`` moves it for what it copied (:func:`advance_roll_cursor`).

Copy lag is observed here too, before any copy: from the same file-name survey and every
partition's highest copied offset (one query of the metadata store per tick), each partition whose
lag changed since the last tick gets an ``AssetObservation`` of ``remote_segments``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import dagster as dg

from kts_assets import broker_scope
from kts_assets.assets import remote_segments
from kts_assets.batching import MAX_PARTITIONS_PER_RUN, KeyRangeBatch, batch_key_ranges, range_run_request
from kts_assets.dagster_internals import update_sensor_cursor
from kts_assets.jobs import COPY_JOB_NAME
from kts_assets.partitions import topic_partitions
from kts_assets.sensors.cursor import REQUESTED, decode_cursor_maps, encode_cursor
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


@dg.sensor(
    job_name=COPY_JOB_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests copy runs, a few partition ranges at a time, for partitions that rolled eligible "
        "segments, and records each partition's copy lag (as observations of remote_segments) whenever it changes."
    ),
)
def segment_roll_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource,
                        metadata_store: MetadataStoreResource) -> dg.SensorResult:
    """Copy runs for the known partitions whose newest eligible segment is not yet requested."""
    known = list(context.instance.get_dynamic_partitions(topic_partitions.name))
    try:
        maps, cursor_readable = decode_cursor_maps(context.cursor), True
    except ValueError as e:
        context.log.warning(f"{e}; starting from an empty cursor (every partition with eligible segments is requested)")
        maps, cursor_readable = {}, False
    previous = maps.get(REQUESTED, {})
    survey = survey_log_dirs(kafka_log_dirs.paths(), known)
    for problem in survey.unreadable_log_dirs:
        context.log.error(f"skipped a log dir this tick, checkpoint unreadable: {problem}")
    if survey.not_found:
        context.log.debug(f"{len(survey.not_found)} known partitions in no log dir: {', '.join(survey.not_found[:20])}")

    plan = plan_roll_runs(known, survey.eligible, previous,
                          max_partitions_per_run=MAX_PARTITIONS_PER_RUN, max_runs=MAX_RUNS_PER_TICK)
    observations, lag_maps = _observe_copy_lag(context, metadata_store, survey, known, maps)
    checked = (f"checked {survey.checked} of {len(known)} known partitions"
               f" ({len(survey.eligible)} with eligible segments, {survey.without_checkpoints} not yet checkpointed)")
    unchanged = cursor_readable and plan.cursor == previous and all(lag_maps[name] == maps.get(name, {}) for name in lag_maps)
    # Unchanged, the cursor is handed back as it came: compressing 10,000 entries costs ~0.1 s.
    cursor = context.cursor if unchanged else encode_cursor(plan.cursor, lag_maps)
    observed = f"; copy lag changed for {len(observations)} partitions" if observations else ""
    if not plan.batches:
        return dg.SensorResult(skip_reason=f"no new eligible segments; {checked}{observed}",
                               cursor=cursor, asset_events=observations)

    requested = sum(len(b.keys) for b in plan.batches)
    context.log.info(f"{checked}; {plan.changed} gained eligible segments → {len(plan.batches)} runs"
                     f" over {requested} partitions" + (f", {plan.deferred} deferred to the next tick" if plan.deferred else "")
                     + observed)
    return dg.SensorResult(
        run_requests=[range_run_request(b, tags={"kts/trigger": "segment_roll"}) for b in plan.batches],
        cursor=cursor,
        asset_events=observations,
    )


def _observe_copy_lag(context: dg.SensorEvaluationContext, metadata_store: MetadataStoreResource, survey: RollSurvey,
                      known: Sequence[str], maps: Mapping[str, Mapping[str, int]]
                      ) -> tuple[list[dg.AssetObservation], dict[str, dict[str, int]]]:
    """Observations for the partitions whose copy lag differs from the cursor's, and the cursor's
    lag maps after them. With the store unreachable the lag is not observed this tick (a warning),
    and copy runs are still requested."""
    known_set = set(known)
    segments_seen = {k: v for k, v in maps.get(LAG_SEGMENTS, {}).items() if k in known_set}
    bytes_seen = {k: v for k, v in maps.get(LAG_BYTES, {}).items() if k in known_set}
    if not survey.directories:
        return [], {LAG_SEGMENTS: segments_seen, LAG_BYTES: bytes_seen}
    from sqlalchemy.exc import SQLAlchemyError

    from kts_resources.metadata.database import MetadataStoreMisconfigured, MetadataStoreUnavailable
    from kts_resources.metadata.embedded import EmbeddedPostgresError

    try:
        states = metadata_store.store().partition_states()
    except (MetadataStoreUnavailable, MetadataStoreMisconfigured, EmbeddedPostgresError, SQLAlchemyError) as e:
        context.log.warning(f"copy lag not observed this tick: the metadata store is unavailable: {type(e).__name__}: {e}")
        return [], {LAG_SEGMENTS: segments_seen, LAG_BYTES: bytes_seen}
    observations = []
    for key, (segments, size) in sorted(copy_lags(survey, highest_copied_offsets(survey, states)).items()):
        if (segments_seen.get(key), bytes_seen.get(key)) == (segments, size):
            continue
        if len(observations) == MAX_LAG_OBSERVATIONS_PER_TICK:
            break
        observations.append(lag_observation(key, segments, size))
        segments_seen[key], bytes_seen[key] = segments, size
    return observations, {LAG_SEGMENTS: segments_seen, LAG_BYTES: bytes_seen}


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
    return update_sensor_cursor(instance, segment_roll_sensor, CODE_LOCATION_NAME, lambda cursor: _advanced(cursor, copied))


def _advanced(cursor: str | None, copied: Mapping[str, int]) -> str | None:
    try:
        maps = decode_cursor_maps(cursor)
    except ValueError:
        maps = {}  # unreadable: the sensor would start over anyway
    before = maps.pop(REQUESTED, {})
    requested = {**before, **copied}
    return cursor if requested == before and cursor else encode_cursor(requested, maps)
