"""Sensors: partition discovery (``discovery``), the segment roll sensor (``roll``) and the
dead-run sensor (``dead_runs``), the retention sensor (``retention``), the index-rebuild sensor (``index_rebuild``), the topic deletion sensor (``topic_deletion``); the per-partition cursor codec they and later sensors share is
``cursor``."""

from kts_assets.sensors.dead_runs import dead_run_sensor
from kts_assets.sensors.discovery import partition_discovery_sensor
from kts_assets.sensors.index_rebuild import index_rebuild_sensor
from kts_assets.sensors.retention import retention_sensor
from kts_assets.sensors.roll import segment_roll_sensor
from kts_assets.sensors.topic_deletion import topic_deletion_sensor

sensors = [partition_discovery_sensor, segment_roll_sensor, retention_sensor, index_rebuild_sensor, dead_run_sensor, topic_deletion_sensor]

__all__ = ["dead_run_sensor", "index_rebuild_sensor", "partition_discovery_sensor", "retention_sensor", "segment_roll_sensor", "sensors", "topic_deletion_sensor"]
