"""The retention sensor: expiry runs for the partitions whose retention plan has something to expire.

Per tick the work follows what changed, never the whole history: the store's event log since the
cursor (copies, deletes, log start offset moves, topic config changes) names the partitions to
re-plan, and the cursor keeps, per partition, when its oldest kept remote segment will pass
retention.ms (its largest timestamp + retention.ms), so a partition nothing happened to is planned
again only once that time has come. The first tick plans every known partition once. The hourly
reconcile schedule runs retention over every partition as a backstop.

That state (a due time per partition) is kept in the instance; the cursor only names it
(``kts_assets.sensors.cursor``), with the event id reached and how many partitions are tracked.
A tick that requests nothing says what it planned, why, and which partition is due next.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import dagster as dg

from kts_assets.batching import MAX_PARTITIONS_PER_RUN, batch_key_ranges, range_run_request
from kts_assets.jobs import EXPIRY_JOB_NAME
from kts_assets.partitions import NO_PARTITIONS_YET, topic_partitions
from kts_assets.sensors.budget import WORK_BUDGET_S, within_budget
from kts_assets.sensors.cursor import sensor_state, state_cursor
from kts_assets.sizes import counted
from kts_resources.tiering.batch_plans import retention_plans
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.tiers import locate_partitions

# Events read per tick at most; the rest on the next tick (the cursor moves only over what was read).
MAX_EVENTS_PER_TICK = 50_000
# Re-read this many event ids before the cursor: ids can commit out of order under concurrent writers.
EVENT_OVERLAP = 100
MAX_RUNS_PER_TICK = 10
# Partitions planned per tick at most. A tick plans, those waiting longest first, until its work
# budget is spent (``sensors.budget``: a millisecond or a few a partition, so some hundreds a tick
# on this machine); the first tick over 4,000 partitions, or a broker-wide change that makes them
# all due, would otherwise outlast it. The rest stay due and are planned on the next ticks
# (bench/scale_bench.py). The budget binds first; this bounds what a tick locates beforehand.
MAX_PLANS_PER_TICK = 1000


SENSOR_NAME = "retention_sensor"


def _decode(state: str | None) -> tuple[int, dict[str, int], set[int]]:
    """The state (kept in the instance, ``sensors.cursor``; a cursor from before is its own state)."""
    if not state:
        return -1, {}, set()
    try:
        data = json.loads(state)
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


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@dg.sensor(
    name=SENSOR_NAME,
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
    try:
        last_event, due, seen = _decode(sensor_state(context.instance, SENSOR_NAME, context.cursor))
    except ValueError as e:
        context.log.warning(f"{e}; starting over: every known partition is planned once")
        last_event, due, seen = -1, {}, set()
    now_ms = int(time.time() * 1000)
    came_due = sum(1 for at in due.values() if at <= now_ms)
    wanted, newest, seen = partitions_to_plan(store, known, last_event, due, seen, now_ms)
    wanted_count = len(wanted)
    # Those due longest first (never planned: first of all), as many as the tick's budget allows
    # (``sensors.budget``); the rest stay due for the next ticks.
    by_wait = sorted(wanted, key=lambda k: (due.get(k, -1), k))[:MAX_PLANS_PER_TICK]
    located, _missing = locate_partitions(kafka_log_dirs.paths(), by_wait, owned_log_dirs=kafka_log_dirs.owned_paths())
    planned = set(by_wait) - set(located)
    for key in planned:
        due.pop(key, None)  # in no log dir: nothing here to plan

    with_work: list[str] = []
    for key, plan in within_budget(retention_plans(located, store, now_ms=now_ms)):
        planned.add(key)
        if isinstance(plan, Exception):  # one partition's failure is logged; the others go on
            context.log.warning(f"{key}: retention not planned: {plan}")
            continue
        if plan is None:  # kts has never seen its topic: nothing remote
            due.pop(key, None)
            continue
        if plan.has_work:
            with_work.append(key)
        retention_ms = plan.config.retention_ms
        if plan.remote.oldest_retained_timestamp >= 0 and retention_ms >= 0:
            due[key] = plan.remote.oldest_retained_timestamp + retention_ms
        else:
            due.pop(key, None)
    out_of_time = len(planned) < len(by_wait)
    deferred = sorted(wanted - planned)
    for key in deferred:
        due[key] = min(due.get(key, now_ms), now_ms)
    batches = batch_key_ranges(known, with_work, max_partitions_per_run=MAX_PARTITIONS_PER_RUN)
    requests = [range_run_request(b, tags={"kts/trigger": "retention"}) for b in batches[:MAX_RUNS_PER_TICK]]
    # Partitions left for the next tick stay due now.
    for b in batches[MAX_RUNS_PER_TICK:]:
        for key in b.keys:
            due[key] = now_ms
    state = _encode(newest, due, seen)
    cursor = state_cursor(context.instance, SENSOR_NAME, state, previous=context.cursor, event=newest, partitions=len(due))
    if last_event < 0 and not deferred:
        why = f"first tick: planned all {counted(len(known), 'known partition')}"
    elif last_event < 0:
        why = f"first tick: planned {len(planned)} of {counted(len(known), 'known partition')}"
    else:
        events = "no new store event" if newest == last_event else f"the store events after {last_event} up to {newest}"
        why = (f"planned {len(planned)} of {counted(len(known), 'known partition')}"
               f" (those named by {events}, and {came_due} whose oldest remote segment passed retention.ms)")
    if deferred:
        share = f"{WORK_BUDGET_S:g} s of planning a tick" if out_of_time else f"{MAX_PLANS_PER_TICK} a tick"
        why += f" ({len(deferred)} of the {wanted_count} to plan wait for the next ticks: {share})"
    if requests:
        context.log.info(f"{why}; {counted(len(with_work), 'partition')} with something to expire → "
                         f"{counted(len(requests), 'run')}")
        return dg.SensorResult(run_requests=requests, cursor=cursor)
    upcoming = min(due.items(), key=lambda kv: (kv[1], kv[0]), default=None)
    next_due = (f"; next due: {upcoming[0]} at {_when(upcoming[1])}" if upcoming
                else "; no partition has a remote segment under a finite retention.ms")
    return dg.SensorResult(skip_reason=f"{why}: none has anything to expire{next_due}", cursor=cursor)
