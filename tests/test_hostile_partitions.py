"""One hostile partition never stops the rest: a topic name as long as Kafka allows (249
characters, so a partition key longer than Spark may name a directory after) is tiered beside a
healthy partition, through the whole `kts sync` pass (inventory in Spark, publish, copy, checks)."""

from __future__ import annotations

from kts_resources.inventory import MAX_KEY_BYTES_IN_A_NAME, inventory_path, key_digest
from kts_resources.kafka.simulate import SimulationConfig, simulate

from .test_sync_outcome import kts, sync_env

LONGEST_TOPIC = "t" * 249  # Kafka's limit (Topic.MAX_NAME_LENGTH)


def test_a_249_character_topic_is_tiered_beside_a_healthy_one(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=11, topics=(LONGEST_TOPIC, "orders"), partitions=1,
                                       segment_bytes=48 * 1024, total_bytes=200 * 1024))
    env = sync_env(tmp_path, log_dir, pg_url)

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

