"""Spark's segment inventory: on a Spark Connect session (the test session's server) and on a
classic local session (Java 17, as .ci/setup installs it) alike, the scan of every segment of a
simulated log dir runs in parallel and agrees, row for row, with kts's own reader — CRC failures
included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kts_resources.kafka.logdir import discover_partitions
from kts_resources.kafka.segment import summarize_segment
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.spark.session import (
    CLASSIC,
    INVENTORY_COLUMNS,
    balanced_groups,
    build_spark_session,
    plan_inventory_scan,
    previous_inventory_rows,
    read_inventory,
    segment_inventory,
    spark_mode,
    scan_tasks,
    task_slots,
)
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)


@pytest.fixture(scope="module")
def spark(spark_connect_url):
    # PySpark allows one kind of session per process: Spark Connect (the session's server), or
    # classic when KTS_SPARK_MASTER says so (test_the_inventory_agrees_on_a_classic_session_too).
    return build_spark_session("kts-tests")


@pytest.fixture
def log_dir(tmp_path):
    simulate(tmp_path, SimulationConfig(seed=4, topics=("orders", "page.views"), partitions=2,
                                         total_bytes=400 * 1024, segment_bytes=32 * 1024))
    return tmp_path


def test_inventory_has_one_row_per_segment_matching_the_reader(spark, log_dir):
    partitions = discover_partitions(log_dir)
    rows = segment_inventory(spark, partitions)[0].collect()
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
    rows = segment_inventory(spark, [partition])[0].where("health != 'ok'").collect()
    assert [(r.base_offset, r.health, r.crc_failures) for r in rows] == [(0, "corrupt", 1)]


def test_an_empty_selection_gives_an_empty_frame(spark):
    assert segment_inventory(spark, [])[0].count() == 0


def test_closed_segments_unchanged_since_the_last_scan_keep_their_rows_and_are_not_read(spark, log_dir):
    partitions = discover_partitions(log_dir)
    first, kept = segment_inventory(spark, partitions)
    assert kept == 0
    previous = {row.path: row for row in first.collect()}
    closed = [s for p in partitions for s in p.segments() if not s.active]
    # Corrupt a closed segment behind the scan's back, keeping its size and modification time:
    # a row kept from the last scan still says "ok", so the file was not read again.
    victim = closed[0].log
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    again, kept = segment_inventory(spark, partitions, previous)
    assert kept == len(previous)  # every segment, the active ones too: none was written since
    assert sorted(tuple(r) for r in again.collect()) == sorted(tuple(r) for r in previous.values())


def test_new_active_or_changed_segments_are_scanned_again(spark, log_dir):
    partitions = discover_partitions(log_dir)
    first, _ = segment_inventory(spark, partitions)
    previous = {row.path: row for row in first.collect()}
    victim = next(s for s in partitions[0].segments() if not s.active).log
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))  # a new modification time: rescanned, and the damage shows
    simulate(log_dir, SimulationConfig(seed=4, topics=("orders", "page.views"), partitions=2,
                                       total_bytes=100 * 1024, segment_bytes=32 * 1024))  # appends and rolls
    partitions = discover_partitions(log_dir)
    again, kept = segment_inventory(spark, partitions, previous)
    rows = again.collect()
    unchanged = [s for p in partitions for s in p.segments()
                 if str(s.log) in previous and previous[str(s.log)].active == s.active and s.log != victim
                 and (previous[str(s.log)].size_bytes, previous[str(s.log)].mtime_ns) == (s.log.stat().st_size, s.log.stat().st_mtime_ns)]
    assert kept == len(unchanged) and len(rows) == sum(len(p.segments()) for p in partitions)
    assert [(r.path, r.health) for r in rows if r.health != "ok"] == [(str(victim), "corrupt")]


def test_the_inventory_agrees_on_a_classic_session_too(tmp_path):
    """This module again, in a process of its own on a classic local[2] session (KTS_SPARK_MASTER)."""
    if spark_mode() == CLASSIC:
        pytest.skip("this is the classic run itself")
    env = {**os.environ, "KTS_SPARK_MASTER": "local[2]"}
    env.pop("KTS_SPARK_REMOTE", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'classic'}",
                          __file__], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-3000:]
    others = sum(1 for name in globals() if name.startswith("test_")) - 1  # every test but this one
    assert f"{others} passed, 1 skipped" in run.stdout


class _ListedEarlier:
    """A partition as it was listed a moment ago (the broker may delete a segment since)."""

    def __init__(self, partition):
        self.topic, self.partition, self._segments = partition.topic, partition.partition, partition.segments()

    def segments(self):
        return self._segments


def test_a_segment_gone_since_it_was_listed_gets_an_unreadable_row_and_the_rest_are_scanned(spark, log_dir):
    """Broker retention deletes segments while kts scans: that one segment's row says it could not
    be read; the job, and every other segment and partition, goes on."""
    partitions = [_ListedEarlier(p) for p in discover_partitions(log_dir)]
    gone = partitions[0].segments()[0]
    gone.log.unlink()
    rows = segment_inventory(spark, partitions)[0].collect()
    assert len(rows) == sum(len(p.segments()) for p in partitions)
    [bad] = [r for r in rows if r.health != "ok"]
    assert (bad.topic, bad.partition, bad.base_offset) == (partitions[0].topic, partitions[0].partition, gone.base_offset)
    assert bad.health.startswith("unreadable: ") and "\n" not in bad.health and bad.size_bytes == 0


def test_an_active_segment_keeps_its_row_until_it_is_appended_to_or_rolls(spark, log_dir):
    partitions = discover_partitions(log_dir)
    first, _ = segment_inventory(spark, partitions)
    previous = {row.path: row for row in first.collect()}
    plan = plan_inventory_scan(partitions, previous)
    assert plan.unchanged and len(plan.kept_rows) == len(previous)  # nothing written since: no Spark job needed
    active = next(s for s in partitions[0].segments() if s.active)
    with open(active.log, "ab") as f:
        f.write(b"\0" * 12)  # an append (a partial batch as a broker mid-write leaves it)
    plan = plan_inventory_scan(partitions, previous)
    assert [scan[2] for scan in plan.scans] == [str(active.log)] and not plan.unchanged


def test_the_driver_reads_a_stored_inventory_as_spark_does(spark, log_dir, tmp_path):
    partitions = discover_partitions(log_dir)
    first, _ = segment_inventory(spark, partitions)
    first.write.parquet(str(tmp_path / "inventory.parquet"))
    by_spark = {row.path: row for row in read_inventory(spark, [tmp_path / "inventory.parquet"]).collect()}
    assert previous_inventory_rows([tmp_path / "inventory.parquet"]) == by_spark


def test_segments_are_scanned_in_a_few_tasks_of_about_equal_bytes():
    # A Python task costs ~50 ms before it reads a byte: a task per segment made a 24-segment
    # inventory 2.5 s where two tasks of 12 take 1.2 s.
    sizes = [64] * 16 + [32] * 8
    groups = balanced_groups(sizes, 4)
    assert sorted(i for g in groups for i in g) == list(range(24))  # every scan once
    assert [sum(sizes[i] for i in g) for g in groups] == [320] * 4
    assert balanced_groups([5, 1, 1], 8) == [[0], [1], [2]]  # never more groups than scans, none empty
    assert balanced_groups([7, 6, 5, 4, 3], 2) in ([[0, 3, 4], [1, 2]], [[1, 2], [0, 3, 4]])
    assert balanced_groups([], 4) == []


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:
    def __init__(self, **values):
        self.conf = _Conf({k.replace("_", "."): v for k, v in values.items()})


def test_a_local_session_runs_as_many_tasks_at_once_as_its_threads_and_a_cluster_says_or_is_unknown(spark):
    assert task_slots(_Session(spark_master="local[3]")) == 3
    assert task_slots(_Session(spark_master="local[4,2]")) == 4
    assert task_slots(_Session(spark_master="local")) == 1
    assert task_slots(_Session(spark_master="local[*]")) == os.cpu_count()
    assert task_slots(_Session(spark_master="spark://cluster:7077")) is None
    assert task_slots(_Session(spark_master="yarn", spark_default_parallelism="48")) == 48
    # The test session's own master, read through the session (Connect or classic alike).
    master = spark.conf.get("spark.master")
    assert task_slots(spark) == task_slots(_Session(spark_master=master)) and master.startswith("local")


def test_a_scan_beside_a_copy_leaves_the_copy_one_core_of_a_local_session_and_a_cluster_all_it_has():
    assert scan_tasks(_Session(spark_master="local[2]"), 24) == 2
    assert scan_tasks(_Session(spark_master="local[2]"), 24, beside_copy=True) == 1
    assert scan_tasks(_Session(spark_master="local[8]"), 24, beside_copy=True) == 7
    assert scan_tasks(_Session(spark_master="local"), 24, beside_copy=True) == 1  # never none
    # Executors elsewhere do not share this machine's cores with the copy.
    assert scan_tasks(_Session(spark_master="spark://cluster:7077"), 24, beside_copy=True) == 24
    assert scan_tasks(_Session(spark_master="yarn", spark_default_parallelism="48"), 24, beside_copy=True) == 48


def test_a_scan_beside_a_copy_finds_the_same_rows(spark, log_dir):
    partitions = discover_partitions(log_dir)
    alone = sorted(segment_inventory(spark, partitions)[0].collect(), key=lambda r: r.path)
    beside = sorted(segment_inventory(spark, partitions, beside_copy=True)[0].collect(), key=lambda r: r.path)
    assert beside == alone and len(alone) > 2
