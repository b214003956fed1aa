"""``local_segments``: Spark's inventory of every local segment of the run's partitions.

Besides the asset, this module holds what the copy asset and the checks share: finding a
partition key's directory in the log dirs, and the offsets of a partition (Lx, Ly, Lz).
"""

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from kts_assets.partition_outcome import fail_if_no_partition_is_found
from kts_assets.partitions import topic_partitions
from kts_resources import settings
from kts_resources.copier import copy_candidates
from kts_resources.kafka.logdir import LogDir, PartitionDir, SegmentFiles, parse_partition_dir_name
from kts_resources.resources import KafkaLogDirsResource, KtsPySparkResource


@dataclass(frozen=True)
class LocatedPartition:
    """A partition key's directory, the log dir holding it, and whether kts owns that dir."""

    key: str
    log_dir: LogDir
    partition: PartitionDir
    owned: bool


def locate_partitions(kafka_log_dirs: KafkaLogDirsResource, keys: list[str]) -> tuple[dict[str, LocatedPartition], list[str]]:
    """(key → where it is, keys found in no log dir). The first log dir holding a key wins, as in
    the discovery sensor."""
    located: dict[str, LocatedPartition] = {}
    missing: list[str] = []
    log_dirs = [LogDir(p) for p in kafka_log_dirs.paths() if p.is_dir()]
    for key in keys:
        tp = parse_partition_dir_name(key)
        for log_dir in log_dirs if tp is not None else []:
            partition = log_dir.partition_dir(tp)
            if partition.path.is_dir():
                located[key] = LocatedPartition(key, log_dir, partition, kafka_log_dirs.is_owned(log_dir.path))
                break
        else:
            missing.append(key)
    return located, missing


@dataclass(frozen=True)
class LocalOffsets:
    """KIP-405's local offsets: Lx local log start, Ly high watermark, Lz log end (−1 unknown)."""

    checkpointed_log_start_offset: int | None  # log-start-offset-checkpoint's entry, if any
    local_log_start_offset: int  # Lx
    high_watermark: int  # Ly: what is committed; only segments wholly below it are copied
    log_end_offset: int  # Lz
    recovery_point: int

    @property
    def log_start_offset(self) -> int:
        """The broker's log start offset: checkpointed, else (as Kafka) the first segment's base offset."""
        return self.local_log_start_offset if self.checkpointed_log_start_offset is None else self.checkpointed_log_start_offset


def local_offsets(located: LocatedPartition, segments: list[SegmentFiles], next_offset_of_last: int | None) -> LocalOffsets:
    tp = located.partition.topic_partition
    first = segments[0].base_offset if segments else -1
    hw = located.log_dir.high_watermark(tp)
    rp = located.log_dir.recovery_point(tp)
    end = next_offset_of_last if next_offset_of_last is not None else (segments[-1].base_offset if segments else -1)
    return LocalOffsets(
        checkpointed_log_start_offset=located.log_dir.log_start_offset(tp),
        local_log_start_offset=first,
        high_watermark=-1 if hw is None else hw,
        log_end_offset=end,
        recovery_point=-1 if rp is None else rp,
    )


def eligible_segments(located: LocatedPartition, segments: list[SegmentFiles], offsets: LocalOffsets, highest_copied_offset: int = -1) -> list[SegmentFiles]:
    """Segments the copy rule takes (closed, wholly below min(HW, recovery point)), above
    ``highest_copied_offset``; none when what is committed is unknown."""
    if offsets.high_watermark < 0 or offsets.recovery_point < 0:
        return []
    return copy_candidates(
        segments,
        high_watermark=offsets.high_watermark,
        recovery_point=offsets.recovery_point,
        log_start_offset=max(offsets.log_start_offset, 0),
        highest_copied_offset=highest_copied_offset,
    )


def segment_bytes(segments: list[SegmentFiles]) -> int:
    total = 0
    for s in segments:
        try:
            total += s.log.stat().st_size
        except FileNotFoundError:
            pass  # deleted by the broker's retention since it was listed
    return total


def inventory_root() -> Path:
    return settings.kts_home() / "inventory" / "local_segments"


def inventory_path(key: str) -> Path:
    """``KTS_HOME/inventory/local_segments/<key>.parquet`` (a Spark Parquet directory)."""
    return inventory_root() / f"{key}.parquet"


def _publish(staged: Path, target: Path) -> None:
    """Replace ``target`` with ``staged``: readers see the old or the new inventory, never a mix."""
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)


