"""The cluster scenario (issue 30's acceptance): 3 brokers, replication factor 3, 4 partitions, a kts
beside each sharing one store and one tier. Rounds of appends, follower fetches, syncs on brokers in
random order (and two at once), clean leader changes, one unclean election, and retention by time
and by bytes. After every round a remote-only reader gets exactly the current leader lineage's
record for every offset from the log start offset to the latest tiered one."""

from __future__ import annotations

import random

import pytest

from kts_resources.kafka.simulator.cluster_simulation import ClusterSimulation
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.maintenance.recovery import recover

from .cluster_scenario import KtsBesideEachBroker
from .fixtures_postgres import fresh_database

ROUNDS = 10
RETENTION_BYTES = 20_000
MAX_SEGMENT_BYTES = 3300  # segment.bytes 3000, jittered by up to 10% per broker


def _round(kts: KtsBesideEachBroker, rng: random.Random, n: int, unclean_round: int) -> None:
    cluster = kts.cluster
    for tp in cluster.topic_partitions:
        kts.produce(tp, rng.randint(15, 30), rng)
        for follower in cluster.followers(tp):
            if rng.random() < 0.8:
                cluster.replicate(tp, follower, max_batches=rng.choice([None, 3, 8]))
    tp = rng.choice(cluster.topic_partitions)
    if n == unclean_round:
        # A follower falls out of the ISR, the leader goes on alone, and the follower is elected.
        lagging, old_leader = cluster.followers(tp)[0], cluster.leader(tp)
        cluster.shrink_isr(tp, [b for b in cluster.followers(tp)])
        kts.produce(tp, 30, rng)
        kts.sync(old_leader)  # its records past the divergence point reach the tier before the election
        cluster.elect(tp, lagging, unclean=True)
        kts.produce(tp, 4, rng)
    elif rng.random() < 0.5:
        in_sync = [b for b in cluster.isr(tp) if b != cluster.leader(tp)]
        if in_sync:
            cluster.elect(tp, rng.choice(in_sync))
            kts.produce(tp, 3, rng)
    order = list(cluster.brokers)
    rng.shuffle(order)
    if n % 3 == 1:
        kts.sync_two_at_once(order[0], order[1])
        kts.sync(order[2])
    else:
        for broker in order:
            kts.sync(broker)


def _check_retention_bytes(kts: KtsBesideEachBroker) -> None:
    """retention.bytes counted each offset once, by Kafka's rule (the leader deletes the oldest while
    what stays, its local-only bytes included, is at least the limit): after each leader's pass the
    tier keeps at most the limit, give or take one segment, and a pass that deleted by size left at
    least the limit less the leader's local-only bytes, give or take one segment. (Across passes the
    local-only bytes move: a new leader's high watermark lags, an old leader's uncommitted tail is
    truncated, so the lower bound holds at the moment of deletion, as in Kafka.)"""
    assert any(by_size for *_rest, by_size in kts.retained)
    for tp, limit, kept, only_local, biggest, by_size in kts.retained:
        slack = max(biggest, MAX_SEGMENT_BYTES)
        assert kept <= limit + slack, (tp, kept)
        if by_size:
            assert kept + only_local >= limit - slack, (tp, kept, only_local)


@pytest.mark.parametrize("leaders_from_metadata_log", [True, False], ids=["metadata-log", "every-replica-copies"])
def test_every_round_reads_the_current_lineage_from_the_shared_tier(tmp_path, metadata_store, remote_storage, leaders_from_metadata_log,
                                                                     pg_admin_url, pg_template):
    rng = random.Random(30)
    cluster = ClusterSimulation(tmp_path / "cluster", brokers=3, replication_factor=3, partitions=4, segment_bytes=3000, seed=30)
    kts = KtsBesideEachBroker(cluster, metadata_store, remote_storage, leaders_from_metadata_log=leaders_from_metadata_log)
    unclean_round, read = 5, 0
    for n in range(ROUNDS):
        if n == 6:
            metadata_store.set_topic_config("orders", "retention.bytes", str(RETENTION_BYTES))
        if n == 8:
            metadata_store.set_topic_config("orders", "retention.bytes", "-1")
            metadata_store.set_topic_config("orders", "retention.ms", str(60_000))  # by time: the oldest go
        _round(kts, rng, n, unclean_round)
        read += sum(kts.check_reads(tp) for tp in cluster.topic_partitions)
        kts.scrub_is_clean()
        if n == 7 and leaders_from_metadata_log:
            # (Where every replica copies, every replica's expiry also counts its own uncopied bytes
            # as the log's, a lagging follower's the most: the tier may keep less. Kafka runs it on the leader.)
            _check_retention_bytes(kts)
        kts.retained.clear()
    assert any(e.unclean for e in cluster.elections) and read > 0
    # The store lost: `kts recover` into a fresh database answers every read the same way, the log
    # start offsets retention moved included.
    answers = kts.answers()
    with fresh_database(pg_admin_url, pg_template) as url:
        recovered = RemoteLogMetadataStore.from_url(url)
        try:
            report = recover(recovered, remote_storage, None)
            assert report.incomplete_segments == [] and report.skipped == []
            again = KtsBesideEachBroker(cluster, recovered, remote_storage)
            assert again.answers() == answers
            for tp in cluster.topic_partitions:
                again.check_reads(tp)
        finally:
            recovered.close()
    if leaders_from_metadata_log:
        # Only leaders copy: what went up is the unique data, bar a segment per leader change.
        assert kts.copied_bytes <= 1.05 * kts.unique_tiered_bytes(), (kts.copied_bytes, kts.unique_tiered_bytes())
