"""Spark's segment inventory: a local[*] session (Java 17, as .ci/setup installs it) scans every
segment of a simulated log dir in parallel and agrees, row for row, with kts's own reader — CRC
failures included."""

from __future__ import annotations

import pytest

from kts_resources.kafka.logdir import discover_partitions
from kts_resources.kafka.segment import summarize_segment
from kts_resources.kafka.simulate import SimulationConfig, simulate
from kts_resources.spark import INVENTORY_COLUMNS, build_spark_session, segment_inventory


@pytest.fixture(scope="module")
def spark():
    session = build_spark_session("kts-tests", master="local[2]")
    yield session
    session.stop()


@pytest.fixture
def log_dir(tmp_path):
    simulate(tmp_path, SimulationConfig(seed=4, topics=("orders", "page.views"), partitions=2,
                                         total_bytes=400 * 1024, segment_bytes=32 * 1024))
    return tmp_path


def test_inventory_has_one_row_per_segment_matching_the_reader(spark, log_dir):
    partitions = discover_partitions(log_dir)
    rows = segment_inventory(spark, partitions).collect()
    assert tuple(rows[0].asDict()) == INVENTORY_COLUMNS
    expected = {
        (p.topic, p.partition, s.base_offset): summarize_segment(s.log, s.base_offset, active=s.active)
        for p in partitions for s in p.segments()
    }
    assert len(rows) == len(expected) > len(partitions)
    for row in rows:
        summary = expected[(row.topic, row.partition, row.base_offset)]
        assert (row.last_offset, row.next_offset, row.size_bytes, row.record_count, row.max_timestamp) == (
            summary.last_offset, summary.next_offset, summary.size_bytes, summary.record_count, summary.max_timestamp)
        assert row.leader_epochs == list(summary.leader_epochs) and row.active == summary.active
        assert row.health == "ok"


def test_a_corrupt_segment_shows_in_the_inventory(spark, log_dir):
    partition = discover_partitions(log_dir)[0]
    victim = partition.segments()[0].log
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    rows = segment_inventory(spark, [partition]).where("health != 'ok'").collect()
    assert [(r.base_offset, r.health, r.crc_failures) for r in rows] == [(0, "corrupt", 1)]


def test_an_empty_selection_gives_an_empty_frame(spark):
    assert segment_inventory(spark, []).count() == 0
