"""The index-rebuild sensor: runs of ``index_rebuild_job`` for partitions whose remote log index is
missing, damaged (an entry's CRC, a file that does not decode, a segment covered twice or with a
gap) or behind the store (a segment finished a while ago and still not in it), or, in a log dir kts
owns, whose closed segments' local ``.index`` / ``.timeindex`` are missing or torn (KIP-33's
migration case; ``kts_resources.maintenance.local_indexes``).

In a broker-owned log dir (not in KTS_OWNED_LOG_DIRS) kts never writes, so a missing or torn local
index there is reported instead: the tick's message names the file and says how to repair it, and
one run is requested per newly found problem so that the ``local_indexes_whole`` check (evaluated
in the run's local_segments step, never rebuilding there) fails on the partition, naming the file.
The partitions already reported are kept in the sensor's state, so the run is not requested again
every tick; once the index is whole again the partition is forgotten.

The check is the asset check's own rule (``kts_resources.reading.remote_index_check``) and reads every
index file of a partition, so a tick looks at the known partitions in turn until its work budget is
spent (``sensors.budget``; the store's rows for them come in one query, ``tiering.batch_plans``) and
the cursor goes round them: at a few hundred a tick and a tick a minute, 4,000 partitions are all
looked at every ten minutes or so. A segment finished within the last few minutes is not counted as missing: the copy run
that finished it builds its index in its next step.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field

import dagster as dg

from kts_assets.batching import MAX_PARTITIONS_PER_RUN, batch_key_ranges, range_run_request
from kts_assets.jobs import INDEX_REBUILD_JOB_NAME, REBUILD_CONFIG
from kts_assets.partitions import NO_PARTITIONS_YET, topic_partitions
from kts_assets.sensors.budget import WORK_BUDGET_S, within_budget
from kts_assets.sensors.cursor import sensor_state, state_cursor
from kts_assets.sizes import counted
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources import settings
from kts_resources.kafka.logdir import SegmentFiles
from kts_resources.maintenance.local_indexes import repair_hint, segments_to_reindex
from kts_resources.reading.remote_index_check import check_partition_index
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.batch_plans import partition_views
from kts_resources.tiering.partition_view import PartitionView
from kts_resources.tiering.tiers import locate_partitions

# Partitions looked at per tick at most; a tick stops earlier when its work budget is spent
# (``sensors.budget``), and the next one goes on from there.
PARTITIONS_PER_TICK = 1000
MAX_RUNS_PER_TICK = 10
# A segment finished this recently may be waiting for its own copy run's remote_log_index step.
FINISHED_GRACE_MS = 10 * 60 * 1000


SENSOR_NAME = "index_rebuild_sensor"
# How many partitions a message names before "and N more".
NAMED_IN_MESSAGE = 5


def _decode(state: str | None) -> tuple[int, dict[str, int]]:
    """(the next position in the round of partitions, the broker-owned partitions already
    reported → a digest of their problems), from the state kept in the instance (a cursor from
    before is its own state)."""
    if not state:
        return 0, {}
    try:
        data = json.loads(state)
        return int(data["next"]), {str(k): int(v) for k, v in data.get("reported", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not an index-rebuild sensor cursor: {e}") from e


def _encode(position: int, reported: dict[str, int]) -> str:
    return json.dumps({"next": position, "reported": dict(sorted(reported.items()))}, separators=(",", ":"))


@dataclass
class IndexProblems:
    """What is wrong with one located partition's indexes."""

    local: list[tuple[SegmentFiles, list[str]]] = field(default_factory=list)  # closed segments' .index / .timeindex
    remote: list[str] = field(default_factory=list)  # its remote log index

    @property
    def local_lines(self) -> list[str]:
        return [p for _, found in self.local for p in found]


def index_problems(view: PartitionView, home, now_ms: int) -> IndexProblems:
    """What is wrong with one located partition's local indexes (stat() only, in any log dir)
    and its remote log index (``view`` holds its finished segments, read with many others')."""
    problems = IndexProblems(local=segments_to_reindex(view.segments))
    finished = [md for md in view.finished if md.event_timestamp_ms <= now_ms - FINISHED_GRACE_MS]
    if view.tip is None or not finished:
        return problems
    problems.remote, _entries = check_partition_index(index_cache.cache_directory(home, view.tip), finished)
    return problems


def _first_and_more(lines: list[str]) -> str:
    return lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")


def _digest(lines: list[str]) -> int:
    return zlib.crc32("\n".join(lines).encode())


def _named(keys: list[str]) -> str:
    more = f" and {len(keys) - NAMED_IN_MESSAGE} more" if len(keys) > NAMED_IN_MESSAGE else ""
    return ", ".join(keys[:NAMED_IN_MESSAGE]) + more


