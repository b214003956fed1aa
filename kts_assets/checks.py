"""Asset checks: offset invariants, CRC-clean local segments with whole indexes, every finished remote segment in the
bucket with its checksum, the data-loss alarm, the remote log index's coverage, and whether each
pass completed.

Every check is a check spec of the step that materialises its asset, evaluated there once the
asset is reported (``segments_checks``, ``retention_checks``, ``remote_index_checks``): a step of
their own cost ~0.1 s of Dagster's bookkeeping each, per run. The steps can run them alone
(``can_subset``), as the UI's "execute check" does. A check that cannot run fails its step without
a retry (:func:`checks_that_must_run`). None blocks its step: a failed ``copy_completed`` or
``retention_completed`` (RUN_FAILING_CHECKS) fails the run at its end instead
(kts_assets.partition_outcome), after the steps that follow have run for every partition, and
marks its partition failed where the UI shows partitions. Checks are partitioned like their
assets. A run over one partition records one result for it; a single-run backfill over many
records one evaluation per partition and nothing else (a run over a partition range has no
partition of its own, so a summary would land on no partition).

Assets are named by their keys (``kts_assets.asset_keys``), not imported: the assets import their
check specs from here.
"""

from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import dagster as dg

from kts_assets.asset_keys import LOCAL_SEGMENTS, REMOTE_LOG_INDEX, REMOTE_SEGMENTS, RETENTION_STATE
from kts_assets.dagster_internals import MaterializationTarget, materialization_target, plan_materialization_again
from kts_assets.partition_outcome import one_line
from kts_assets.partitions import topic_partitions
from kts_assets.sizes import counted
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources import settings
from kts_resources.spark.inventory import inventory_path, read_inventory_table
from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.reading.remote_index_check import check_partition_index
from kts_resources.remote_log import RemoteStorageError
from kts_resources.maintenance.local_indexes import repair_hint, segments_to_reindex
from kts_resources.maintenance.remote_integrity import RoutineLooks
from kts_resources.metadata.topic_config import TopicConfig
from kts_resources.tiering.lost_ranges import describe, detect_lost_ranges
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource
from kts_resources.tiering.tiers import (
    LocatedPartition,
    active_log_end_offset,
    finished_segments,
    locate_partitions,
    topic_id_partition,
)
from kts_resources.tiering.batch_plans import PARTITIONS_PER_QUERY, partition_views
from kts_resources.tiering.partition_view import PartitionView, tiers_of, with_listing

Verdict = tuple[bool, dict[str, object], str]  # passed, metadata, description
T = TypeVar("T")  # what a judge is handed: a located partition, or its key
# Partitions judged at once by a check: within the metadata store's connection pool (5).
JUDGES = 4


def _partition_keys(context: dg.AssetExecutionContext) -> list[str]:
    ctx = context.op_execution_context
    if ctx.has_partition_key or ctx.has_partition_key_range:
        return list(ctx.partition_keys)
    return list(context.instance.get_dynamic_partitions(topic_partitions.name))


def _report(context: dg.AssetExecutionContext, asset_key: dg.AssetKey, check_name: str,
            verdicts: dict[str, Verdict], records: dict[str, dg.EventLogRecord] | None = None) -> Iterator[dg.AssetCheckEvaluation | dg.AssetCheckResult | dg.Output]:
    """The check's results: one AssetCheckResult in a single-partition run, else an evaluation per
    partition aimed at its latest materialisation (from ``records`` when the caller has them)."""
    failing = sorted(k for k, (passed, _, _) in verdicts.items() if not passed)
    for key in failing:
        context.log.error(f"{check_name} failed for {key}: {verdicts[key][2]}")
    if len(verdicts) == 1 and context.op_execution_context.has_partition_key:
        passed, metadata, description = next(iter(verdicts.values()))
        yield dg.AssetCheckResult(asset_key=asset_key, check_name=check_name, passed=passed, metadata=metadata,
                                  description=description)
        return
    if records is None:
        records = _latest_records(context.instance, asset_key, list(verdicts))
    targets = _targets(records)
    for key, (passed, metadata, description) in verdicts.items():
        yield dg.AssetCheckEvaluation(asset_key=asset_key, check_name=check_name, passed=passed,
                                      partition=key, metadata=metadata, description=description,
                                      target_materialization_data=targets.get(key))
    # No run-level summary result: it would be an unpartitioned evaluation ("Partition —" in the UI)
    # beside the per-partition ones. The step's output (what an AssetCheckResult would emit) says
    # the check ran; the tally goes to the run's log.
    ctx = context.op_execution_context
    yield dg.Output(None, output_name=ctx.assets_def.get_output_name_for_asset_check_key(
        dg.AssetCheckKey(asset_key, check_name)))
    context.log.info(f"{check_name}: {len(failing)} of {len(verdicts)} partitions fail" if failing
                     else f"{check_name}: all {len(verdicts)} partitions pass")


