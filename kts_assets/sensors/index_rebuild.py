"""The index-rebuild sensor: runs of ``index_rebuild_job`` for partitions whose remote log index is
missing, damaged (an entry's CRC, a file that does not decode, a segment covered twice or with a
gap) or behind the store (a segment finished a while ago and still not in it), or, in a log dir kts
owns, whose closed segments' ``.index`` / ``.timeindex`` are missing or torn (KIP-33's migration
case; ``kts_resources.maintenance.local_indexes``).

The check is the asset check's own rule (``kts_resources.reading.remote_index_check``) and reads every
index file of a partition, so a tick looks at a bounded slice of the known partitions and the cursor
goes round them: at 500 a tick and a tick a minute, 10,000 partitions are all looked at every
20 minutes. A segment finished within the last few minutes is not counted as missing: the copy run
that finished it builds its index in its next step.
"""

from __future__ import annotations

import json
import time

import dagster as dg

from kts_assets.batching import MAX_PARTITIONS_PER_RUN, batch_key_ranges, range_run_request
from kts_assets.jobs import INDEX_REBUILD_JOB_NAME, REBUILD_CONFIG
from kts_assets.partitions import NO_PARTITIONS_YET, topic_partitions
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources import settings
from kts_resources.maintenance.local_indexes import segments_to_reindex
from kts_resources.reading.remote_index_check import check_partition_index
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.tiers import finished_segments, locate_partitions, topic_id_partition

PARTITIONS_PER_TICK = 500
MAX_RUNS_PER_TICK = 10
# A segment finished this recently may be waiting for its own copy run's remote_log_index step.
FINISHED_GRACE_MS = 10 * 60 * 1000


def _decode(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        return int(json.loads(cursor)["next"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not an index-rebuild sensor cursor: {e}") from e


def index_problems(store, loc, home, now_ms: int) -> list[str]:
    """What is wrong with one located partition's indexes: its closed local segments' (in an owned
    log dir) and its remote log index (empty: nothing)."""
    problems = [p for _, found in segments_to_reindex(loc.partition.segments()) for p in found] if loc.owned else []
    tip = topic_id_partition(loc.partition, store)
    finished = [md for md in finished_segments(tip, store) if md.event_timestamp_ms <= now_ms - FINISHED_GRACE_MS]
    if tip is None or not finished:
        return problems
    remote, _entries = check_partition_index(index_cache.cache_directory(home, tip), finished)
    return problems + remote


@dg.sensor(
    job_name=INDEX_REBUILD_JOB_NAME,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests index_rebuild_job runs for partitions whose remote log index is missing, damaged or behind the "
        "metadata store, or whose closed local segments in an owned log dir lack a whole .index / .timeindex; "
        "looks at up to 500 partitions a tick in turn."
    ),
)
def index_rebuild_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource,
                         metadata_store: MetadataStoreResource):
    known = sorted(context.instance.get_dynamic_partitions(topic_partitions.name))
    if not known:
        return dg.SkipReason(NO_PARTITIONS_YET)
    start = _decode(context.cursor) % len(known)
    window = (known[start:] + known[:start])[:PARTITIONS_PER_TICK]
    store = metadata_store.store()
    home = settings.kts_home()
    now_ms = int(time.time() * 1000)
    located, _missing = locate_partitions(kafka_log_dirs.paths(), window, owned_log_dirs=kafka_log_dirs.owned_paths())
    damaged: list[str] = []
    for key in window:
        loc = located.get(key)
        if loc is None:
            continue
        try:
            problems = index_problems(store, loc, home, now_ms)
        except Exception as e:  # noqa: BLE001 - one partition's failure is logged; the others go on
            context.log.warning(f"{key}: remote log index not checked: {e}")
            continue
        if problems:
            damaged.append(key)
            context.log.info(f"{key}: remote log index to rebuild: {problems[0]}"
                             + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    batches = batch_key_ranges(known, damaged, max_partitions_per_run=MAX_PARTITIONS_PER_RUN)[:MAX_RUNS_PER_TICK]
    # The config rides on each request: a run over a key range takes no partitioned config.
    requests = [range_run_request(b, tags={"kts/trigger": "index_rebuild"}, run_config=REBUILD_CONFIG) for b in batches]
    cursor = json.dumps({"next": (start + len(window)) % len(known)})
    if not requests:
        return dg.SensorResult(skip_reason=f"looked at {len(window)} of {len(known)} partitions: every remote log index whole",
                               cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)
