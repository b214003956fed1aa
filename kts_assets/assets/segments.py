"""``local_segments``: Spark's inventory of every local segment of the run's partitions.

Where partitions are and what their offsets are comes from ``kts_resources.tiering.tiers``; where the
inventory is kept and how it is swapped in, from ``kts_resources.spark.inventory``.
"""

import shutil
from dataclasses import dataclass

import dagster as dg

from kts_assets.asset_keys import LOCAL_SEGMENTS
from kts_assets.assets.reporting import OWNERS, local_metadata, record_run_totals
from kts_assets.dagster_internals import add_partition_metadata
from kts_assets.partition_outcome import fail_if_no_partition_is_found
from kts_assets.sizes import size_first
from kts_resources.spark.inventory import inventory_path, inventory_root, key_digest, publish, write_inventory_table
from kts_resources.kafka.errors import shown
from kts_resources.resources import KafkaLogDirsResource, KtsPySparkResource, MetadataStoreResource
from kts_resources.spark.session import inventory_schema
from kts_resources.tiering.partition_numbers import partition_numbers
from kts_resources.tiering.batch_plans import partition_views
from kts_resources.tiering.partition_view import partition_view, with_listing
from kts_resources.tiering.tiers import locate_partitions


# Bumped when the inventory's columns or meaning change (Dagster shows materialisations made by
# other code versions as out of date).
INVENTORY_CODE_VERSION = "1"


def table_schema(schema) -> dg.TableSchema:
    """A Spark ``StructType`` as the ``dagster/column_schema`` the UI shows for a table."""
    return dg.TableSchema(columns=[dg.TableColumn(field.name, field.dataType.simpleString()) for field in schema.fields])


# The spec (key, lineage) of the inventory; assets.tiering.local_and_remote_segments materialises it.
local_segments = dg.AssetSpec(
    LOCAL_SEGMENTS,
    kinds={"spark", "kafka", "parquet"},
    group_name="tiering",
    owners=OWNERS,
    code_version=INVENTORY_CODE_VERSION,
    description=(
        "Inventory of each partition's local segments (offsets, sizes, epochs, CRC status), scanned by "
        "Spark and stored as Parquet under `KTS_HOME/inventory/local_segments/TOPIC-PARTITION.parquet`. "
        "Offsets follow KIP-405: Lx = local_log_start_offset, Ly = high_watermark, Lz = log_end_offset."
    ),
)


@dataclass
class InventoryPlan:
    """What the step found before the scan, in its own thread (it logs and may rebuild indexes)."""

    keys: list[str]
    located: dict
    listed: dict
    reindexed: dict[str, int]
    run_id: str
    rescan_unchanged: bool


@dataclass
class InventoryResult:
    """What the scan found, for the step's own thread to report (the scan may run beside the copy)."""

    rows: list
    kept: int
    scanned_by_spark: bool


def prepare_inventory(context: dg.AssetExecutionContext, pyspark: KtsPySparkResource, kafka_log_dirs: KafkaLogDirsResource,
                      rescan_unchanged: bool, rebuild_indexes: bool) -> InventoryPlan:
    """Locate and list the run's partitions and, with ``rebuild_indexes``, rebuild torn local
    indexes first (they are what a copy ships); partitions not found or not listable are reported."""
    keys = list(context.partition_keys)
    located, missing = locate_partitions(kafka_log_dirs.paths(), keys, owned_log_dirs=kafka_log_dirs.owned_paths())
    fail_if_no_partition_is_found(keys, missing, kafka_log_dirs.paths())
    for key in missing:
        context.log.warning(f"{key}: in none of the log dirs ({', '.join(map(str, kafka_log_dirs.paths()))}); nothing scanned")
        add_partition_metadata(context, {"segments": 0, "local_bytes": 0, "missing": True}, asset_key=local_segments.key,
                               partition_key=key)
    listed = {}
    for key, loc in list(located.items()):
        # One partition dir that cannot be listed (permissions, a file in its place) fails alone:
        # its copy fails and names it; every other partition of the run is scanned.
        try:
            listed[key] = loc.partition.segments()
        except OSError as e:
            del located[key]
            problem = f"{shown(loc.partition.path)}: cannot be listed: {e.strerror or e}"
            context.log.error(f"{key}: {problem}")
            add_partition_metadata(context, {"segments": 0, "local_bytes": 0, "scan_error": problem}, asset_key=local_segments.key,
                                   partition_key=key)
    reindexed = _rebuild_local_indexes(context, pyspark, located, listed) if rebuild_indexes else {}
    return InventoryPlan(keys, located, listed, reindexed, context.run.run_id, rescan_unchanged)