def _targets(records: dict[str, dg.EventLogRecord]) -> dict[str, MaterializationTarget]:
    """Each partition's latest materialisation, which its evaluation is about: without it the UI
    counts the evaluation as stale and shows no status for the partition. Dagster looks these up
    itself only for a single-partition run; over a range they come from ``_latest_records``."""
    return {key: materialization_target(record) for key, record in records.items()}


def _latest_records(instance: dg.DagsterInstance, asset_key: dg.AssetKey, keys: list[str]) -> dict[str, dg.EventLogRecord]:
    """Each partition's latest materialisation record (partitions never materialised are absent)."""
    wanted, found = set(keys), {}
    cursor = None
    while wanted - found.keys():
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=sorted(wanted - found.keys())),
            limit=max(len(wanted - found.keys()), 50), cursor=cursor)
        for record in page.records:
            partition = record.partition_key
            if partition in wanted and partition not in found:
                found[partition] = record
        if not page.has_more:
            break
        cursor = page.cursor
    return found


class _Located:
    """Where a run's partitions are, found once for every check of a step."""

    def __init__(self, kafka_log_dirs: KafkaLogDirsResource, keys: list[str]):
        self.log_dirs = kafka_log_dirs.paths()
        self.partitions, self.missing = locate_partitions(self.log_dirs, keys, owned_log_dirs=kafka_log_dirs.owned_paths())

    def verdicts(self, judge: Callable[[LocatedPartition], Verdict]) -> dict[str, Verdict]:
        return self._with_missing(self._judged(list(self.partitions), lambda key: judge(self.partitions[key])))

    def verdicts_with_views(self, store, judge: Callable[[LocatedPartition, PartitionView], Verdict], *,
                            looks: RoutineLooks | None = None) -> dict[str, Verdict]:
        """``verdicts`` of a judge that also takes the partition's view holding its store rows
        (partition row, finished segments), read when the check starts a chunk of partitions per
        query (``batch_plans.partition_views``) rather than a few reads per partition; a
        partition.metadata that cannot be read is that partition's judge's exception.
        ``looks``: what was verified of each chunk's finished segments, read before its judges
        run, and what they read whole written after, a statement each."""
        verdicts: dict[str, Verdict] = {}
        keys = list(self.partitions)
        for first in range(0, len(keys), PARTITIONS_PER_QUERY):
            chunk = {key: self.partitions[key] for key in keys[first:first + PARTITIONS_PER_QUERY]}
            views = dict(partition_views(chunk, store))
            if looks is not None:
                looks.read(md for view in views.values() if not isinstance(view, Exception) for md in view.finished)

            def judged(key: str) -> Verdict:
                view = views[key]
                if isinstance(view, Exception):
                    raise view
                return judge(chunk[key], view)

            verdicts.update(self._judged(list(chunk), judged))
            if looks is not None:
                looks.write()
        return self._with_missing(verdicts)

    def _judged(self, keys: list[str], judge: Callable[[str], Verdict]) -> dict[str, Verdict]:
        # Side by side: a judge mostly waits on the metadata store, the remote tier or the disk.
        with ThreadPoolExecutor(max_workers=max(1, min(JUDGES, len(keys))), thread_name_prefix="kts-check") as pool:
            return dict(zip(keys, pool.map(_unreadable_fails(judge), keys)))

    def _with_missing(self, verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
        for key in self.missing:
            # A wrong KTS_LOG_DIRS (or a partition deleted since it was registered) is a finding, not a pass.
            verdicts[key] = (False, {"missing": True},
                             f"the partition is in none of the log dirs ({', '.join(map(str, self.log_dirs))}); is KTS_LOG_DIRS right?")
        return verdicts


def _unreadable_fails(judge: Callable[[T], Verdict]) -> Callable[[T], Verdict]:
    """``judge``, but a partition whose files cannot be read (a damaged segment or index, a file
    gone mid-read, its objects in an unreachable tier) fails the check with the reason, instead of
    stopping the check for every one (whose causes would then all name this partition's objects)."""

    def judged(partition: T) -> Verdict:
        try:
            return judge(partition)
        except (OSError, KafkaFormatError, RemoteStorageError) as e:
            return False, {"unreadable": True}, f"could not be judged: {one_line(str(e))}"

    return judged


def _per_partition(kafka_log_dirs: KafkaLogDirsResource, keys: list[str],
                   judge: Callable[[LocatedPartition], Verdict]) -> dict[str, Verdict]:
    return _Located(kafka_log_dirs, keys).verdicts(judge)


def _crc_clean_verdicts(keys: list[str]) -> dict[str, Verdict]:
    verdicts: dict[str, Verdict] = {}
    for key in keys:
        path = inventory_path(key)
        if not path.is_dir():
            verdicts[key] = (True, {"segments": 0}, "no inventory yet: materialise local_segments first")
            continue
        # Read on the driver: a row per segment, which local_segments' Spark job has just written;
        # a Spark job of its own here cost a second a run for a few kilobytes of Parquet.
        total, bad = _unhealthy_inventory_rows(path)
        description = "; ".join(f"{r['path']}: {r['health']}" + (f", {r['crc_failures']} batches fail their CRC" if r["crc_failures"] else "")
                                for r in bad[:10])
        verdicts[key] = (not bad, {"segments": total, "unhealthy_segments": len(bad),
                                   "first_unhealthy_base_offset": bad[0]["base_offset"] if bad else -1},
                         description or f"{counted(total, 'segment')} CRC-clean")
    return verdicts


def _unhealthy_inventory_rows(path) -> tuple[int, list[dict]]:
    """(segments in the inventory at ``path``, its rows whose segment is unhealthy or fails a CRC,
    by base offset)."""
    rows = read_inventory_table(path, columns=["base_offset", "path", "health", "crc_failures"]).to_pylist()
    bad = sorted((r for r in rows if r["health"] != "ok" or r["crc_failures"]), key=lambda r: r["base_offset"])
    return len(rows), bad


# --- the checks of local_segments and remote_segments, evaluated in the step materialising them ---
# Judged once the inventory and the copy are reported; every partition is located and its latest
# materialisation read once for all of them.

def _offset_invariants(loc: LocatedPartition, view: PartitionView, follower_role: str | None = None) -> Verdict:
    """Lx ≤ Ly ≤ Lz and Rx ≤ Ry ≤ Ly. On a replica that does not copy (``follower_role``: its role,
    e.g. "follower of broker 2") the leader's kts copied up to the leader's high watermark, which
    this replica's may trail: Ry ≤ Ly is the leader's invariant, not this replica's."""
    segments = loc.partition.segments()
    o = tiers_of(with_listing(view, segments, active_log_end_offset(segments)), exact_log_end_offset=False)
    rx, ry = o.remote_log_start_offset, o.remote_log_end_offset
    problems = []
    if o.high_watermark < 0:
        problems.append("no high watermark in replication-offset-checkpoint")
    elif not o.local_log_start_offset <= o.high_watermark <= o.log_end_offset:
        problems.append(f"not Lx {o.local_log_start_offset} ≤ Ly {o.high_watermark} ≤ Lz {o.log_end_offset}")
    below_hw = follower_role is not None or o.high_watermark < 0 or ry <= o.high_watermark
    if o.remote_segments and not (0 <= rx <= ry and below_hw):
        problems.append(f"not Rx {rx} ≤ Ry {ry} ≤ Ly {o.high_watermark}")
    metadata = {"Lx": o.local_log_start_offset, "Ly": o.high_watermark, "Lz": o.log_end_offset, "Rx": rx, "Ry": ry}
    in_order = "offsets in order" if follower_role is None else f"offsets in order ({follower_role}: Ry may pass Ly)"
    return not problems, metadata, "; ".join(problems) or in_order


def _remote_segments_in_bucket(loc: LocatedPartition, store, storage, view: PartitionView | None = None,
                               looks: RoutineLooks | None = None) -> Verdict:
    """``view``: the partition's store rows if the caller read them (many partitions' at once);
    ``looks``: what was verified of them, read likewise (else read and written here)."""
    tip = topic_id_partition(loc.partition, store) if view is None else view.tip
    finished = finished_segments(tip, store) if view is None else view.finished
    if tip is None or not finished:
        return True, {"remote_segments": 0, "objects_checked": 0, "damaged_segments": 0}, "nothing remote"
    # An object read whole before, and listed at the same version since, is not read again.
    alone = looks is None
    if alone:
        looks = RoutineLooks(store, storage)
        looks.read(finished)
    found = looks.inspect(tip, finished)
    if alone:
        looks.write()
    if found.none_present:  # another tier, not damage in this one: nothing to re-copy
        return False, {"remote_segments": len(finished), "objects_checked": found.objects_checked,
                       "damaged_segments": 0, "objects_missing": found.objects_missing}, found.wrong_tier_line(storage, tip)
    for md, problems in found.damaged:
        store.record_segment_damage(md.segment_id, "; ".join(problems))  # the next copy pass re-copies it
    for md, problem in found.manifests_lost:
        store.forget_segment_manifest(md.segment_id, problem)  # the next copy pass writes it again
    metadata = {"remote_segments": len(finished), "objects_checked": found.objects_checked,
                "damaged_segments": len(found.damaged), "problems": len(found.problems),
                "manifests_lost": len(found.manifests_lost)}
    if not found.intact:
        lines = found.problems + [problem for _, problem in found.manifests_lost]
        return False, metadata, ("; ".join(lines[:10])
                                 + "; damaged segments are re-copied by the next copy pass while their local segments exist, "
                                   "lost manifests are written again")
    return True, metadata, f"{found.objects_checked} objects present and intact"


def _no_uncopied_segment_lost(loc: LocatedPartition, store, topic_configs: dict[str, TopicConfig] | None = None, *,
                              look: bool = True) -> Verdict:
    """``topic_configs``: every topic's, if the caller read them (once for many partitions).
    ``look``: False when the copy pass of the same step has just looked (under the lock, at its end)."""
    tip = topic_id_partition(loc.partition, store)
    if tip is None:
        return True, {"lost_offsets": 0, "lost_ranges": 0, "owned_log_dir": loc.owned}, "nothing copied yet"
    # Look now rather than wait for the next copy pass, but only while no copy runs: one that
    # finishes between the two reads would look like loss, and a recorded loss never goes away.
    # With copying off (remote.log.copy.disable), what the local retention deletes is expired, not lost.
    if look:
        config = topic_configs.get(tip.topic) if topic_configs is not None else None
        copying = (config if config is not None else store.topic_configs(tip.topic)).copy_enabled(tip.topic)
        with store.try_partition_lock(tip) as lock:
            if lock is not None and copying:
                detect_lost_ranges(store, tip, loc.partition.segments(), how_found="no_uncopied_segment_lost check")
    every = store.lost_ranges(tip, include_acknowledged=True)
    open_ranges = [r for r in every if not r.acknowledged]
    metadata = {"lost_offsets": sum(r.offsets for r in open_ranges), "lost_ranges": len(open_ranges),
                "acknowledged_lost_ranges": len(every) - len(open_ranges),
                "first_lost_range": str(open_ranges[0]) if open_ranges else "", "owned_log_dir": loc.owned}
    if open_ranges:
        return False, metadata, "; ".join(describe(r) for r in open_ranges)
    acknowledged = f" ({len(every)} lost range{'s' if len(every) > 1 else ''} acknowledged)" if every else ""
    return True, metadata, f"every deleted local segment was copied first{acknowledged}"


def _local_indexes_whole(loc: LocatedPartition) -> Verdict:
    """Every closed local segment has a whole ``.index`` and ``.timeindex`` (stat() only); failing,
    it names the files and how they get repaired — kts writes only log dirs it owns."""
    found = segments_to_reindex(loc.partition.segments())
    problems = [p for _, ps in found for p in ps]
    metadata = {"segments_with_index_problems": len(found), "owned_log_dir": loc.owned}
    if not found:
        return True, metadata, "every closed segment has a whole .index and .timeindex"
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return (False, {**metadata, "first_index_problem": problems[0]},
            "; ".join(problems[:5]) + more + "; " + repair_hint(found[0][0].log, loc.owned))


CRC_CLEAN = dg.AssetCheckKey(LOCAL_SEGMENTS, "local_segments_crc_clean")
LOCAL_INDEXES_WHOLE = dg.AssetCheckKey(LOCAL_SEGMENTS, "local_indexes_whole")
OFFSET_INVARIANTS = dg.AssetCheckKey(REMOTE_SEGMENTS, "offset_invariants")
REMOTE_SEGMENTS_IN_BUCKET = dg.AssetCheckKey(REMOTE_SEGMENTS, "remote_segments_in_bucket")
NO_UNCOPIED_SEGMENT_LOST = dg.AssetCheckKey(REMOTE_SEGMENTS, "no_uncopied_segment_lost")
COPY_COMPLETED = dg.AssetCheckKey(REMOTE_SEGMENTS, "copy_completed")

SEGMENTS_CHECK_SPECS = [
    dg.AssetCheckSpec(CRC_CLEAN.name, asset=LOCAL_SEGMENTS, partitions_def=topic_partitions,
                      description="Every batch of every local segment passes its CRC-32C and no segment ends in invalid bytes "
                                  "(from the Parquet inventory)."),
    dg.AssetCheckSpec(LOCAL_INDEXES_WHOLE.name, asset=LOCAL_SEGMENTS, partitions_def=topic_partitions,
                      description="Every closed local segment has its .index and .timeindex, each a whole number of "
                                  "entries. Failing, it names the files: in a log dir kts owns (KTS_OWNED_LOG_DIRS) the "
                                  "index_rebuild sensor rebuilds them; kts never writes a broker-owned log dir, and says "
                                  "how to repair it."),
    dg.AssetCheckSpec(OFFSET_INVARIANTS.name, asset=REMOTE_SEGMENTS, partitions_def=topic_partitions,
                      description="Lx ≤ Ly ≤ Lz (local log start ≤ high watermark ≤ log end) and Rx ≤ Ry ≤ Ly "
                                  "(remote start ≤ remote end ≤ high watermark)."),
    dg.AssetCheckSpec(REMOTE_SEGMENTS_IN_BUCKET.name, asset=REMOTE_SEGMENTS, partitions_def=topic_partitions,
                      description="Every COPY_SEGMENT_FINISHED segment's objects are in the remote tier with their recorded "
                                  "size; objects up to 1 MiB are read back and their CRC-32C compared. A damaged segment is "
                                  "recorded in the metadata store and re-copied by the next copy pass while its local segment "
                                  "exists; a segment whose manifest (what `kts recover` reads) is missing or wrong gets it "
                                  "written again by the next copy pass."),
    dg.AssetCheckSpec(NO_UNCOPIED_SEGMENT_LOST.name, asset=REMOTE_SEGMENTS, partitions_def=topic_partitions,
                      description="Data-loss alarm: no offsets below the local log start offset are missing from the remote "
                                  "tier (deleted from the local log before they were copied). A lost range is "
                                  "recorded in the metadata store and fails this check on every evaluation until `kts "
                                  "ack-loss` acknowledges it."),
    # Fails the run at its end, not its step (RUN_FAILING_CHECKS).
    dg.AssetCheckSpec(COPY_COMPLETED.name, asset=REMOTE_SEGMENTS, partitions_def=topic_partitions,
                      description="The partition's latest copy pass completed: no segment failed its verification or "
                                  "upload and the metadata store and the remote tier answered. Otherwise it fails with the "
                                  "copy's error (file, byte position, what), and its run fails once the other "
                                  "partitions have been through retention and the remote log index."),
]


def segments_checks(context: dg.AssetExecutionContext, kafka_log_dirs: KafkaLogDirsResource,
                    metadata_store: MetadataStoreResource, remote_tier: RemoteTierResource, *,
                    looked_for_lost_ranges: Collection[str] = ()) -> Iterator:
    """The results of the SEGMENTS_CHECK_SPECS the step runs (those selected), for its partitions.
    ``looked_for_lost_ranges``: partitions whose copy pass has just looked for lost ranges under
    their lock, which no_uncopied_segment_lost reads without looking again."""
    selected = context.selected_asset_check_keys
    keys = _partition_keys(context)
    if CRC_CLEAN in selected:
        yield from _report(context, LOCAL_SEGMENTS, CRC_CLEAN.name, _crc_clean_verdicts(keys))
    if not selected & {LOCAL_INDEXES_WHOLE, OFFSET_INVARIANTS, REMOTE_SEGMENTS_IN_BUCKET, NO_UNCOPIED_SEGMENT_LOST, COPY_COMPLETED}:
        return
    located = _Located(kafka_log_dirs, keys)
    if LOCAL_INDEXES_WHOLE in selected:
        yield from _report(context, LOCAL_SEGMENTS, LOCAL_INDEXES_WHOLE.name, located.verdicts(_local_indexes_whole))
    if not selected & {OFFSET_INVARIANTS, REMOTE_SEGMENTS_IN_BUCKET, NO_UNCOPIED_SEGMENT_LOST, COPY_COMPLETED}:
        return
    records = _latest_records(context.instance, REMOTE_SEGMENTS, keys)
    store = metadata_store.store()
    if OFFSET_INVARIANTS in selected:
        follower_role = _follower_roles(kafka_log_dirs)
        yield from _report(context, REMOTE_SEGMENTS, OFFSET_INVARIANTS.name,
                           located.verdicts_with_views(store, lambda loc, view: _offset_invariants(loc, view, follower_role(loc))),
                           records=records)
    if REMOTE_SEGMENTS_IN_BUCKET in selected:
        storage = remote_tier.storage()
        looks = RoutineLooks(store, storage)
        yield from _report(context, REMOTE_SEGMENTS, REMOTE_SEGMENTS_IN_BUCKET.name,
                           located.verdicts_with_views(
                               store, lambda loc, view: _remote_segments_in_bucket(loc, store, storage, view, looks),
                               looks=looks),
                           records=records)
    if NO_UNCOPIED_SEGMENT_LOST in selected:
        topic_configs = store.all_topic_configs()
        yield from _report(context, REMOTE_SEGMENTS, NO_UNCOPIED_SEGMENT_LOST.name,
                           located.verdicts(lambda loc: _no_uncopied_segment_lost(
                               loc, store, topic_configs, look=loc.key not in looked_for_lost_ranges)), records=records)
    if COPY_COMPLETED in selected:
        verdicts = located.verdicts(_pass_completed(records, flag="copy_failed", error="copy_error", what="copy"))
        yield from _report(context, REMOTE_SEGMENTS, COPY_COMPLETED.name, verdicts, records=records)
        _shown_failed(context, REMOTE_SEGMENTS, verdicts)


def _follower_roles(kafka_log_dirs: KafkaLogDirsResource) -> Callable[[LocatedPartition], str | None]:
    """The role of this broker's replica of each partition when it does not copy it (a follower's),
    else None; an unreadable metadata log judges every replica as the copier (the copy step names
    the error)."""
    from kts_resources.kafka.errors import KafkaFormatError
    from kts_resources.tiering.leadership import broker_replicas

    try:
        replicas = broker_replicas(kafka_log_dirs.paths(), settings.metadata_log_dir())
    except (KafkaFormatError, ValueError):
        return lambda loc: None

    def role(loc: LocatedPartition) -> str | None:
        tp = loc.partition.topic_partition
        return replicas.role(tp) if replicas.copy_refusal(tp) is not None else None

    return role


def _shown_failed(context: dg.AssetExecutionContext, asset_key: dg.AssetKey, verdicts: dict[str, Verdict]) -> None:
    """The partitions of ``asset_key`` whose RUN_FAILING_CHECKS check just failed are shown failed
    once the run fails, though the ranged step's output materialised them with the others: their
    materialisation is planned again after it (``dagster_internals.plan_materialization_again``)."""
    failed = sorted(key for key, (passed, _, _) in verdicts.items() if not passed)
    if failed:
        plan_materialization_again(context, asset_key, failed)


def _pass_completed(records: dict[str, dg.EventLogRecord], *, flag: str, error: str, what: str) -> Callable[[LocatedPartition], Verdict]:
    """The judge of a RUN_FAILING_CHECKS check that the partition's latest materialisation (in
    ``records``) did not set ``flag``; failing, it names the ``error`` the asset recorded."""

    def judge(loc: LocatedPartition) -> Verdict:
        record = records.get(loc.key)
        if record is None or record.asset_materialization is None:
            return True, {flag: 0}, f"no {what} pass recorded yet"
        metadata = record.asset_materialization.metadata
        failed = metadata.get(flag)
        if failed is None or not failed.value:
            return True, {flag: 0, "run_id": record.run_id}, f"the {what} pass completed"
        cause = metadata.get(error)
        return False, {flag: 1, "run_id": record.run_id}, one_line(cause.value if cause is not None else f"the {what} pass failed")

    return judge


REMOTE_INDEX_COVERS = dg.AssetCheckKey(REMOTE_LOG_INDEX, "remote_log_index_covers_finished_segments")
RETENTION_COMPLETED = dg.AssetCheckKey(RETENTION_STATE, "retention_completed")

REMOTE_INDEX_CHECK_SPECS = [
    dg.AssetCheckSpec(REMOTE_INDEX_COVERS.name, asset=REMOTE_LOG_INDEX, partitions_def=topic_partitions,
                      description="Every COPY_SEGMENT_FINISHED segment is covered by the remote log index exactly once, its "
                                  "entries contiguous from the segment's start to its end offset; every entry's CRC holds and "
                                  "both indexes point at entries."),
]

RETENTION_CHECK_SPECS = [
    # Fails the run at its end, not its step (RUN_FAILING_CHECKS).
    dg.AssetCheckSpec(RETENTION_COMPLETED.name, asset=RETENTION_STATE, partitions_def=topic_partitions,
                      description="The partition's latest retention pass completed: its plan was made and every deletion it "
                                  "asked for went through. Otherwise it fails with the cause, and its run fails once the "
                                  "other partitions have been through the remote log index."),
]

# The checks a failure of which fails the run (at its end: kts_assets.assets.steps.end_step) and
# shows the partition failed: a pass over the partition did not complete.
RUN_FAILING_CHECKS = frozenset({COPY_COMPLETED, RETENTION_COMPLETED})


def remote_index_checks(context: dg.AssetExecutionContext, kafka_log_dirs: KafkaLogDirsResource,
                        metadata_store: MetadataStoreResource) -> Iterator:
    """The results of REMOTE_INDEX_CHECK_SPECS if the step runs them, for its partitions."""
    if REMOTE_INDEX_COVERS not in context.selected_asset_check_keys:
        return
    store = metadata_store.store()
    home = settings.kts_home()

    def judge(loc: LocatedPartition, view: PartitionView) -> Verdict:
        tip, finished = view.tip, view.finished
        if tip is None or not finished:
            return True, {"indexed_segments": 0}, "nothing remote"
        problems, entries = check_partition_index(index_cache.cache_directory(home, tip), finished)
        metadata = {"indexed_segments": len(finished), "index_entries": entries, "problems": len(problems)}
        return not problems, metadata, "; ".join(problems[:5]) or f"{counted(len(finished), 'segment')} covered by {counted(entries, 'entry', 'entries')}"

    yield from _report(context, REMOTE_LOG_INDEX, REMOTE_INDEX_COVERS.name,
                       _Located(kafka_log_dirs, _partition_keys(context)).verdicts_with_views(store, judge))


def retention_checks(context: dg.AssetExecutionContext, kafka_log_dirs: KafkaLogDirsResource) -> Iterator:
    """The results of RETENTION_CHECK_SPECS if the step runs them, for its partitions."""
    if RETENTION_COMPLETED not in context.selected_asset_check_keys:
        return
    keys = _partition_keys(context)
    records = _latest_records(context.instance, RETENTION_STATE, keys)
    judge = _pass_completed(records, flag="retention_failed", error="retention_error", what="retention")
    verdicts = _per_partition(kafka_log_dirs, keys, judge)
    yield from _report(context, RETENTION_STATE, RETENTION_COMPLETED.name, verdicts, records=records)
    _shown_failed(context, RETENTION_STATE, verdicts)


def checks_that_must_run(checks: Iterator, what: str) -> Iterator:
    """``checks``' results; a check that cannot run (an exception, not a failed verdict) fails the
    step without a retry: the asset is reported, and a retry would do its work again for nothing."""
    try:
        yield from checks
    except Exception as e:
        raise dg.Failure(description=f"the checks of {what} could not run: {type(e).__name__}: {e}",
                         allow_retries=False) from e
