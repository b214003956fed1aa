"""One hostile partition never stops the rest: a topic name as long as Kafka allows (249
characters, so a partition key longer than Spark may name a directory after) is tiered beside a
healthy partition, through the whole `kts sync` pass (inventory in Spark, publish, copy, checks);
and, as a property, any mix of damaged partitions (a segment's .log a dangling link or a directory,
truncated mid-batch, a flipped byte, a garbage partition.metadata) beside healthy ones: each damaged
one fails alone with one error naming its file, every healthy one is tiered whole."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.spark.inventory import MAX_KEY_BYTES_IN_A_NAME, inventory_path, key_digest
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .test_sync_outcome import kts, sync_env

LONGEST_TOPIC = "t" * 249  # Kafka's limit (Topic.MAX_NAME_LENGTH)


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_a_249_character_topic_is_tiered_beside_a_healthy_one(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=11, topics=(LONGEST_TOPIC, "orders"), partitions=1,
                                       segment_bytes=48 * 1024, total_bytes=200 * 1024))
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)

    done = kts(env, "sync")

    assert done.returncode == 0, done.stderr[-3000:]
    status = kts(env, "status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    import json

    rows = {row["topic"]: row for row in json.loads(status.stdout)}
    assert set(rows) == {LONGEST_TOPIC, "orders"}
    for row in rows.values():
        assert row["remote_segments"] > 0 and row["copy_lag_segments"] == 0, row


def test_inventory_paths_stay_within_a_file_name_and_apart():
    long_a, long_b = f"{LONGEST_TOPIC}-0", f"{LONGEST_TOPIC}-1"
    for key in (long_a, long_b, "orders-0"):
        assert len(inventory_path(key).name.encode()) + len(".") + len(".old-xxxxxxxx") <= 255
    assert inventory_path(long_a) != inventory_path(long_b)
    assert inventory_path("orders-0").name == "orders-0.parquet"  # short keys keep their plain name
    assert len(inventory_path(long_a).name.encode()) <= MAX_KEY_BYTES_IN_A_NAME + len(".parquet")
    assert key_digest(long_a) in inventory_path(long_a).name



# --- a property: hostile partitions mixed with healthy ones ------------------------------------


def _damage_a_middle_segment(kind: str, partition_dir: Path) -> Path:
    """Make ``partition_dir`` hostile in the way ``kind`` names; returns the file made bad."""
    logs = sorted(partition_dir.glob("*.log"))
    victim = logs[1]  # closed and committed: the copy would take it
    if kind == "dangling link":
        victim.unlink()
        victim.symlink_to(partition_dir / "gone-elsewhere.log")
    elif kind == "log is a directory":
        victim.unlink()
        victim.mkdir()
    elif kind == "truncated mid-batch":
        os.truncate(victim, victim.stat().st_size // 2 + 3)
    elif kind == "flipped byte":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x20
        victim.write_bytes(bytes(data))
    elif kind == "garbage partition.metadata":
        victim = partition_dir / "partition.metadata"
        victim.write_bytes(b"\x00garbage\xff\n")
    else:
        raise AssertionError(kind)
    return victim


HOSTILE_KINDS = ["dangling link", "log is a directory", "truncated mid-batch", "flipped byte", "garbage partition.metadata"]
TEMPLATE_CONFIG = SimulationConfig(seed=3, topics=("healthy", "victim"), partitions=3, segment_bytes=16 * 1024, total_bytes=240 * 1024)


@pytest.fixture(scope="module")
def template_log_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("template") / "logs"
    simulate(root, TEMPLATE_CONFIG)
    return root


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(hostile=st.dictionaries(st.integers(0, 2), st.sampled_from(HOSTILE_KINDS), min_size=1, max_size=3))
def test_hostile_partitions_fail_alone_each_reported_once_and_healthy_ones_are_always_tiered(
        template_log_dir, pg_admin_url, pg_template, tmp_path_factory, hostile):
    import dagster as dg

    from kts_assets.assets import local_and_remote_segments, remote_segments
    from kts_assets.partitions import topic_partitions

    from .fixtures_postgres import _fresh_database
    from .test_assets import RANGE_END, RANGE_START, eligible, partition_metadata, pipeline_resources

    work = tmp_path_factory.mktemp("hostile")
    root = work / "logs"
    shutil.copytree(template_log_dir, root, symlinks=True)
    bad = {f"victim-{p}": _damage_a_middle_segment(kind, root / f"victim-{p}") for p, kind in hostile.items()}
    keys = sorted(p.name for p in root.iterdir() if p.is_dir())
    database = _fresh_database(pg_admin_url, pg_template)
    pg_url = next(database)
    try:
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(topic_partitions.name, keys)
            result = dg.materialize([local_and_remote_segments], selection=[remote_segments.key], instance=instance, raise_on_error=False,
                                    resources=pipeline_resources(root, pg_url, work / "remote"),
                                    tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
            metadata = partition_metadata(result, "remote_segments")
            errors = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.ERROR]
            # The step's checks judge every partition, the hostile ones too (as failed).
            evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name == "copy_completed"]
            judged = {e.partition: e.passed for e in result.get_asset_check_evaluations() if e.check_name == "offset_invariants"}
    finally:
        next(database, None)
    assert set(judged) == set(keys) and {e.partition for e in evaluations if not e.passed} == set(bad)
    for key in keys:
        md = metadata[key]
        if key in bad:
            assert md["copy_failed"] == 1, (key, hostile, md)
            assert bad[key].name in md["copy_error"] or str(bad[key]) in md["copy_error"], (key, md["copy_error"])
            # Reported once: one error line for the partition, naming it.
            assert sum(1 for line in errors if line.startswith(f"{key}:")) == 1, (key, errors)
        else:
            assert md["copy_failed"] == 0, (key, md)
            assert md["remote_segments"] == len(eligible(template_log_dir, key)) > 0, (key, md)  # untouched: as in the template
