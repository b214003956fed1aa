"""A replicated cluster in the simulator (issue 30, item 8): N brokers' log dirs as their brokers
write them — followers holding the leader's batches byte for byte with their own roll points and
lagging high watermarks, leadership in each broker's KRaft metadata log, and the truncation an
unclean election forces on the old lineage — read back here with kts's own readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kts_resources.kafka.checkpoints import EpochEntry, read_meta_properties
from kts_resources.kafka.simulator.cluster_simulation import ClusterSimulation
from kts_resources.kafka.indexes import verify_segment_indexes
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import NewRecord, build_batch, decode_batch, scan_batches
from kts_resources.tiering.leadership import broker_replicas

from .test_cli import kts

T0 = 1_700_000_000_000
ORDERS = TopicPartition("orders", 0)


def batch(lineage: str, i: int, records: int = 4) -> bytes:
    """~1.3 KB whose values say which lineage wrote them."""
    return build_batch([NewRecord(T0 + 10 * i + k, f"key-{i}".encode(), f"{lineage}-{i}-{k}-".encode() + b"x" * 300)
                        for k in range(records)], base_offset=0)


def on_disk(log_dir: Path, tp: TopicPartition) -> dict[int, bytes]:
    """Every batch of a replica by base offset, read through kts's log dir reader (CRCs checked)."""
    out = {}
    for segment in LogDir(log_dir).partition_dir(tp).segments():
        data = segment.log.read_bytes()
        scan = scan_batches(data, verify_crc=True)
        assert scan.invalid is None and all(b.crc_ok for b in scan.batches), segment.log
        out.update({b.base_offset: data[b.position : b.position + b.size] for b in scan.batches})
    return out


def segment_bases(log_dir: Path, tp: TopicPartition) -> list[int]:
    return [s.base_offset for s in LogDir(log_dir).partition_dir(tp).segments()]


@pytest.fixture
def cluster(tmp_path):
    sim = ClusterSimulation(tmp_path, brokers=3, replication_factor=3, segment_bytes=8 * 1024, seed=3)
    yield sim
    sim.close()


def test_followers_hold_the_leaders_batches_byte_for_byte_at_the_same_offsets_and_roll_at_their_own_points(cluster):
    for i in range(60):
        cluster.append(ORDERS, batch("a", i))
        if i % 7 == 3:
            cluster.replicate(ORDERS, max_batches=1 + i % 5)
    cluster.replicate(ORDERS)
    leader = cluster.leader(ORDERS)

    held = {b: on_disk(cluster.log_dir(b), ORDERS) for b in cluster.replicas(ORDERS)}

    assert len(held[leader]) == 60
    assert all(replica == held[leader] for replica in held.values())
    bases = {b: segment_bases(cluster.log_dir(b), ORDERS) for b in cluster.replicas(ORDERS)}
    assert all(len(b) > 3 for b in bases.values())
    assert len({tuple(b) for b in bases.values()}) == 3, bases  # each broker rolled somewhere else


def test_a_followers_high_watermark_is_the_leaders_from_its_last_fetch_and_the_leaders_waits_for_the_isr(cluster):
    leader, (f1, f2) = cluster.leader(ORDERS), cluster.followers(ORDERS)
    cluster.append(ORDERS, [batch("a", i) for i in range(10)])
    assert cluster.high_watermark(ORDERS) == 0  # no follower has fetched yet

    cluster.replicate(ORDERS)

    hw = {b: LogDir(cluster.log_dir(b)).high_watermark(ORDERS) for b in cluster.replicas(ORDERS)}
    assert hw[leader] == 40  # every ISR member's last fetch was at the log end
    assert hw[f1] < 40 and hw[f2] < 40  # what the leader knew when it answered their last fetches
    cluster.replicate(ORDERS)
    assert {b: LogDir(cluster.log_dir(b)).high_watermark(ORDERS) for b in cluster.replicas(ORDERS)} == {b: 40 for b in hw}

    cluster.append(ORDERS, [batch("a", i) for i in range(10, 15)])
    cluster.replicate(ORDERS, f1)
    assert cluster.high_watermark(ORDERS) == 40  # f2, in the ISR, has not fetched past 40
    cluster.shrink_isr(ORDERS, f2)
    assert cluster.high_watermark(ORDERS) == 60 and LogDir(cluster.log_dir(leader)).high_watermark(ORDERS) == 60


