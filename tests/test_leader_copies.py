"""Only the leader's kts copies (issue 30, item 1): kts beside each broker of a replicated cluster
reads its broker's id from meta.properties and each partition's leader from the broker's KRaft
metadata log; a follower's kts skips the partition, its checks pass, and `kts status` says whose it is.
Without a metadata log every replica copies, as before."""

from __future__ import annotations

import json
import uuid

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.metadata_log import Leadership, PartitionChangeRecord, PartitionRecord, TopicRecord
from kts_resources.kafka.simulator.metadata_log_writer import MetadataLogWriter
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.leadership import copy_refusal, replica_role

from .test_sync_outcome import kts, sync_env

ORDERS_0, ORDERS_1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


def _leaders(**by_partition: int) -> dict[TopicPartition, Leadership]:
    return {TopicPartition("orders", int(p[1:])): Leadership(uuid.UUID(int=1), leader, 3, 4, (0, 1, 2), (0, 1, 2))
            for p, leader in by_partition.items()}


def test_the_leader_copies_a_follower_does_not_and_without_a_metadata_log_every_replica_copies():
    leaders = _leaders(p0=0, p1=1, p2=-1)
    assert copy_refusal(leaders, ORDERS_0, 0) is None and replica_role(leaders, ORDERS_0, 0) == "leader"
    assert copy_refusal(leaders, ORDERS_1, 0) == "follower of broker 1 (leader epoch 3): only the leader's kts copies"
    assert replica_role(leaders, TopicPartition("orders", 2), 0) == "no leader"
    assert copy_refusal(leaders, TopicPartition("orders", 2), 0).startswith("no leader (leader epoch 3)")
    assert replica_role(leaders, TopicPartition("orders", 9), 0) == "not in the metadata log"
    assert copy_refusal(leaders, TopicPartition("orders", 9), 0).startswith("not in the metadata log")
    assert "this broker's id is unknown" in copy_refusal(leaders, ORDERS_0, None)
    assert copy_refusal(None, ORDERS_1, 0) is None and replica_role(None, ORDERS_1, 0) == "-"


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_a_sync_beside_a_follower_copies_only_the_partitions_its_broker_leads(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=("orders",), partitions=2, segment_bytes=48 * 1024, total_bytes=300 * 1024))
    [topic_id] = {p.metadata().topic_id for p in LogDir(log_dir).partitions()}
    # The broker's metadata log: this broker (node 0, meta.properties) leads orders-0; broker 1 took
    # orders-1 over in a clean election (the leader epoch moves on to 1).
    with MetadataLogWriter(log_dir) as metadata:
        metadata.append_leader_change(3000, [3000])
        metadata.append([TopicRecord("orders", topic_id)] + [
            PartitionRecord(partition_id=p, topic_id=topic_id, replicas=(0, 1), isr=(0, 1), leader=0, leader_epoch=0,
                            partition_epoch=0) for p in (0, 1)])
        metadata.append([PartitionChangeRecord(partition_id=1, topic_id=topic_id, leader=1)])
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)

    synced = kts(env, "sync")

    assert synced.returncode == 0, synced.stderr[-3000:]
    rows = {f"{r['topic']}-{r['partition']}": r for r in json.loads(kts(env, "status", "--json").stdout)}
    assert sorted(rows) == ["orders-0", "orders-1"]
    assert rows["orders-0"]["replica"] == "leader" and rows["orders-0"]["remote_segments"] > 0
    assert rows["orders-0"]["copy_lag_segments"] == 0
    assert rows["orders-1"]["replica"] == "follower of broker 1" and rows["orders-1"]["remote_segments"] == 0


def test_a_replica_that_does_not_copy_still_keeps_its_topic_from_looking_deleted(tmp_path, metadata_store):
    """kts deletes a topic's remote data once no kts has seen it for the grace period; a partition
    without a leader is copied by nobody, so its replicas' kts must still say they see it."""
    import datetime as dt

    from kts_resources.tiering.copier import copy_partition
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=("orders",), partitions=1, segment_bytes=48 * 1024, total_bytes=100 * 1024))
    [partition] = LogDir(log_dir).partitions()
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    metadata_store.mark_topics_seen(["orders"], at=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    week_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=7)
    assert metadata_store.topics_unseen_since(week_ago) == ["orders"]

    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage, not_leader="no leader (leader epoch 3): …")

    assert result.skipped.startswith("no leader") and result.copied == []
    assert metadata_store.topics_unseen_since(week_ago) == []


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_after_a_leader_change_the_new_leaders_sync_copies_on_and_the_old_leaders_sync_passes_as_a_follower(tmp_path, pg_url):
    """Two brokers' `kts sync`, one store and one tier: broker 0 leads and copies; leadership moves
    to broker 1 (clean); both syncs exit 0 — the old leader's as a follower whose high watermark is
    below what its kts copied — and the new leader's copies from where the tier's lineage ends."""
    from kts_resources.kafka.simulator.cluster_simulation import ClusterSimulation
    from kts_resources.kafka.records import NewRecord, build_batch

    cluster = ClusterSimulation(tmp_path / "cluster", brokers=2, replication_factor=2, partitions=1, segment_bytes=4000, seed=8)
    [tp] = cluster.topic_partitions

    def produce(n: int) -> None:
        cluster.append(tp, [build_batch([NewRecord(1_700_000_000_000 + i, b"k", b"value %d " % i * 20)], base_offset=0)
                            for i in range(n)])
        for _ in range(2):  # the follower fetches, then the leader's high watermark follows it
            for follower in cluster.followers(tp):
                cluster.replicate(tp, follower)

    produce(60)
    for b in (0, 1):
        (tmp_path / f"kts-{b}").mkdir()
    env = {b: sync_env(tmp_path / f"kts-{b}", cluster.log_dir(b), pg_url, session_spark=True,
                       KTS_REMOTE_URI=(tmp_path / "remote").as_uri()) for b in (0, 1)}
    first = kts(env[0], "sync")
    assert first.returncode == 0, first.stderr[-3000:]
    cluster.elect(tp, 1)
    produce(60)

    for b in (0, 1):
        synced = kts(env[b], "sync")
        assert synced.returncode == 0, synced.stderr[-3000:]
    rows = {b: json.loads(kts(env[b], "status", "--json").stdout)[0] for b in (0, 1)}
    assert rows[0]["replica"] == "follower of broker 1" and rows[1]["replica"] == "leader"
    assert rows[1]["copy_lag_segments"] == 0
    # One lineage in the tier: the new leader's copies went on where the old leader's ended.
    offsets = json.loads(kts(env[1], "offsets", tp.topic, str(tp.partition), "--latest-tiered", "--json").stdout)
    assert offsets["leader_epoch"] == 1 and offsets["offset"] > 60