def scan_inventory(pyspark: KtsPySparkResource, plan: InventoryPlan, *, beside_copy: bool = False) -> InventoryResult:
    """The Spark scan of what changed since the last inventory, staged as Parquet beside it. Touches
    no Dagster context, so it runs in a thread of its own while the step copies (``beside_copy``:
    see ``spark.scan_tasks``)."""
    from pyspark.sql import Row

    from kts_resources.spark.session import INVENTORY_COLUMNS, plan_inventory_scan, previous_inventory_rows

    located = plan.located
    earlier = {key: path for key in located if (path := inventory_path(key)).is_dir()}
    previous = {}
    if earlier and not plan.rescan_unchanged:
        # A row per segment, read on the driver, so only new, active-and-written or changed segments are scanned.
        previous = previous_inventory_rows(earlier.values())
    scan_plan = plan_inventory_scan([loc.partition for loc in located.values()], previous)
    if scan_plan.unchanged and len(earlier) == len(located) and len(scan_plan.kept_rows) == len(previous):
        # Not a byte written since the last inventory: it stands as it is, and no Spark job runs.
        rows = [Row(**dict(zip(INVENTORY_COLUMNS, r)), partition_key=f"{r[0]}-{r[1]}") for r in scan_plan.kept_rows]
        return InventoryResult(rows, len(rows), scanned_by_spark=False)
    rows, kept = _scan_and_write(pyspark, located, previous, _staging(plan), beside_copy)
    return InventoryResult(rows, kept, scanned_by_spark=True)


def _staging(plan: InventoryPlan):
    return inventory_root() / f".staging-{plan.run_id}"


def report_inventory(context: dg.AssetExecutionContext, plan: InventoryPlan, result: InventoryResult,
                     metadata_store: MetadataStoreResource) -> None:
    """Publish the staged inventories and report each partition (in the step's own thread), its
    offsets and eligible segments as `kts status` computes them from the local log and the
    metadata store (the log start offset kts recorded bounds what is eligible); a store that does
    not answer (the copy beside it then fails, saying so) leaves the local log's numbers alone."""
    columns = table_schema(inventory_schema())  # the columns of each partition's Parquet files
    try:
        store = metadata_store.store()
    except ConnectionError as e:
        context.log.warning(f"the inventory's offsets are the local log's alone: {e}")
        store = None
    staging = _staging(plan)
    by_key: dict[str, list] = {key: [] for key in plan.located}
    for row in result.rows:
        by_key.setdefault(row.partition_key, []).append(row)
    # Every partition's store rows a chunk of partitions per query, read now: after the copy beside
    # the scan changed them. Without a store, the local log's numbers alone.
    views = partition_views(plan.located, store, alarms=True) if store is not None else (
        (key, partition_view(loc, None)) for key, loc in plan.located.items())
    for key, view in views:
        loc = plan.located[key]
        if isinstance(view, Exception):
            raise view  # an unreadable partition.metadata, as reading it here would have raised
        seg_rows = sorted(by_key.get(key, []), key=lambda r: r.base_offset)
        staged = staging / f"partition_digest={key_digest(key)}"
        if staged.is_dir():
            publish(staged, inventory_path(key))
        segments = plan.listed[key]
        numbers = partition_numbers(with_listing(view, segments, seg_rows[-1].next_offset if seg_rows else None),
                                    exact_log_end_offset=False)
        crc_failures = sum(r.crc_failures for r in seg_rows)
        unhealthy = [r for r in seg_rows if r.health != "ok"]
        for r in unhealthy:
            context.log.error(f"{key}: segment {r.base_offset} is {r.health}"
                              + (f" ({r.crc_failures} batches fail their CRC)" if r.crc_failures else ""))
        local = local_metadata(numbers)  # what a later step's observation reports again
        add_partition_metadata(context, size_first(
            {
                **local,
                "dagster/row_count": len(seg_rows),
                "dagster/column_schema": columns,
                "records": sum(r.record_count for r in seg_rows),
                "crc_failures": crc_failures,
                "unhealthy_segments": len(unhealthy),
                "owned_log_dir": loc.owned,
                **({"indexes_rebuilt": plan.reindexed[key]} if key in plan.reindexed else {}),
                "inventory": dg.MetadataValue.path(str(inventory_path(key))),
            }),
            asset_key=local_segments.key,
            partition_key=key,
        )
    discard_staging(plan)
    rows, kept = result.rows, result.kept
    how = "in one Spark job" if result.scanned_by_spark else "without a Spark job (nothing written since the last inventory)"
    context.log.info(f"inventoried {len(rows)} segments of {len(plan.located)} partitions {how}: "
                     f"{len(rows) - kept} scanned, {kept} unchanged since the last inventory")
    # Run totals go on the run, not on every partition the run materialises.
    record_run_totals(context, {"partitions_in_run": len(plan.keys), "segments_scanned": len(rows) - kept,
                                "segments_unchanged": kept})


