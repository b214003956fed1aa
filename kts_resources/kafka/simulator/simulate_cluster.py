"""A replicated cluster's workload with a scripted leadership history (what ``kts simulate --brokers`` runs).

:func:`simulate_cluster` runs :mod:`.simulate`'s producer workload (the same batches, codecs, idempotent
and transactional producers) against a :class:`~.cluster_simulation.ClusterSimulation`: every batch goes
to its partition's leader; after each, the partition's followers now and then fetch a few batches, so
they lag by varying amounts and roll at their own points; ``leader_changes`` clean elections and
``unclean_elections`` unclean ones happen at evenly spaced points of the byte budget, in an order and on
partitions drawn from the seed. An unclean election first lets the leader take a few batches its most
lagging follower does not fetch, drops that follower from the ISR, then elects it: the other replicas
truncate to its log end offset when they next fetch.

Producers behave as Kafka's do across leader changes: a producer whose batches the new leader lost
continues from the sequence that leader expects (it resends), and the transaction coordinator writes
again the markers of transactions the new leader's lineage left open, as it retries them until the
partition's leader has them.

At the end every follower catches up (so followers' high watermarks lag the leader's by one fetch),
then each leader takes ``high_watermark_lag_batches`` more batches above its high watermark, and
broker-side retention runs on every replica when configured. Deterministic per seed; the log dirs
must be new.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterable

from .broker_log import AppendResult, PartitionLog
from .cluster_simulation import DEFAULT_REPLICA_FETCH_MAX_BYTES, ClusterSimulation
from ..partition import TopicPartition
from ..records import build_control_batch
from .simulate import ProgressCallback, SimulationConfig, _derived_seed, _Producer, _Simulation

MAX_ELECTIONS = 10_000
# After a batch, each follower of its partition fetches with this probability, up to this many batches.
FETCH_PROBABILITY = 0.3
FETCH_MAX_BATCHES = 8
# An unclean election's follower misses this many batches at most (at least one).
UNCLEAN_LAG_BATCHES = 4


@dataclass(frozen=True)
class ClusterOptions:
    """The cluster around the workload. ``replication_factor`` None: min(3, brokers)."""

    brokers: int = 3
    replication_factor: int | None = None
    leader_changes: int = 0  # clean elections
    unclean_elections: int = 0
    segment_bytes_jitter: float = 0.1  # each broker's segment.bytes within ± this share of the topic's
    fetch_max_bytes: int = DEFAULT_REPLICA_FETCH_MAX_BYTES  # replica.fetch.max.bytes

    @property
    def effective_replication_factor(self) -> int:
        return min(3, self.brokers) if self.replication_factor is None else self.replication_factor

    def validate(self) -> None:
        """ValueError with one readable sentence for the first bad option."""
        if not 1 <= self.brokers <= 1000:
            raise ValueError(f"brokers must be 1..1000, not {self.brokers}")
        rf = self.effective_replication_factor
        if not 1 <= rf <= self.brokers:
            raise ValueError(f"replication factor must be 1..{self.brokers} (the brokers), not {rf}")
        for name in ("leader_changes", "unclean_elections"):
            if not 0 <= getattr(self, name) <= MAX_ELECTIONS:
                raise ValueError(f"{name} must be 0..{MAX_ELECTIONS}, not {getattr(self, name)}")
        if (self.leader_changes or self.unclean_elections) and rf < 2:
            raise ValueError("leader changes need a replication factor of at least 2: a partition's only replica cannot hand over")


@dataclass(frozen=True)
class ReplicaSummary:
    topic: str
    partition: int
    role: str  # "leader" or "follower"
    log_start_offset: int
    high_watermark: int
    recovery_point: int
    log_end_offset: int
    segments: int
    bytes: int
    leader_epoch: int  # the newest epoch of the replica's lineage (−1: none)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class BrokerSummary:
    broker: int
    log_dir: str
    leads: tuple[str, ...]  # partition dir names
    replicas: tuple[ReplicaSummary, ...]

    def to_json(self) -> dict:
        return {"broker": self.broker, "log_dir": self.log_dir, "leads": list(self.leads),
                "replicas": [r.to_json() for r in self.replicas]}


@dataclass(frozen=True)
class ClusterSimulationSummary:
    root: str
    replication_factor: int
    bytes_written: int  # to leaders
    batches_written: int
    records_written: int
    transactions_committed: int
    transactions_aborted: int
    leader_changes: int
    unclean_elections: int
    truncations: int  # replicas that cut their log where it diverged from the leader's
    segments_deleted: int  # by retention, over every replica
    start_time_ms: int
    end_time_ms: int
    brokers: tuple[BrokerSummary, ...] = field(default=())
    elections: tuple[dict, ...] = field(default=())

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("brokers", "elections")}
        out["brokers"] = [b.to_json() for b in self.brokers]
        out["elections"] = list(self.elections)
        return out


class _ClusterRun(_Simulation):
    def __init__(self, root: Path, config: SimulationConfig, options: ClusterOptions, progress: ProgressCallback | None):
        self.options = options
        self.cluster = ClusterSimulation(
            root, brokers=options.brokers, replication_factor=options.effective_replication_factor, topics=config.topics,
            partitions=config.partitions, segment_bytes=config.segment_bytes, segment_bytes_jitter=options.segment_bytes_jitter,
            segment_ms=config.segment_ms, index_interval_bytes=config.index_interval_bytes,
            segment_index_bytes=config.segment_index_bytes, fetch_max_bytes=options.fetch_max_bytes, seed=config.seed,
            start_time_ms=config.start_time_ms, auto_checkpoint=False,
        )
        self.tps = config.topic_partitions()
        # Batches must fit every broker's segment.bytes, as a producer's must fit the topic's.
        smallest = min(c.segment_bytes for c in self.cluster.configs)
        self._start_workload(config, progress, {}, dataclasses.replace(config, segment_bytes=smallest))
        self.cluster_rng = random.Random(_derived_seed("cluster", config.seed))
        self.schedule = self._schedule_elections()
        self.segments_deleted = 0
        # The transaction coordinator's memory: the outcome of each producer's last transaction on a
        # partition, and where its transaction in progress started there (on the current leader).
        self.outcomes: dict[tuple[int, TopicPartition], bool] = {}
        self.txn_first_offsets: dict[tuple[int, TopicPartition], int] = {}

    def _schedule_elections(self) -> list[tuple[int, bool]]:
        kinds = [False] * self.options.leader_changes + [True] * self.options.unclean_elections
        self.cluster_rng.shuffle(kinds)
        total = len(kinds)
        return [(self.config.total_bytes * (i + 1) // (total + 1), unclean) for i, unclean in enumerate(kinds)]

    # -- where batches go --

    def _append_to_leader(self, tp: TopicPartition, batch: bytes, log_append_time: int | None) -> AppendResult:
        [result] = self.cluster.append(tp, batch, log_append_time=log_append_time)
        return result

    def _next_sequence(self, producer: _Producer, tp: TopicPartition) -> int:
        """The sequence the leader expects: a producer whose batches a new leader lost resends from
        there (and one in an epoch the leader has not seen starts it at 0)."""
        entry = self._leader_log(tp).producer_state.entry(producer.producer_id)
        if entry is None or entry.producer_epoch > producer.epoch:
            return producer.sequences.get(tp, 0)
        if entry.producer_epoch < producer.epoch:
            return 0
        return (entry.last_sequence + 1) % 2**31

    def _write_data(self, tp: TopicPartition, producer: _Producer | None) -> AppendResult:
        result = super()._write_data(tp, producer)
        if producer is not None and producer.transactional:
            entry = self._leader_log(tp).producer_state.entry(producer.producer_id)
            if entry is not None and entry.current_txn_first_offset >= 0:
                self.txn_first_offsets[(producer.producer_id, tp)] = entry.current_txn_first_offset
        return result

    def _end_transaction(self, producer: _Producer, commit: bool) -> None:
        assert producer.txn is not None
        for tp in producer.txn.partitions:
            self.outcomes[(producer.producer_id, tp)] = commit
            self.txn_first_offsets.pop((producer.producer_id, tp), None)
        super()._end_transaction(producer, commit)

    def _leader_log(self, tp: TopicPartition) -> PartitionLog:
        return self.cluster.log(tp, self.cluster.leader(tp))

    def _every_log(self) -> Iterable[PartitionLog]:
        for b in self.cluster.brokers:
            yield from self.cluster.logs(b).values()

    # -- replication and elections --

    def _maybe_change_leader(self, tp: TopicPartition) -> None:
        rng = self.cluster_rng
        for follower in self.cluster.followers(tp):
            if rng.random() < FETCH_PROBABILITY:
                self.cluster.replicate(tp, follower, max_batches=rng.randint(1, FETCH_MAX_BATCHES))
        while self.schedule and self.bytes_written >= self.schedule[0][0]:
            _, unclean = self.schedule.pop(0)
            self._elect(unclean)

    def _elect(self, unclean: bool) -> None:
        rng = self.cluster_rng
        tp = rng.choice([tp for tp in self.tps if len(self.cluster.replicas(tp)) > 1])
        leader = self.cluster.leader(tp)
        if unclean:
            follower = min(self.cluster.followers(tp), key=lambda b: (self.cluster.log_end_offset(tp, b), b))
            for _ in range(rng.randint(1, UNCLEAN_LAG_BATCHES)):
                self._write_data(tp, None)  # the leader takes batches the follower never fetches
            if follower in self.cluster.isr(tp):
                self.cluster.shrink_isr(tp, follower)
            self.cluster.elect(tp, follower, unclean=True)
        else:
            if len(self.cluster.isr(tp)) < 2:
                self.cluster.replicate(tp)  # followers catch up and rejoin the ISR first
            self.cluster.elect(tp, rng.choice([b for b in self.cluster.isr(tp) if b != leader]))
        self.epoch_changes += 1
        self._rewrite_lost_markers(tp)

    def _rewrite_lost_markers(self, tp: TopicPartition) -> None:
        """The coordinator retries a transaction's markers until the partition's leader holds them:
        a transaction the new leader's lineage holds open, and which its producer has finished,
        gets its marker again."""
        log = self._leader_log(tp)
        for first_offset, producer_id in log.producer_state.ongoing_transactions.items():
            if self.txn_first_offsets.get((producer_id, tp)) == first_offset:
                continue  # the producer's transaction in progress
            entry = log.producer_state.entry(producer_id)
            producer = next(p for p in self.transactional if p.producer_id == producer_id)
            marker = build_control_batch(
                base_offset=0, commit=self.outcomes[(producer_id, tp)], producer_id=producer_id,
                producer_epoch=entry.producer_epoch, coordinator_epoch=producer.coordinator_epoch, timestamp=int(self.clock),
            )
            self._append(tp, marker)
            self.records += 1

    # -- the end --

    def _settle(self) -> None:
        while self.schedule:
            self._elect(self.schedule.pop(0)[1])
        self.cluster.replicate()
        for tp in self.tps:
            self._lag_batches(tp)

    def _apply_retention(self, now: int) -> dict:
        c = self.config
        deleted = self.cluster.delete_old_segments(now, retention_ms=c.retention_ms, retention_bytes=c.retention_bytes)
        self.segments_deleted = sum(len(bases) for bases in deleted.values())
        return {}

    def _close(self) -> None:
        self.cluster.close()

    def _summary(self, deleted: dict) -> ClusterSimulationSummary:
        brokers = []
        for b in self.cluster.brokers:
            replicas, leads = [], []
            for tp, log in self.cluster.logs(b).items():
                role = "leader" if self.cluster.leader(tp) == b else "follower"
                if role == "leader":
                    leads.append(tp.dir_name)
                latest = log.epochs.latest_epoch
                replicas.append(ReplicaSummary(
                    tp.topic, tp.partition, role, log.log_start_offset, log.high_watermark, log.recovery_point,
                    log.log_end_offset, len(log.segments()), log.size, -1 if latest is None else latest,
                ))
            brokers.append(BrokerSummary(b, str(self.cluster.log_dir(b)), tuple(leads), tuple(replicas)))
        elections = tuple(
            {"topic": e.topic_partition.topic, "partition": e.topic_partition.partition, "previous_leader": e.previous_leader,
             "leader": e.leader, "leader_epoch": e.leader_epoch, "start_offset": e.start_offset, "unclean": e.unclean}
            for e in self.cluster.elections
        )
        return ClusterSimulationSummary(
            root=str(self.cluster.root),
            replication_factor=self.options.effective_replication_factor,
            bytes_written=self.bytes_written,
            batches_written=self.batches,
            records_written=self.records,
            transactions_committed=self.committed,
            transactions_aborted=self.aborted,
            leader_changes=sum(not e.unclean for e in self.cluster.elections),
            unclean_elections=sum(e.unclean for e in self.cluster.elections),
            truncations=len(self.cluster.truncations),
            segments_deleted=self.segments_deleted,
            start_time_ms=self.start_ms,
            end_time_ms=int(self.clock),
            brokers=tuple(brokers),
            elections=elections,
        )


def simulate_cluster(
    root: str | Path,
    config: SimulationConfig = SimulationConfig(),
    options: ClusterOptions = ClusterOptions(),
    progress: ProgressCallback | None = None,
) -> ClusterSimulationSummary:
    """Write ``options.brokers`` brokers' log dirs under ``root`` (``root/broker-<id>``, each new or
    empty) with ``config``'s workload, replicated, and the scripted elections. ``config.node_id``
    and ``config.leader_epoch_change_ratio`` do not apply: broker b is node b, and leader epochs
    come from the elections. ValueError for bad options or log dirs that already hold files."""
    options.validate()
    return _ClusterRun(Path(root), config, options, progress).run()


__all__ = ["BrokerSummary", "ClusterOptions", "ClusterSimulationSummary", "ReplicaSummary", "simulate_cluster"]
