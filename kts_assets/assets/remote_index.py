"""``remote_log_index``: the seeds' remoteLogIndex / remoteOffsetIndex / remoteTimeIndex of each
partition, brought up to the store's COPY_SEGMENT_FINISHED segments after every copy.

The cache under ``KTS_HOME/remote-log-index/`` first takes the tier's current file sets; Spark reads
the batch headers of the segments still not indexed (one task per segment); then, under the
partition lock, the driver lays the entries out and publishes what changed as a new version of the
partition's file sets (``kts_resources.reading.remote_index_tier``). On a broker whose kts did not copy the
new segments, the tier's sets already cover them: nothing is read and nothing written.
"""

import uuid

import dagster as dg

from kts_assets.asset_keys import REMOTE_LOG_INDEX, tier_kind
from kts_assets.assets.copy import remote_segments
from kts_assets.dagster_internals import add_partition_metadata
from kts_assets.assets.retention import retention_state
from kts_assets.assets.reporting import OWNERS, record_run_totals
from kts_assets.assets.steps import PIPELINE_STEP, PartitionFailed, PartitionStep, end_step, for_each_partition
from kts_assets.checks import REMOTE_INDEX_CHECK_SPECS, checks_that_must_run, remote_index_checks
from kts_assets.partition_outcome import fail_if_no_partition_is_found, one_line
from kts_assets.run_hygiene import record_run_worker
from kts_assets.sizes import human_bytes
from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources import settings
from kts_resources.remote_log import RemoteStorageError
from kts_resources.remote_storage.base import stored_objects
from kts_resources.resources import KafkaLogDirsResource, KtsPySparkResource, MetadataStoreResource, RemoteTierResource
from kts_resources.tiering.batch_plans import partition_views
from kts_resources.tiering.copier import PARALLEL_PARTITIONS
from kts_resources.tiering.tiers import locate_partitions

# Bumped when the index files' layout, the RDI or where the tier keeps them change meaning
# (2: versioned file sets named by a pointer).
REMOTE_INDEX_CODE_VERSION = "2"
REMOTE_INDEX_STEP = PartitionStep(
    "the remote log index", failed_key="index_failed", error_key="index_error",
    unexpected=lambda e: PartitionFailed(f"remote log index not built: {e}", one_line(str(e))))


class RemoteLogIndexConfig(dg.Config):
    """Run config of ``remote_log_index`` (sensor and schedule runs take the defaults)."""

    chunk_bytes: int = ri.DEFAULT_CHUNK_BYTES  # an entry covers whole batches up to this many bytes
    rotate_bytes: int = ri.DEFAULT_ROTATE_BYTES  # a remoteLogIndex file is rotated past this size
    rotate_ms: int = ri.DEFAULT_ROTATE_MS  # ... or when its records span more than this much time
    rebuild: bool = False  # True: re-read every segment and lay the files out afresh


