"""Sensors: partition discovery keeps the dynamic partitions in step with the broker log dirs."""

from __future__ import annotations

import dagster as dg

from kts_assets.partitions import topic_partitions
from kts_assets.sizes import counted
from kts_resources.resources import KafkaLogDirsResource


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Adds a partition for every TOPIC-PARTITION directory in the broker log dirs "
                       "(KTS_LOG_DIRS) and warns about partitions that left them.")
def partition_discovery_sensor(context: dg.SensorEvaluationContext, kafka_log_dirs: KafkaLogDirsResource) -> dg.SensorResult:
    """Adds a partition for every ``<topic>-<partition>`` dir in the log dirs; reports vanished ones.

    Vanished partitions are not deleted from Dagster: their history (and their remote data) outlives
    the local directory, e.g. after a partition moved to another broker.
    """
    found: dict[str, str] = {}
    discovered = kafka_log_dirs.discover()
    for log_dir, discovery in discovered:
        for partition in discovery.partitions:
            key = partition.topic_partition.dir_name
            if key in found:
                context.log.warning(f"{key} is in two log dirs: {found[key]} and {log_dir.path}; keeping the first")
                continue
            found[key] = str(log_dir.path)
        for skipped in discovery.skipped:
            context.log.debug(f"skipped {log_dir.path}/{skipped.name}: {skipped.reason}")

    known = set(context.instance.get_dynamic_partitions(topic_partitions.name))
    new_keys = sorted(set(found) - known)
    vanished = sorted(known - set(found))
    if vanished:
        context.log.warning(f"{len(vanished)} partitions no longer in any log dir: {', '.join(vanished[:20])}")
    if not new_keys:
        return dg.SensorResult(skip_reason=no_new_partitions(kafka_log_dirs, [str(d.path) for d, _ in discovered], len(found), vanished))
    context.log.info(f"adding {len(new_keys)} partitions")
    return dg.SensorResult(dynamic_partitions_requests=[topic_partitions.build_add_request(new_keys)])


def no_new_partitions(kafka_log_dirs: KafkaLogDirsResource, read: list[str], partitions: int, vanished: list[str]) -> str:
    """The skip reason: which log dirs were read, what they hold, and why nothing is added."""
    missing = sorted(str(p) for p in kafka_log_dirs.paths() if str(p) not in read)
    text = (f"no new partitions: looked at {counted(len(read), 'log dir')} ({', '.join(read) or 'none found'}), "
            f"{counted(partitions, 'partition')} there, every one already known")
    if missing:
        text += f"; not found, so not read: {', '.join(missing)} (is KTS_LOG_DIRS right?)"
    if vanished:
        text += (f"; {counted(len(vanished), 'known partition')} no longer in any log dir "
                 f"(kept for {'its' if len(vanished) == 1 else 'their'} history)")
    return text