class LocalSegmentsConfig(dg.Config):
    """Run config of ``local_segments`` (sensor and schedule runs take the defaults)."""

    # Closed segments unchanged (size, modification time) since the last inventory keep their row;
    # True rescans them too: a scrub for bit rot, which leaves both as they were.
    rescan_unchanged: bool = False


@dg.asset(
    partitions_def=topic_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    pool="spark",
    kinds={"spark", "kafka", "parquet"},
    group_name="tiering",
    description=(
        "Inventory of each partition's local segments (offsets, sizes, epochs, CRC status), scanned by "
        "Spark and stored as Parquet under KTS_HOME/inventory/local_segments/<partition>.parquet. "
        "Offsets follow KIP-405: Lx = local_log_start_offset, Ly = high_watermark, Lz = log_end_offset."
    ),
)
def local_segments(
    context: dg.AssetExecutionContext, pyspark: KtsPySparkResource, kafka_log_dirs: KafkaLogDirsResource,
    config: LocalSegmentsConfig,
) -> dg.MaterializeResult:
    from pyspark.sql import functions as F

    from kts_resources.spark import read_inventory, segment_inventory

    keys = list(context.partition_keys)
    located, missing = locate_partitions(kafka_log_dirs, keys)
    fail_if_no_partition_is_found(keys, missing, kafka_log_dirs.log_dirs)
    for key in missing:
        context.log.warning(f"{key}: in none of the log dirs {kafka_log_dirs.log_dirs!r}; nothing scanned")
        context.add_asset_metadata({"segments": 0, "local_bytes": 0, "missing": True}, partition_key=key)

    spark = pyspark.spark_session
    listed = {key: loc.partition.segments() for key, loc in located.items()}
    earlier = [path for path in map(inventory_path, located) if path.is_dir()]
    previous = {}
    if earlier and not config.rescan_unchanged:
        # One small read (a row per segment) so that only new, active or changed segments are scanned.
        previous = {row.path: row for row in read_inventory(spark, earlier).collect()}
    inventory, kept = segment_inventory(spark, [loc.partition for loc in located.values()], previous)
    inventory = inventory.withColumn("partition_key", F.concat_ws("-", F.col("topic"), F.col("partition").cast("string")))
    inventory = inventory.cache()
    rows = inventory.drop("leader_epochs", "path").collect()

    # One Spark write for the whole run, split into one Parquet directory per partition key.
    root = inventory_root()
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-{context.run.run_id}"
    if rows:
        inventory.write.mode("overwrite").partitionBy("partition_key").parquet(str(staging))
    inventory.unpersist()

    by_key: dict[str, list] = {key: [] for key in located}
    for row in rows:
        by_key.setdefault(row.partition_key, []).append(row)
    for key, loc in located.items():
        seg_rows = sorted(by_key.get(key, []), key=lambda r: r.base_offset)
        staged = staging / f"partition_key={key}"
        if staged.is_dir():
            _publish(staged, inventory_path(key))
        segments = listed[key]
        offsets = local_offsets(loc, segments, seg_rows[-1].next_offset if seg_rows else None)
        eligible = eligible_segments(loc, segments, offsets)
        crc_failures = sum(r.crc_failures for r in seg_rows)
        unhealthy = [r for r in seg_rows if r.health != "ok"]
        for r in unhealthy:
            context.log.error(f"{key}: segment {r.base_offset} is {r.health} ({r.crc_failures} batches fail their CRC)")
        context.add_asset_metadata(
            {
                "segments": len(seg_rows),
                "local_bytes": sum(r.size_bytes for r in seg_rows),
                "records": sum(r.record_count for r in seg_rows),
                "crc_failures": crc_failures,
                "unhealthy_segments": len(unhealthy),
                "log_start_offset": offsets.log_start_offset,
                "local_log_start_offset": offsets.local_log_start_offset,
                "high_watermark": offsets.high_watermark,
                "log_end_offset": offsets.log_end_offset,
                "eligible_segments": len(eligible),
                "eligible_bytes": segment_bytes(eligible),
                "owned_log_dir": loc.owned,
                "inventory": dg.MetadataValue.path(str(inventory_path(key))),
            },
            partition_key=key,
        )
    shutil.rmtree(staging, ignore_errors=True)
    context.log.info(f"inventoried {len(rows)} segments of {len(located)} partitions in one Spark job: "
                     f"{len(rows) - kept} scanned, {kept} unchanged since the last inventory")
    return dg.MaterializeResult(metadata={"partitions_in_run": len(keys), "segments_scanned": len(rows) - kept,
                                          "segments_unchanged": kept})
