"""Many partitions planned from a few store queries (``tiering.batch_plans``, the store's
``*_of`` reads): the batched views and retention plans are the per-partition ones, over a mixed
set of partitions (retention due, nothing due, a topic kts never saw with and without
partition.metadata, a partition.metadata that cannot be read, a topic without partition.metadata); and a sensor tick's store statements do not
grow with the partitions it plans."""

from __future__ import annotations

import time

import dagster as dg
import sqlalchemy as sa

from kts_assets.partitions import topic_partitions
from kts_assets.sensors.index_rebuild import index_rebuild_sensor
from kts_assets.sensors.retention import retention_sensor
from kts_resources.kafka.logdir import LogDir
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource
from kts_resources.tiering.batch_plans import partition_views, retention_plans
from kts_resources.tiering.expiry import plan_partition
from kts_resources.tiering.partition_numbers import partition_numbers
from kts_resources.tiering.partition_view import partition_view
from kts_resources.tiering.status import status_rows_and_lost
from kts_resources.tiering.tiers import locate_partitions, log_dir_partitions, topic_id_partition
from tests.simulated_copies import copied_world

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def _one_by_one(located, store, now_ms):
    """What the sensor did before: each partition's topic id and plan on its own."""
    out = {}
    for key, loc in located.items():
        try:
            tip = topic_id_partition(loc.partition, store)
            out[key] = None if tip is None else plan_partition(loc, tip, store, now_ms=now_ms)
        except Exception as e:  # noqa: BLE001 - compared by type and text
            out[key] = e
    return out


def _comparable(outcome):
    return (type(outcome).__name__, str(outcome)) if isinstance(outcome, Exception) else outcome


def test_batched_retention_plans_equal_the_per_partition_plans_over_a_mixed_set_of_partitions(tmp_path, metadata_store):
    store = metadata_store
    log_dir = copied_world(tmp_path, store, ("orders", "audit", "fresh", "legacy", "broken"), 2,
                            copy_topics=("orders", "audit", "legacy", "broken"))
    store.set_topic_config("orders", "retention.ms", 1)  # every closed segment past retention: work to do
    store.set_topic_config("audit", "retention.ms", -1)  # nothing ever due
    (log_dir / "legacy-1" / "partition.metadata").unlink()  # a topic from before topic ids: the store's id by name
    (log_dir / "fresh-1" / "partition.metadata").unlink()  # nor id nor name known: nothing of it can be remote
    (log_dir / "broken-0" / "partition.metadata").write_text("version: 0\ntopic_id: not-a-uuid\n")
    keys = sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions())
    located, _ = locate_partitions([log_dir], keys)
    now_ms = int(time.time() * 1000)

    expected = _one_by_one(located, store, now_ms)
    assert expected["orders-0"].has_work and not expected["audit-0"].has_work
    assert "'fresh' is not known to the metadata store" in str(expected["fresh-0"]) and expected["fresh-1"] is None
    assert isinstance(expected["broken-0"], Exception)
    assert expected["legacy-1"].tip.topic_id == store.topic_id("legacy")
    for chunk in (1, 3, 1000):  # the store's rows read a chunk of partitions per query
        batched = dict(retention_plans(located, store, now_ms=now_ms, chunk=chunk))
        assert list(batched) == keys
        assert {k: _comparable(v) for k, v in batched.items()} == {k: _comparable(v) for k, v in expected.items()}, chunk


def test_batched_views_hold_each_partitions_own_store_rows(tmp_path, metadata_store):
    store = metadata_store
    log_dir = copied_world(tmp_path, store, ("orders", "fresh"), 3, copy_topics=("orders",))
    keys = sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions())
    located, _ = locate_partitions([log_dir], keys)
    views = dict(partition_views(located, store, chunk=2))
    for key, loc in located.items():
        alone = partition_view(loc, store)
        assert views[key].tip == alone.tip
        assert views[key].state == alone.state and views[key].finished == alone.finished, key
        assert views[key].log_start_offset == alone.log_start_offset and views[key].spans == alone.spans
    assert views["fresh-0"].finished == [] and views["fresh-0"].highest_copied_offset == -1  # never copied
    assert all(views[f"orders-{p}"].finished for p in range(3))
    tips = [views[k].tip for k in keys if views[k].tip is not None]
    assert store.finished_segments_of(tips) == {t: store.list_remote_log_segments(t, states={FINISHED}) for t in tips}
    assert store.partition_states_of(tips) == {t: store.partition_state(t) for t in tips}
    assert store.finished_segments_of([]) == {} and store.partition_states_of([]) == {}