def test_each_brokers_own_files_name_it_and_the_leaders_and_epochs_the_simulation_elected(tmp_path):
    sim = ClusterSimulation(tmp_path, brokers=3, replication_factor=2, topics="orders,page.views", partitions=3,
                            segment_bytes=8 * 1024, seed=11)
    tps = sim.topic_partitions
    for i, tp in enumerate(tps):
        sim.append(tp, [batch("a", i * 10 + j) for j in range(3)])
    sim.replicate()
    sim.elect(tps[0], sim.followers(tps[0])[0])
    sim.elect(tps[0], sim.followers(tps[0])[0])  # back again: epoch 2
    sim.append(tps[1], batch("a", 99))
    sim.shrink_isr(tps[1], sim.followers(tps[1]))
    sim.elect(tps[1], sim.followers(tps[1])[0], unclean=True)

    for b in sim.brokers:
        replicas = broker_replicas([sim.log_dir(b)])
        assert replicas.broker_id == b
        assert {tp: (l.leader, l.leader_epoch, l.partition_epoch, l.replicas, l.isr) for tp, l in replicas.leaders.items()} == {
            tp: (sim.leader(tp), sim.leader_epoch(tp), sim.partition_epoch(tp), sim.replicas(tp), sim.isr(tp)) for tp in tps}
        assert replicas.leaders[tps[0]].leader_epoch == 2 and replicas.leaders[tps[1]].isr == (sim.leader(tps[1]),)
    assert len({read_meta_properties(sim.log_dir(b) / "meta.properties").cluster_id for b in sim.brokers}) == 1
    metadata_logs = [(sim.log_dir(b) / "__cluster_metadata-0" / f"{0:020d}.log").read_bytes() for b in sim.brokers]
    assert metadata_logs[0] == metadata_logs[1] == metadata_logs[2]
    sim.close()


def test_after_an_unclean_election_the_old_lineage_truncates_to_the_divergence_point_and_holds_the_new_one(cluster):
    old_leader, (in_sync, lagging) = cluster.leader(ORDERS), cluster.followers(ORDERS)
    cluster.append(ORDERS, [batch("old", i) for i in range(20)])
    cluster.replicate(ORDERS)
    cluster.append(ORDERS, [batch("old", i) for i in range(20, 30)])
    cluster.replicate(ORDERS, in_sync)
    cluster.shrink_isr(ORDERS, lagging)
    divergence = cluster.log_end_offset(ORDERS, lagging)
    committed = cluster.high_watermark(ORDERS)
    assert divergence == 80 < committed == 120

    election = cluster.elect(ORDERS, lagging, unclean=True)
    cluster.append(ORDERS, [batch("new", i) for i in range(6)])
    cluster.replicate(ORDERS)

    assert (election.leader_epoch, election.start_offset) == (1, divergence)
    assert sorted((t.broker, t.log_end_offset, t.truncated_to) for t in cluster.truncations) == sorted(
        [(old_leader, 120, divergence), (in_sync, 120, divergence)])
    new_lineage = on_disk(cluster.log_dir(lagging), ORDERS)
    for b in (old_leader, in_sync):
        assert on_disk(cluster.log_dir(b), ORDERS) == new_lineage
        assert LogDir(cluster.log_dir(b)).partition_dir(ORDERS).leader_epochs() == [EpochEntry(0, 0), EpochEntry(1, divergence)]
        # Producer state was rebuilt at the truncation point and snapshotted there, as Kafka does.
        assert divergence in LogDir(cluster.log_dir(b)).partition_dir(ORDERS).snapshots()
    expected = cluster.expected_records(ORDERS)
    assert [r.offset for r in expected] == list(range(cluster.high_watermark(ORDERS)))
    assert all(r.leader_epoch == (0 if r.offset < divergence else 1) for r in expected)
    assert all(r.value.startswith(b"new-" if r.offset >= divergence else b"old-") for r in expected)
    # What the old leader's files now hold at each offset is the current lineage's record.
    held = {r.offset: (r.key, r.value) for data in on_disk(cluster.log_dir(old_leader), ORDERS).values()
            for r in decode_batch(data, scan_batches(data).batches[0])}
    assert all(held[r.offset] == (r.key, r.value) for r in expected)


def test_a_clean_election_of_a_lagging_in_sync_follower_loses_nothing_committed(cluster):
    old_leader, (follower, other) = cluster.leader(ORDERS), cluster.followers(ORDERS)
    cluster.append(ORDERS, [batch("a", i) for i in range(12)])
    cluster.replicate(ORDERS)
    cluster.append(ORDERS, [batch("a", i) for i in range(12, 20)])
    cluster.replicate(ORDERS, follower, max_batches=3)
    cluster.replicate(ORDERS, other, max_batches=5)
    committed = cluster.high_watermark(ORDERS)

    cluster.elect(ORDERS, follower)
    cluster.replicate(ORDERS)

    [cut] = [t for t in cluster.truncations if t.broker == old_leader]
    assert cut.truncated_to == cluster.lineage(ORDERS)[-1].start_offset >= committed
    assert cluster.log_end_offset(ORDERS, old_leader) == cluster.log_end_offset(ORDERS, follower) == 60
    assert on_disk(cluster.log_dir(old_leader), ORDERS) == on_disk(cluster.log_dir(follower), ORDERS)