@dg.sensor(
    name=SENSOR_NAME,
    job_name=INDEX_REBUILD_JOB_NAME,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests index_rebuild_job runs for partitions whose remote log index is missing, damaged or behind the "
        "metadata store, or whose closed local segments in an owned log dir lack a whole .index / .timeindex; "
        "reports (never writes) missing or torn local indexes in broker-owned log dirs; looks at the partitions in "
        f"turn, as many a tick as {WORK_BUDGET_S:g} s of checking allows."
    ),
)
def index_rebuild_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource,
                         metadata_store: MetadataStoreResource):
    known = sorted(context.instance.get_dynamic_partitions(topic_partitions.name))
    if not known:
        return dg.SkipReason(NO_PARTITIONS_YET)
    try:
        position, reported = _decode(sensor_state(context.instance, SENSOR_NAME, context.cursor))
    except ValueError as e:
        context.log.warning(f"{e}; starting the round over")
        position, reported = 0, {}
    known_set = set(known)
    reported = {k: v for k, v in reported.items() if k in known_set}
    start = position % len(known)
    window = (known[start:] + known[:start])[:PARTITIONS_PER_TICK]
    store = metadata_store.store()
    home = settings.kts_home()
    now_ms = int(time.time() * 1000)
    located, _missing = locate_partitions(kafka_log_dirs.paths(), window, owned_log_dirs=kafka_log_dirs.owned_paths())
    to_rebuild: list[str] = []  # owned local indexes or remote log indexes kts rebuilds
    newly_reported: list[str] = []  # broker-owned local indexes: a run evaluates the check once
    broker_owned: dict[str, str] = {}  # key → its problem and the repair, for the message
    position_of = {key: i for i, key in enumerate(window)}
    looked_at, checked = len(window), 0  # the round moves on past the last partition looked at
    for key, view in within_budget(partition_views(located, store)):
        looked_at, checked = position_of[key] + 1, checked + 1
        loc = located[key]
        try:
            problems = index_problems(view, home, now_ms) if not isinstance(view, Exception) else view
        except Exception as e:  # noqa: BLE001 - one partition's failure is logged; the others go on
            problems = e
        if isinstance(problems, Exception):
            context.log.warning(f"{key}: indexes not checked: {problems}")
            continue
        local = problems.local_lines
        if local and loc.owned:
            context.log.info(f"{key}: local index to rebuild: {_first_and_more(local)}")
        elif local:
            broker_owned[key] = f"{_first_and_more(local)}; {repair_hint(problems.local[0][0].log, owned=False)}"
            if reported.get(key) != _digest(local):
                reported[key] = _digest(local)
                newly_reported.append(key)
                context.log.warning(f"{key}: local index missing or torn in a broker-owned log dir: {broker_owned[key]}")
        else:
            reported.pop(key, None)
        if problems.remote:
            context.log.info(f"{key}: remote log index to rebuild: {_first_and_more(problems.remote)}")
        if problems.remote or (local and loc.owned):
            to_rebuild.append(key)
    if checked == len(located):
        looked_at = len(window)  # every one in the window (those in no log dir too)
    batches = batch_key_ranges(known, [*to_rebuild, *newly_reported], max_partitions_per_run=MAX_PARTITIONS_PER_RUN)[:MAX_RUNS_PER_TICK]
    # The config rides on each request: a run over a key range takes no partitioned config.
    requests = [range_run_request(b, tags={"kts/trigger": "index_rebuild"}, run_config=REBUILD_CONFIG) for b in batches]
    next_position = (start + looked_at) % len(known)
    cursor = state_cursor(context.instance, SENSOR_NAME, _encode(next_position, reported),
                          previous=context.cursor, next=next_position, reported=len(reported))
    looked = f"looked at {looked_at} of {counted(len(known), 'known partition')}"
    if broker_owned:
        keys = sorted(broker_owned)
        first = keys[0]
        warning = (f"{counted(len(keys), 'partition')} in broker-owned log dirs with a missing or torn local index, "
                   f"reported by the local_indexes_whole check of local_segments: {_named(keys)}; {first}: {broker_owned[first]}")
    else:
        warning = ""
    if not requests:
        whole = ("every remote log index and every closed segment's local .index / .timeindex whole" if not broker_owned
                 else "every remote log index whole; nothing kts may rebuild")
        return dg.SensorResult(skip_reason=f"{looked}: {whole}" + (f"; {warning}" if warning else ""), cursor=cursor)
    context.log.info(f"{looked}: {counted(len(to_rebuild), 'partition')} with an index to rebuild"
                     + (f", {counted(len(newly_reported), 'partition')} newly found with a local index missing or torn in a "
                        f"broker-owned log dir (a run evaluates its check; nothing is rebuilt there)" if newly_reported else "")
                     + f" → {counted(len(requests), 'run')}" + (f"; {warning}" if warning else ""))
    return dg.SensorResult(run_requests=requests, cursor=cursor)
