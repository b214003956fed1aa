"""The retention sensor: expiry runs for the partitions whose retention plan has something to expire.

Per tick the work follows what changed, never the whole history: the store's event log since the
cursor (copies, deletes, log start offset moves, topic config changes) names the partitions to
re-plan, and the cursor keeps, per partition, when its oldest kept remote segment will pass
retention.ms (its largest timestamp + retention.ms), so a partition nothing happened to is planned
again only once that time has come. The first tick plans every known partition once. The hourly
reconcile schedule runs retention over every partition as a backstop.
"""

from __future__ import annotations

import json
import time

import dagster as dg

from kts_assets.batching import MAX_PARTITIONS_PER_RUN, batch_key_ranges, range_run_request
from kts_assets.jobs import EXPIRY_JOB_NAME
from kts_assets.partitions import NO_PARTITIONS_YET, topic_partitions
from kts_resources.tiering.expiry import plan_partition
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.tiers import locate_partitions

# Events read per tick at most; the rest on the next tick (the cursor moves only over what was read).
MAX_EVENTS_PER_TICK = 50_000
# Re-read this many event ids before the cursor: ids can commit out of order under concurrent writers.
EVENT_OVERLAP = 100
MAX_RUNS_PER_TICK = 10


def _decode(cursor: str | None) -> tuple[int, dict[str, int], set[int]]:
    if not cursor:
        return -1, {}, set()
    try:
        data = json.loads(cursor)
        return int(data["event"]), {str(k): int(v) for k, v in data["due"].items()}, {int(i) for i in data.get("seen", [])}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a retention sensor cursor: {e}") from e


def _encode(last_event: int, due: dict[str, int], seen: set[int]) -> str:
    return json.dumps({"event": last_event, "due": dict(sorted(due.items())), "seen": sorted(seen)}, separators=(",", ":"))


def partitions_to_plan(store, known: list[str], last_event: int, due: dict[str, int], seen: set[int],
                       now_ms: int) -> tuple[set[str], int, set[int]]:
    """(partition keys to re-plan, the newest event id read, the ids read within the overlap
    window): every known key on the first tick; after it, keys named by events not seen before and
    keys whose due time has come. Ids can commit out of order under concurrent writers, so the
    last EVENT_OVERLAP ids are read again and only those not seen count."""
    if last_event < 0:
        latest = store.latest_event_id()
        recent = {e.id for e in store.events(since_id=max(0, latest - EVENT_OVERLAP))}
        return set(known), max([latest, *recent]), recent
    events = [e for e in store.events(since_id=max(0, last_event - EVENT_OVERLAP), limit=MAX_EVENTS_PER_TICK)
              if e.id > last_event or e.id not in seen]
    newest = max([last_event, *(e.id for e in events)])
    window = {i for i in seen | {e.id for e in events} if i > newest - EVENT_OVERLAP}
    names = {tid: name for name, tid in store.topics().items()}
    known_set = set(known)
    wanted: set[str] = {k for k, at in due.items() if at <= now_ms and k in known_set}
    for e in events:
        topic = names.get(e.topic_id)
        if topic is None:
            continue
        if e.partition is None:  # a topic-wide change (configs): every partition of the topic
            wanted.update(k for k in known_set if k.rpartition("-")[0] == topic)
        else:
            key = f"{topic}-{e.partition}"
            if key in known_set:
                wanted.add(key)
    return wanted, newest, window


@dg.sensor(
    job_name=EXPIRY_JOB_NAME,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests expiry runs, a few partition ranges at a time, for partitions whose retention plan has something to "
        "expire; re-plans only partitions the store's event log names since the last tick or whose oldest kept "
        "segment's retention.ms has come."
    ),
)
def retention_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource,
                     metadata_store: MetadataStoreResource):
    known = sorted(context.instance.get_dynamic_partitions(topic_partitions.name))
    if not known:
        return dg.SkipReason(NO_PARTITIONS_YET)
    store = metadata_store.store()
    last_event, due, seen = _decode(context.cursor)
    now_ms = int(time.time() * 1000)
    wanted, newest, seen = partitions_to_plan(store, known, last_event, due, seen, now_ms)
    located, _missing = locate_partitions(kafka_log_dirs.paths(), sorted(wanted), owned_log_dirs=kafka_log_dirs.owned_paths())
    from kts_resources.tiering.tiers import topic_id_partition

    with_work: list[str] = []
    for key in sorted(wanted):
        loc = located.get(key)
        tip = topic_id_partition(loc.partition, store) if loc is not None else None
        if tip is None:
            due.pop(key, None)
            continue
        try:
            plan = plan_partition(loc, tip, store, now_ms=now_ms)
        except Exception as e:  # noqa: BLE001 - one partition's failure is logged; the others go on
            context.log.warning(f"{key}: retention not planned: {e}")
            continue
        if plan.has_work:
            with_work.append(key)
        retention_ms = plan.config.retention_ms
        if plan.remote.oldest_retained_timestamp >= 0 and retention_ms >= 0:
            due[key] = plan.remote.oldest_retained_timestamp + retention_ms
        else:
            due.pop(key, None)
    batches = batch_key_ranges(known, with_work, max_partitions_per_run=MAX_PARTITIONS_PER_RUN)
    requests = [range_run_request(b, tags={"kts/trigger": "retention"}) for b in batches[:MAX_RUNS_PER_TICK]]
    # Partitions left for the next tick stay due now.
    for b in batches[MAX_RUNS_PER_TICK:]:
        for key in b.keys:
            due[key] = now_ms
    context.log.info(f"planned {len(wanted)} of {len(known)} partitions; {len(with_work)} have something to expire")
    return dg.SensorResult(run_requests=requests, cursor=_encode(newest, due, seen))