def test_retention_runs_on_every_replica_and_followers_take_the_leaders_log_start_offset(cluster):
    cluster.append(ORDERS, [batch("a", i) for i in range(40)])
    cluster.replicate(ORDERS)
    cluster.replicate(ORDERS)
    leader = cluster.leader(ORDERS)

    deleted = cluster.delete_old_segments(retention_bytes=24 * 1024)
    cluster.replicate(ORDERS)
    cluster.delete_old_segments(retention_bytes=24 * 1024)

    assert deleted[(ORDERS, leader)]
    leader_start = LogDir(cluster.log_dir(leader)).log_start_offset(ORDERS)
    for b in cluster.followers(ORDERS):
        start = LogDir(cluster.log_dir(b)).log_start_offset(ORDERS)
        assert start >= leader_start > 0
        assert segment_bases(cluster.log_dir(b), ORDERS)[0] <= start < segment_bases(cluster.log_dir(b), ORDERS)[1]
    assert cluster.expected_records(ORDERS)[0].offset == leader_start


def test_elections_follow_kafkas_rules_for_who_may_lead(cluster):
    follower = cluster.followers(ORDERS)[0]
    with pytest.raises(ValueError, match="is in .*ISR .*: its election would be clean"):
        cluster.elect(ORDERS, follower, unclean=True)
    cluster.shrink_isr(ORDERS, follower)
    with pytest.raises(ValueError, match="only an unclean election can choose it"):
        cluster.elect(ORDERS, follower)
    with pytest.raises(ValueError, match="a leader does not drop itself"):
        cluster.shrink_isr(ORDERS, cluster.leader(ORDERS))


# --- kts simulate --brokers -------------------------------------------------------------------------

SMALL = ["--total-bytes", "400KiB", "--segment-bytes", "24KiB", "--topics", "orders,page.views", "--partitions", "2"]


def test_kts_simulate_writes_n_brokers_log_dirs_that_kts_reads_and_agree_with_each_other(tmp_path):
    result = kts("simulate", "--brokers", "3", "--replication-factor", "2", "--leader-changes", "2",
                 "--unclean-elections", "1", "--log-dir", tmp_path, "--seed", "4", *SMALL, "--json")

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert [b["log_dir"] for b in summary["brokers"]] == [str(tmp_path / f"broker-{b}") for b in range(3)]
    assert (summary["leader_changes"], summary["unclean_elections"]) == (2, 1) and summary["truncations"] >= 1
    replicas: dict[TopicPartition, dict[int, dict[int, bytes]]] = {}
    for b, broker in enumerate(summary["brokers"]):
        log_dir = Path(broker["log_dir"])
        leaders = broker_replicas([log_dir])
        assert leaders.broker_id == b
        assert sorted(tp.dir_name for tp, l in leaders.leaders.items() if l.leader == b) == sorted(broker["leads"])
        for partition in LogDir(log_dir).partitions():
            rows = json.loads(kts("segments", partition.path, "--json").stdout)
            assert rows and all(row["health"] == "ok" for row in rows), rows
            for segment in partition.segments():
                assert verify_segment_indexes(segment.log) == [], segment.log
            replicas.setdefault(partition.topic_partition, {})[b] = on_disk(log_dir, partition.topic_partition)
    assert len(replicas) == 4 and all(len(held) == 2 for held in replicas.values())
    for tp, held in replicas.items():
        a, b = held.values()
        assert all(a[o] == b[o] for o in a.keys() & b.keys()), tp
    lines = kts("simulate", "--brokers", "2", "--log-dir", tmp_path / "text", "--seed", "4", *SMALL).stdout.splitlines()
    assert [line.split(" (")[0] for line in lines if line.startswith("broker ")] == [
        f"broker {b}: {tmp_path / 'text' / f'broker-{b}'}" for b in range(2)]


def test_kts_simulate_writes_the_same_cluster_for_the_same_seed(tmp_path):
    for name in ("a", "b"):
        assert kts("simulate", "--brokers", "2", "--unclean-elections", "1", "--log-dir", tmp_path / name, "--seed", "9",
                   *SMALL).returncode == 0
    tree = {name: {str(p.relative_to(tmp_path / name)): p.read_bytes() for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
            for name in ("a", "b")}
    assert tree["a"] == tree["b"]


@pytest.mark.parametrize("args, message", [
    (["--brokers", "2", "--replication-factor", "3"], "replication factor must be 1..2 (the brokers), not 3"),
    (["--replication-factor", "2"], "--replication-factor needs --brokers"),
    (["--brokers", "2", "--node-id", "1"], "--node-id does not apply with --brokers"),
    (["--brokers", "2", "--replication-factor", "1", "--unclean-elections", "1"], "need a replication factor of at least 2"),
])
def test_kts_simulate_refuses_a_cluster_it_cannot_write_in_one_line(tmp_path, args, message):
    result = kts("simulate", "--log-dir", tmp_path, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("kts: simulate: ") and message in result.stderr


def test_kts_simulate_writes_a_cluster_only_into_new_log_dirs(tmp_path):
    (tmp_path / "broker-1").mkdir()
    (tmp_path / "broker-1" / "meta.properties").write_text("node.id=1\n")
    result = kts("simulate", "--brokers", "2", "--log-dir", tmp_path, *SMALL)
    assert result.returncode == 2 and "broker-1 already holds files" in result.stderr
    assert not (tmp_path / "broker-0").exists() or not any((tmp_path / "broker-0").iterdir())