@dg.multi_asset(
    name="remote_log_index",
    specs=[dg.AssetSpec(
        REMOTE_LOG_INDEX,
        deps=[remote_segments, retention_state],  # after expiry, so deleted segments roll out at once
        kinds={"spark", tier_kind(), "postgres"},
        group_name="tiering",
        owners=OWNERS,
        code_version=REMOTE_INDEX_CODE_VERSION,
        description=(
            "The seeds' remote log index of each partition: remoteLogIndex entries (whole batches of one remote "
            "segment, 1 MiB chunks, each naming its object and byte range) with remoteOffsetIndex and "
            "remoteTimeIndex, for every COPY_SEGMENT_FINISHED segment. Built under the partition lock and published "
            "beside the segments as versioned file sets named by `remote-log-index/current`; every broker's kts "
            "keeps a copy under `KTS_HOME/remote-log-index/`, so a fetch of tiered data is one ranged GET."
        ),
    )],
    check_specs=REMOTE_INDEX_CHECK_SPECS,  # judged here once the index is reported; can run alone
    **PIPELINE_STEP,  # one run per partition range, subsettable, in the spark pool, retried (assets/steps.py)
)
def remote_log_index(
    context: dg.AssetExecutionContext,
    pyspark: KtsPySparkResource,
    kafka_log_dirs: KafkaLogDirsResource,
    metadata_store: MetadataStoreResource,
    remote_tier: RemoteTierResource,
    config: RemoteLogIndexConfig,
):
    from kts_resources.spark.index_job import EntriesTask, segment_entries_job

    record_run_worker(context)
    checks = checks_that_must_run(remote_index_checks(context, kafka_log_dirs, metadata_store), "remote_log_index")
    if REMOTE_LOG_INDEX not in context.selected_asset_keys:  # its check, run alone
        yield from checks
        end_step(context)
        return
    keys = list(context.partition_keys)
    located, missing = locate_partitions(kafka_log_dirs.paths(), keys, owned_log_dirs=kafka_log_dirs.owned_paths())
    fail_if_no_partition_is_found(keys, missing, kafka_log_dirs.paths())
    store = metadata_store.store()
    storage = remote_tier.storage()
    home = settings.kts_home()

    # What each partition has, and the segments Spark must read.
    work = {}
    tasks: list[EntriesTask] = []
    owner: list[str] = []
    # Each partition's topic id and finished segments, a chunk of partitions per store query; the
    # lock's re-read in ``publish`` still sees a segment finished since.
    for key, view in partition_views(located, store):
        if isinstance(view, Exception):
            raise view  # an unreadable partition.metadata, as reading it here would have raised
        loc, tip, finished = located[key], view.tip, view.finished
        if tip is None:
            add_partition_metadata(context, {"index_entries": 0, "indexed_segments": 0, "index_failed": 0,
                                             "note": "nothing copied yet"}, asset_key=None, partition_key=key)
            continue
        directory = index_cache.cache_directory(home, tip)
        if not config.rebuild:
            # The tier's current file sets first (another broker's kts may have built them): Spark
            # reads only the segments they and the copies' own entries do not cover.
            try:
                index_tier.sync_cache(directory, storage, tip)
                index_cache.seed_entries_from_files(directory, finished, storage)
            except (OSError, RemoteStorageError, index_tier.IndexPointerError) as e:
                context.log.warning(f"{key}: the tier's remote log index not fetched first: {e}")
        cached = set() if config.rebuild else index_cache.cached_segment_ids(directory)
        local = {s.base_offset: s.log for s in loc.partition.segments()}
        for md in finished:
            if md.segment_id.id not in cached:
                tasks.append(EntriesTask(str(md.segment_id.id), md.start_offset, md.end_offset, md.segment_size_in_bytes,
                                         storage.segment_object_keys(md)["log"],
                                         str(local[md.start_offset]) if md.start_offset in local else None,
                                         _recorded_log_crc32c(md)))
                owner.append(key)
        work[key] = (tip, finished, directory)
    for key in missing:
        context.log.warning(f"{key}: in none of the log dirs; its remote log index is not built")

    with pyspark.server_loss_as_failure():
        results = segment_entries_job(pyspark.spark_session, tasks, remote_uri=remote_tier.uri(),
                                      endpoint_url=remote_tier.endpoint_url(), chunk_bytes=config.chunk_bytes) if tasks else []
    errors: dict[str, list[str]] = {}
    for task_index, segment_id, entries, error in results:
        key = owner[task_index]
        tip, _finished, directory = work[key]
        if error is not None:
            errors.setdefault(key, []).append(f"segment {tasks[task_index].start_offset}: {error}")
            continue
        index_cache.store_segment_entries(directory, uuid.UUID(segment_id), entries)

    totals = {"entries": 0}

    def publish(key: str, partition_work) -> index_tier.IndexUpdate:
        if key in errors:
            message = "; ".join(errors[key][:5])
            raise PartitionFailed(f"remote log index not built: {message}", one_line(message))
        tip, _finished, directory = partition_work
        # Under the partition lock, from the tier's current file sets: a segment finished since
        # the listing above (another broker's copy) is read here, on the driver.
        return index_tier.update_partition_index(
            store, storage, directory, tip, lambda md: index_cache.read_segment_entries(storage, md),
            rotate_bytes=config.rotate_bytes, rotate_ms=config.rotate_ms, fresh=config.rebuild)

    def report(key: str, partition_work, update: index_tier.IndexUpdate) -> dict[str, object]:
        _tip, _finished, directory = partition_work
        build = update.build
        totals["entries"] += build.entries
        return {
            "index_entries": build.entries,
            "indexed_segments": build.segments,
            "indexed_bytes": build.bytes_indexed,
            "index_bytes": build.index_bytes,
            "index_file_sets": build.file_sets,
            "new_segments": len([t for t, k in zip(tasks, owner) if k == key]),
            "files_written": len(build.written),
            "files_removed": len(build.removed),
            "index_generation": update.pointer.generation if update.pointer is not None else 0,
            "index_files_uploaded": update.uploaded,  # 0: the tier's current file sets were already these
            "index_failed": 0,
            "size": f"{human_bytes(build.bytes_indexed)} indexed by {human_bytes(build.index_bytes)} of index",
            "index_dir": dg.MetadataValue.path(str(directory)),
        }

    # Partitions side by side, as the copy: each publish waits on its partition lock, the tier's
    # writes and their fsyncs, far more than on this process.
    failed = for_each_partition(context, REMOTE_INDEX_STEP, work, publish, report, threads=PARALLEL_PARTITIONS)
    context.log.info(f"remote log index: {len(tasks)} segments read, {totals['entries']} entries "
                     f"over {len(work)} partitions ({len(failed)} failed)")
    record_run_totals(context, {"partitions_in_run": len(keys), "index_partitions_failed": len(failed),
                                "index_segments_read": len(tasks)})
    yield dg.MaterializeResult(asset_key=REMOTE_LOG_INDEX)
    yield from checks  # judged once the index is reported
    end_step(context)  # the run's last step fails it for the partitions that failed in it


def _recorded_log_crc32c(md) -> int | None:
    try:
        recorded = stored_objects(md.custom_metadata).get("log")
    except ValueError:
        return None
    return recorded.crc32c if recorded is not None else None
