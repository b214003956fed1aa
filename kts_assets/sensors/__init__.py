"""Sensors: partition discovery (``discovery``) and the segment roll sensor (``roll``); the
per-partition cursor codec they and later sensors share is ``cursor``."""

from kts_assets.sensors.discovery import partition_discovery_sensor
from kts_assets.sensors.roll import segment_roll_sensor

sensors = [partition_discovery_sensor, segment_roll_sensor]

__all__ = ["partition_discovery_sensor", "segment_roll_sensor", "sensors"]
