"""A sensor tick's time budget (``sensors.budget``): the retention and index-rebuild ticks work
through their partitions until it is spent, and the ones left are the next tick's — none is
skipped and none planned twice in a row."""

from __future__ import annotations

import functools
import time

import dagster as dg

from kts_assets.partitions import topic_partitions
from kts_assets.sensors import index_rebuild, retention
from kts_assets.sensors.budget import within_budget
from kts_assets.sensors.cursor import sensor_state
from kts_resources.kafka.logdir import LogDir
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from tests.simulated_copies import copied_world

DAY_MS = 86_400_000


def test_within_budget_gives_at_least_its_floor_then_stops_once_the_time_is_spent():
    def slow(n):
        for i in range(n):
            time.sleep(0.01)
            yield i

    assert list(within_budget(range(5), seconds=0, at_least=2)) == [0, 1]
    assert list(within_budget(range(5), seconds=60, at_least=0)) == [0, 1, 2, 3, 4]
    taken = list(within_budget(slow(100), seconds=0.05, at_least=1))
    assert 1 <= len(taken) < 100 and taken == list(range(len(taken)))


def test_within_budget_never_asks_for_an_item_it_has_no_time_for():
    asked = []

    def partitions():  # asking for the next may cost a store query: it must not be asked in vain
        for i in range(10):
            asked.append(i)
            yield i

    assert list(within_budget(partitions(), seconds=0, at_least=3)) == [0, 1, 2]
    assert asked == [0, 1, 2]


def _out_of_time_after_one(monkeypatch, module):
    monkeypatch.setattr(module, "within_budget", functools.partial(within_budget, seconds=0, at_least=1))


def test_a_tick_out_of_time_leaves_the_rest_for_the_next_tick(tmp_path, pg_url, monkeypatch):
    store = MetadataStoreResource(database_url=pg_url).store()
    log_dir = copied_world(tmp_path, store, ("orders",), 3, copy_topics=("orders",))
    store.set_topic_config("orders", "retention.ms", 3650 * DAY_MS)
    store.close()
    resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir)), "metadata_store": MetadataStoreResource(database_url=pg_url)}
    _out_of_time_after_one(monkeypatch, retention)
    _out_of_time_after_one(monkeypatch, index_rebuild)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions()))

        def tick(sensor, cursor):
            with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
                return sensor.evaluate_tick(context)

        first = tick(retention.retention_sensor, None)
        assert first.skip_message.startswith("first tick: planned 1 of 3 known partitions (2 of the 3 to plan wait for the next "
                                             "ticks: 0.25 s of planning a tick)")
        second = tick(retention.retention_sensor, first.cursor)
        assert second.skip_message.startswith("planned 1 of 3 known partitions")
        third = tick(retention.retention_sensor, second.cursor)
        _event, due, _seen = retention._decode(sensor_state(instance, retention.SENSOR_NAME, third.cursor))
        in_a_year = int(time.time() * 1000) + 365 * DAY_MS
        assert sorted(due) == ["orders-0", "orders-1", "orders-2"] and all(at > in_a_year for at in due.values()), due

        cursor, looked = None, []
        for _ in range(4):  # one partition a tick, round and round
            result = tick(index_rebuild.index_rebuild_sensor, cursor)
            assert result.skip_message.startswith("looked at 1 of 3 known partitions")
            cursor = result.cursor
            looked.append(index_rebuild._decode(sensor_state(instance, index_rebuild.SENSOR_NAME, cursor))[0])
        assert looked == [1, 2, 0, 1]