def test_views_with_alarms_give_each_partitions_numbers_as_read_alone_in_a_few_queries(tmp_path, metadata_store, pg_url):
    """The copy step and the inventory report every partition's numbers (lost ranges and damaged
    segments among them) from views read a chunk of partitions per query: the same numbers as
    ``kts status`` reads for each alone."""
    store = metadata_store
    log_dir = copied_world(tmp_path, store, ("orders", "fresh"), 3, copy_topics=("orders",))
    keys = sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions())
    located, _ = locate_partitions([log_dir], keys)
    orders_0, orders_2 = (topic_id_partition(located[k].partition, store) for k in ("orders-0", "orders-2"))
    store.record_lost_range(orders_0, 3, 5, "test")
    store.record_lost_range(orders_0, 9, 9, "test")
    store.record_lost_range(orders_2, 1, 2, "test")
    store.acknowledge_lost_range(orders_2, 1, 2, by="test")  # acknowledged: no longer reported
    damaged = store.list_remote_log_segments(orders_2, states={FINISHED})[0]
    store.record_segment_damage(damaged.segment_id, "a flipped bit")

    def numbers(views):
        return {key: partition_numbers(view, exact_log_end_offset=False).as_dict() for key, view in views}

    alone = numbers((key, partition_view(loc, store)) for key, loc in located.items())
    assert alone["orders-0"]["lost_ranges"] == [[3, 5], [9, 9]] and alone["orders-2"]["lost_ranges"] == []
    assert alone["orders-2"]["damaged_remote_segments"] == 1 and alone["orders-1"]["damaged_remote_segments"] == 0
    for chunk in (2, 1000):
        assert numbers(partition_views(located, store, chunk=chunk, alarms=True)) == alone, chunk
    read = {}
    for size in (2, 6):  # the same statements for three times the partitions
        subset = dict(list(located.items())[:size])
        read[size] = _store_statements(pg_url, lambda subset=subset: numbers(partition_views(subset, store, alarms=True)))
    assert read[2] == read[6] <= 6, read


def test_status_rows_read_the_store_a_chunk_of_partitions_at_a_time_with_each_partitions_own_numbers(
        tmp_path, metadata_store, pg_url, monkeypatch):
    """`kts status` and the end of `kts sync` list every partition's numbers: the same as read for
    each alone, in as many store statements for three partitions as for nine."""
    store = metadata_store
    read = {}
    for partitions in (1, 3):
        world = tmp_path / f"world-{partitions}"
        log_dir = copied_world(world, store, (f"orders{partitions}", f"fresh{partitions}", f"clicks{partitions}"),
                               partitions, copy_topics=(f"orders{partitions}", f"clicks{partitions}"))
        monkeypatch.setenv("KTS_LOG_DIRS", str(log_dir))
        orders_0 = topic_id_partition(next(p for p in LogDir(log_dir).partitions() if p.partition == 0
                                           and p.topic.startswith("orders")), store)
        store.record_lost_range(orders_0, 3, 5, "test")
        located = [loc for loc in log_dir_partitions([log_dir])]
        alone = sorted((loc.partition.topic, loc.partition.partition,
                        partition_numbers(partition_view(loc, store)).as_dict()["lost_ranges"]) for loc in located)
        rows = status_rows_and_lost(store)
        assert sorted((row["topic"], row["partition"], row["lost_ranges"]) for row, _ in rows) == alone
        assert len(rows) == 3 * partitions and [3, 5] in next(row for row, _ in rows if row["topic"] == orders_0.topic
                                                            and row["partition"] == 0)["lost_ranges"]
        read[partitions] = _store_statements(pg_url, lambda: status_rows_and_lost(store))
    assert read[1] == read[3] <= 8, read


def _store_statements(pg_url, tick) -> int:
    """Statements sent to the metadata store's database during ``tick()`` (the test instance's
    SQLite storage is not counted)."""
    database = sa.engine.make_url(pg_url).database
    sent = []

    def count(conn, _cursor, _statement, _params, _context, _executemany):
        if conn.engine.url.database == database:
            sent.append(1)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
    try:
        tick()
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)
    return len(sent)


def test_a_ticks_store_statements_do_not_grow_with_the_partitions_it_plans(tmp_path, pg_url):
    store = MetadataStoreResource(database_url=pg_url).store()
    counts: dict[str, dict[int, int]] = {retention_sensor.name: {}, index_rebuild_sensor.name: {}}
    for partitions in (2, 8):
        topic = f"t{partitions}"
        log_dir = copied_world(tmp_path / topic, store, (topic,), partitions, copy_topics=(topic,))
        store.set_topic_config(topic, "retention.ms", -1)  # nothing to request: the tick says what it planned
        resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(log_dir)), "metadata_store": MetadataStoreResource(database_url=pg_url)}
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(topic_partitions.name, sorted(p.topic_partition.dir_name for p in LogDir(log_dir).partitions()))
            for sensor in (retention_sensor, index_rebuild_sensor):
                def tick():
                    with dg.build_sensor_context(instance=instance, resources=resources) as context:
                        result = sensor.evaluate_tick(context)
                    assert f"planned all {partitions} known" in result.skip_message or f"looked at {partitions} of {partitions} known" in result.skip_message

                counts[sensor.name][partitions] = _store_statements(pg_url, tick)
    store.close()
    for name, by_size in counts.items():
        assert by_size[2] == by_size[8] and by_size[8] <= 10, (name, by_size)