def discard_staging(plan: InventoryPlan) -> None:
    """What a scan staged and did not publish (all of it, when the step failed after the scan)."""
    shutil.rmtree(_staging(plan), ignore_errors=True)


def _scan_and_write(pyspark: KtsPySparkResource, located: dict, previous: dict, staging,
                    beside_copy: bool) -> tuple[list, int]:
    """The Spark inventory of the run's partitions (rows kept from ``previous`` where nothing
    changed), collected and written on the driver as one Parquet directory per partition under
    ``staging`` (named by the key's digest, never the key itself, which a 249-character topic makes
    longer than a file name may be); its rows (with partition_key) and how many were kept."""
    from pyspark.sql import Row
    from pyspark.sql.pandas.types import to_arrow_schema

    from kts_resources.spark.session import inventory_schema, segment_inventory

    with pyspark.server_loss_as_failure():
        inventory, kept = segment_inventory(pyspark.spark_session, [loc.partition for loc in located.values()], previous,
                                            beside_copy=beside_copy)
        collected = inventory.collect()
    schema = to_arrow_schema(inventory_schema())
    by_key: dict[str, list[dict]] = {}
    for row in collected:
        by_key.setdefault(f"{row.topic}-{row.partition}", []).append(row.asDict())
    rows = []
    for key, records in by_key.items():
        records.sort(key=lambda r: r["base_offset"])
        write_inventory_table(staging / f"partition_digest={key_digest(key)}", records, schema)
        rows += [Row(**record, partition_key=key) for record in records]
    return rows, kept


def _rebuild_local_indexes(context: dg.AssetExecutionContext, pyspark: KtsPySparkResource,
                           located: dict, listed: dict) -> dict[str, int]:
    """Rebuild the indexes of closed segments that need it, in owned log dirs only (a broker's
    live files are reported, never written); per partition, how many segments were reindexed."""
    from kts_resources.maintenance.local_indexes import segments_to_reindex
    from kts_resources.spark.index_job import rebuild_local_indexes_job

    paths, owner = [], {}
    for key, loc in located.items():
        for segment, problems in segments_to_reindex(listed[key]):
            if not loc.owned:
                context.log.warning(f"{key}: {problems[0]}; not rebuilt: the log dir is the broker's (KTS_OWNED_LOG_DIRS)")
                continue
            paths.append(str(segment.log))
            owner[str(segment.log)] = key
    with pyspark.server_loss_as_failure():
        results = rebuild_local_indexes_job(pyspark.spark_session, paths)
    rebuilt: dict[str, int] = {key: 0 for key, loc in located.items() if loc.owned}
    for path, error in results:
        if error is None:
            rebuilt[owner[path]] += 1
        else:
            context.log.error(f"{owner[path]}: {path}: indexes not rebuilt: {error}")
    if paths:
        context.log.info(f"rebuilt the indexes of {sum(rebuilt.values())} of {len(paths)} segments")
    return rebuilt

