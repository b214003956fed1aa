"""The retention sensor's tick without Spark: what its skip reason says when nothing expires, and
its cursor, which names a state kept in the instance instead of carrying thousands of due times.
(Runs it requests, and expiry itself, are in tests/test_retention_asset.py.)"""

from __future__ import annotations

import json
import time

import dagster as dg
import pytest

from kts_assets.partitions import topic_partitions
from kts_assets.sensors.cursor import sensor_state
from kts_assets.sensors.retention import SENSOR_NAME, _decode, _encode, retention_sensor
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.copier import copy_partition

DAY_MS = 86_400_000


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def _tick(instance, log_dir, pg_url, cursor=None):
    resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir)),
                 "metadata_store": MetadataStoreResource(database_url=pg_url)}
    with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
        return retention_sensor.evaluate_tick(context)


@pytest.fixture
def copied(tmp_path, pg_url, instance):
    """orders-0 and orders-1 simulated, registered and copied to a directory tier."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=4, topics=("orders",), partitions=2, total_bytes=64 * 1024, segment_bytes=8 * 1024))
    store = MetadataStoreResource(database_url=pg_url).store()
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    partitions = LogDir(log_dir).partitions()
    for partition in partitions:
        assert copy_partition(partition, LogDir(log_dir), store, storage).copied
    instance.add_dynamic_partitions(topic_partitions.name, sorted(p.topic_partition.dir_name for p in partitions))
    return log_dir, store


def test_with_infinite_retention_the_skip_reason_says_what_was_planned_and_that_nothing_is_due(copied, pg_url, instance):
    log_dir, store = copied
    store.set_topic_config("orders", "retention.ms", -1)
    first = _tick(instance, log_dir, pg_url)
    assert first.run_requests == []
    assert first.skip_message == ("first tick: planned all 2 known partitions: none has anything to expire; "
                                  "no partition has a remote segment under a finite retention.ms")


def test_an_idle_tick_names_the_events_it_read_and_the_partition_due_next(copied, pg_url, instance):
    log_dir, store = copied
    store.set_topic_config("orders", "retention.ms", 3650 * DAY_MS)
    first = _tick(instance, log_dir, pg_url)
    assert first.run_requests == [] and "first tick: planned all 2 known partitions: none has anything to expire" in first.skip_message
    assert "; next due: orders-" in first.skip_message and " UTC" in first.skip_message
    second = _tick(instance, log_dir, pg_url, cursor=first.cursor)
    assert second.skip_message.startswith("planned 0 of 2 known partitions (those named by no new store event, "
                                          "and 0 whose oldest remote segment passed retention.ms): none has anything to expire")


def test_the_cursor_over_4000_partitions_stays_short_and_an_inline_cursor_from_before_is_read(tmp_path, pg_url, instance):
    keys = [f"events-{p}" for p in range(4000)]
    instance.add_dynamic_partitions(topic_partitions.name, keys)
    later = int(time.time() * 1000) + 30 * DAY_MS
    due = {key: later + i for i, key in enumerate(keys)}
    inline = _encode(0, due, set())  # the cursor as it was written before: ~130 KB
    assert len(inline) > 100_000
    tick = _tick(instance, tmp_path, pg_url, cursor=inline)
    assert tick.run_requests == []
    assert len(tick.cursor) < 100, tick.cursor
    assert json.loads(tick.cursor)["partitions"] == 4000
    _event, kept, _seen = _decode(sensor_state(instance, SENSOR_NAME, tick.cursor))
    assert kept == due
    assert "next due: events-0 at " in tick.skip_message
    again = _tick(instance, tmp_path, pg_url, cursor=tick.cursor)
    assert again.cursor == tick.cursor  # nothing changed: the same state, the same cursor


def test_a_tick_plans_at_most_its_share_and_the_partitions_left_over_are_planned_on_the_next_tick(copied, pg_url, instance,
                                                                                                    monkeypatch):
    log_dir, store = copied
    store.set_topic_config("orders", "retention.ms", 3650 * DAY_MS)
    monkeypatch.setattr("kts_assets.sensors.retention.MAX_PLANS_PER_TICK", 1)
    first = _tick(instance, log_dir, pg_url)
    assert first.skip_message.startswith("first tick: planned 1 of 2 known partitions (1 of the 2 to plan wait for the "
                                         "next ticks: 1 a tick): none has anything to expire; next due: orders-1 at ")
    second = _tick(instance, log_dir, pg_url, cursor=first.cursor)
    assert second.skip_message.startswith("planned 1 of 2 known partitions")
    _event, due, _seen = _decode(sensor_state(instance, SENSOR_NAME, second.cursor))
    in_a_year = int(time.time() * 1000) + 365 * DAY_MS
    assert sorted(due) == ["orders-0", "orders-1"] and all(at > in_a_year for at in due.values()), due
