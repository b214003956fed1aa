"""The cluster property (issue 30's acceptance): appends, follower fetches, clean and unclean leader
changes, syncs and retention on random brokers, and a sync killed with SIGKILL mid-copy, in any
order. Invariant: every offset in [log start, latest tiered] reads the current lineage's record.

A new leader's kts syncs as it takes over (kts learns of the election from its broker's metadata
log): until it has, the tier cannot know the new lineage, exactly as Kafka's tier waits for the new
leader's RemoteLogManager.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.kafka.simulator.cluster_simulation import ClusterSimulation
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .cluster_scenario import KtsBesideEachBroker
from .copy_driver import CRASH_POINTS

OPERATIONS = ("append", "replicate", "clean_election", "unclean_election", "sync", "retention", "sigkill_sync")
_topics = itertools.count()


def _sigkill_sync(kts: KtsBesideEachBroker, broker: int, crash_at: str, pg_url: str, remote_uri: str) -> None:
    """A copy pass beside ``broker`` in its own process, killed at ``crash_at`` (tests/copy_driver.py)."""
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": remote_uri}
    done = subprocess.run([sys.executable, "-m", "tests.copy_driver", str(kts.cluster.log_dir(broker)), crash_at],
                          cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode in (0, -9), done.stderr[-2000:]  # 0: fewer than two segments to copy, no crash point came


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(OPERATIONS), st.integers(0, 2), st.integers(0, 1), st.floats(0.0, 1.0)),
                      min_size=4, max_size=14),
       leaders_from_metadata_log=st.booleans())
def test_every_tiered_offset_reads_the_current_lineage(metadata_store, pg_url, steps, leaders_from_metadata_log):
    topic = f"orders{next(_topics)}"  # the store outlives an example: each gets a topic of its own
    rng = random.Random(len(steps))
    with tempfile.TemporaryDirectory(prefix="kts-cluster-prop-") as tmp:
        remote_uri = (Path(tmp) / "remote").as_uri()
        cluster = ClusterSimulation(Path(tmp) / "cluster", brokers=3, replication_factor=3, topics=(topic,), partitions=2,
                                    segment_bytes=2500, seed=len(steps))
        kts = KtsBesideEachBroker(cluster, metadata_store, remote_storage_from_uri(remote_uri),
                                  leaders_from_metadata_log=leaders_from_metadata_log)
        for tp in cluster.topic_partitions:
            kts.produce(tp, 12, rng)
        for operation, broker, p, fraction in steps:
            tp = cluster.topic_partitions[p]
            if operation == "append":
                kts.produce(tp, 5 + int(fraction * 20), rng)
            elif operation == "replicate":
                for follower in cluster.followers(tp):
                    cluster.replicate(tp, follower, max_batches=None if fraction > 0.5 else 4)
            elif operation == "clean_election":
                in_sync = [b for b in cluster.isr(tp) if b != cluster.leader(tp)]
                if in_sync:
                    cluster.elect(tp, in_sync[broker % len(in_sync)])
                    kts.sync(cluster.leader(tp))
            elif operation == "unclean_election":
                followers, old_leader = cluster.followers(tp), cluster.leader(tp)
                cluster.shrink_isr(tp, followers)
                # The leader goes on alone and its kts tiers some of it: all lost to the election.
                kts.produce(tp, 5 + int(fraction * 25), rng)
                kts.sync(old_leader)
                cluster.elect(tp, followers[broker % len(followers)], unclean=True)
                kts.sync(cluster.leader(tp))
            elif operation == "sync":
                kts.sync(broker)
            elif operation == "retention" and metadata_store.topic_id(topic) is not None:
                metadata_store.set_topic_config(topic, "retention.bytes", str(int(4_000 + fraction * 30_000)))
                kts.sync(broker)
                metadata_store.set_topic_config(topic, "retention.bytes", "-1")
            elif operation == "sigkill_sync":
                _sigkill_sync(kts, broker, CRASH_POINTS[int(fraction * len(CRASH_POINTS)) % len(CRASH_POINTS)], pg_url, remote_uri)
            for each in cluster.topic_partitions:
                kts.check_reads(each)
        # After everything, a pass beside every broker (the rerun after the kill) converges.
        for b in cluster.brokers:
            kts.sync(b)
        for each in cluster.topic_partitions:
            kts.check_reads(each)
        cluster.close()
