"""A replicated Kafka cluster in the simulator: N brokers' log dirs, written as their brokers write them.

:class:`ClusterSimulation` keeps one :class:`~.broker_log.BrokerLogDir` per broker (``root/broker-<id>``,
with ``meta.properties`` naming ``node.id``) and the cluster's KRaft metadata log, the same records in
``__cluster_metadata-0`` of every broker's log dir. A test drives it step by step; nothing is random
but what ``seed`` derives (the replica assignment, each broker's segment.bytes), and nothing reads the
wall clock.

The replication rules are Kafka's (core ``Partition``, ``ReplicaFetcherThread``, ``AbstractFetcherThread``,
``UnifiedLog``; the trunk of 2024-09):

- **Leader.** :meth:`append` goes to the partition's leader, stamped with the current leader epoch. A
  broker that becomes leader assigns its epoch at its log end offset at once (Partition.makeLeader), so
  ``leader-epoch-checkpoint`` names the epoch before any batch has it. Its high watermark is the lowest
  log end offset among the ISR as the leader knows them (each follower's last fetch offset), never
  moving back; a new leader knows no follower's until each has fetched from it.
- **Follower.** :meth:`replicate` is a follower fetching: first the divergence check of truncation on
  fetch (the leader's OffsetsForLeaderEpoch answer for the follower's last epoch, and the follower's
  truncation rule, repeated until the lineages agree), then the leader's batches from the follower's
  log end offset, byte for byte, up to ``fetch_max_bytes`` (replica.fetch.max.bytes) and never more
  than the follower's segment.bytes. A fetch's batches are one append, so the follower rolls where the
  chunk starts; each broker's segment.bytes is drawn once within ``segment_bytes_jitter`` of the
  topic's, so roll points differ further. The response carries the leader's high watermark from
  before the fetch: the follower's is min(that, its log end offset), and lags.
- **ISR.** A follower out of the ISR rejoins once it has reached the leader's high watermark and the
  start of the leader's epoch (Partition.isFollowerInSync): the change goes to the metadata log.
  :meth:`shrink_isr` drops followers (the leader's AlterPartition after replica.lag.time.max.ms).
- **Elections.** :meth:`elect` writes the PartitionChangeRecord a controller writes: a clean election
  picks an ISR member; an unclean one a replica outside the ISR, which becomes the ISR alone, in
  leader recovery state RECOVERING until its first ISR expansion. Either moves the epoch on by one.
  The old leader, once it fetches as a follower, truncates where its log diverged.
- **Retention.** :meth:`delete_old_segments` runs each replica's own retention; followers take the
  leader's log start offset from their fetches.

The simulation also keeps, per replica, which batch sits at which offset, in which segment file and
position (:class:`HeldBatch`, with a digest of its bytes): the oracle behind :meth:`expected_records`,
checked against the files whenever it is read.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from .broker_log import (
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SEGMENT_MS,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    AppendResult,
    BrokerLogDir,
    LogConfig,
    PartitionLog,
)
from ..checkpoints import EpochEntry
from ..indexes import DEFAULT_INDEX_INTERVAL_BYTES, DEFAULT_SEGMENT_INDEX_BYTES
from ..logdir import LOG_SUFFIX, offset_file_name
from ..metadata_log import (
    FeatureLevelRecord,
    PartitionChangeRecord,
    PartitionRecord,
    TopicRecord,
)
from .metadata_log_writer import MetadataLogWriter
from ..partition import TopicPartition, topic_name_problem
from ..records import decode_batch, scan_batches

MiB = 1024 * 1024
DEFAULT_REPLICA_FETCH_MAX_BYTES = 1 * MiB  # replica.fetch.max.bytes
DEFAULT_START_TIME_MS = 1_700_000_000_000  # as simulate.py's: a fixed clock, never the wall clock
CONTROLLER_ID = 3000  # the KRaft controller that writes the metadata log (a node id above the brokers')
METADATA_VERSION_LEVEL = 21  # metadata.version 3.9-IV0
LEADER_RECOVERY_RECOVERED = 0  # LeaderRecoveryState
LEADER_RECOVERY_RECOVERING = 1
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class HeldBatch:
    """One batch a replica holds: its offsets and leader epoch, where its bytes are (the segment's
    base offset and the position in its ``.log``), and a digest of those bytes."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    segment_base_offset: int
    position: int
    size: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class ExpectedRecord:
    """What the current lineage holds at ``offset``: the record and the batch it came in."""

    offset: int
    leader_epoch: int
    batch_base_offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    is_control: bool


@dataclass(frozen=True, slots=True)
class Election:
    topic_partition: TopicPartition
    previous_leader: int
    leader: int
    leader_epoch: int
    start_offset: int  # the new leader's log end offset: where its epoch starts
    unclean: bool


@dataclass(frozen=True, slots=True)
class Truncation:
    """A replica cut its log where it diverged from its leader's (or below the leader's log start)."""

    topic_partition: TopicPartition
    broker: int
    log_end_offset: int  # before
    truncated_to: int


@dataclass
class _Partition:
    """The controller's record of a partition, and what its leader knows of its followers."""

    topic_id: object
    partition_id: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    epoch_start_offset: int = 0  # the leader's log end offset when it took this epoch
    recovering: bool = False  # LeaderRecoveryState.RECOVERING after an unclean election
    # Each follower's log end offset as the leader knows it (its last fetch offset); None: unknown.
    follower_log_end: dict[int, int | None] = field(default_factory=dict)


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def broker_log_dir(root: str | os.PathLike, broker: int) -> Path:
    """Where a simulated cluster keeps broker ``broker``'s log dir."""
    return Path(root) / f"broker-{broker}"


def assign_replicas(brokers: int, replication_factor: int, partitions: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Kafka's rack-unaware replica assignment for one topic: partition p's first replica is broker
    (start + p) mod N, the others follow at a shift that moves on every N partitions, so leaders and
    followers spread over the brokers. ``start`` and the shift are drawn from ``rng``."""
    start, shift = rng.randrange(brokers), rng.randrange(brokers)
    out = []
    for p in range(partitions):
        if p > 0 and p % brokers == 0:
            shift += 1
        first = (start + p) % brokers
        rest = [(first + 1 + (shift + j) % (brokers - 1)) % brokers for j in range(replication_factor - 1)] if brokers > 1 else []
        out.append((first, *rest))
    return out


class ClusterSimulation:
    """N brokers replicating their partitions; see the module docstring for the rules.

    ``root/broker-<b>`` must not exist yet, or be empty. ``topics`` × ``partitions`` are created at
    once, each partition led by its first replica in leader epoch 0 with every replica in the ISR.
    Checkpoints (replication-offset, recovery-point, log-start-offset) are written after every
    step (``auto_checkpoint``), for the brokers the step touched, so a reader of a broker's dir
    sees what that broker would have written by then.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        brokers: int = 3,
        replication_factor: int = 3,
        topics: str | Sequence[str] = ("orders",),
        partitions: int = 1,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        segment_bytes_jitter: float = 0.1,
        segment_ms: int = DEFAULT_SEGMENT_MS,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES,
        fetch_max_bytes: int = DEFAULT_REPLICA_FETCH_MAX_BYTES,
        seed: int = 0,
        start_time_ms: int = DEFAULT_START_TIME_MS,
        auto_checkpoint: bool = True,
    ):
        topics = tuple(t.strip() for t in topics.split(",") if t.strip()) if isinstance(topics, str) else tuple(topics)
        _validate(brokers, replication_factor, topics, partitions, segment_bytes_jitter, fetch_max_bytes)
        self.root = Path(root)
        self.seed = seed
        self.fetch_max_bytes = fetch_max_bytes
        self.auto_checkpoint = auto_checkpoint
        self.now_ms = start_time_ms
        self.elections: list[Election] = []
        self.truncations: list[Truncation] = []
        for b in range(brokers):
            d = self.log_dir_path(b)
            if d.exists() and any(d.iterdir()):
                raise ValueError(f"{d} already holds files: a simulated cluster starts from empty log dirs")
        jitter = random.Random(f"{seed}:segment-bytes")
        self.configs = [
            LogConfig(
                segment_bytes=min(_INT32_MAX, max(1, round(segment_bytes * (1 + jitter.uniform(-segment_bytes_jitter, segment_bytes_jitter))))),
                segment_ms=segment_ms, index_interval_bytes=index_interval_bytes, segment_index_bytes=segment_index_bytes,
            )
            for _ in range(brokers)
        ]
        self._brokers = [
            BrokerLogDir(self.log_dir_path(b), self.configs[b], seed=seed, node_id=b, created_ms=start_time_ms) for b in range(brokers)
        ]
        self._metadata = [MetadataLogWriter(self.log_dir_path(b)) for b in range(brokers)]
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._held: dict[TopicPartition, dict[int, list[HeldBatch]]] = {}
        self._dirty: set[int] = set(range(brokers))
        self._create_topics(topics, partitions, replication_factor)
        self._after_step()

    # -- set-up --

    def _create_topics(self, topics: tuple[str, ...], partitions: int, replication_factor: int) -> None:
        for writer in self._metadata:
            writer.append_leader_change(CONTROLLER_ID, [CONTROLLER_ID], timestamp=self.now_ms)
        self._write_metadata([FeatureLevelRecord("metadata.version", METADATA_VERSION_LEVEL)])
        for topic in topics:
            topic_id = self._brokers[0].topic_id(topic)
            assignment = assign_replicas(len(self._brokers), replication_factor, partitions, random.Random(f"{self.seed}:assignment:{topic}"))
            records: list = [TopicRecord(topic, topic_id)]
            for p, replicas in enumerate(assignment):
                tp = TopicPartition(topic, p)
                state = _Partition(topic_id, p, replicas, replicas, replicas[0])
                self._partitions[tp] = state
                self._held[tp] = {b: [] for b in replicas}
                records.append(PartitionRecord(partition_id=p, topic_id=topic_id, replicas=replicas, isr=replicas,
                                               leader=state.leader, leader_epoch=0, partition_epoch=0))
                for b in replicas:
                    self._brokers[b].partition(topic, p)
                self._become_leader(tp, state)
            # CreateTopics commits the topic and its partitions in one batch.
            self._write_metadata(records)

    def _become_leader(self, tp: TopicPartition, state: _Partition) -> None:
        """Partition.makeLeader: the epoch starts at the leader's log end offset, in its cache at once."""
        log = self.log(tp, state.leader)
        state.epoch_start_offset = log.log_end_offset
        log.epochs.assign(state.leader_epoch, state.epoch_start_offset)

    def _write_metadata(self, records: list) -> None:
        """The controller's records, as every broker's copy of the metadata log holds them."""
        for writer in self._metadata:
            writer.append(records, timestamp=self.now_ms)

    # -- what the cluster looks like --

    @property
    def brokers(self) -> list[int]:
        return list(range(len(self._brokers)))

    @property
    def topic_partitions(self) -> list[TopicPartition]:
        return sorted(self._partitions)

    def log_dir_path(self, broker: int) -> Path:
        return broker_log_dir(self.root, broker)

    def log_dir(self, broker: int) -> Path:
        """Broker ``broker``'s log dir (its meta.properties, partitions and metadata log)."""
        if not 0 <= broker < len(self._brokers):
            raise ValueError(f"there is no broker {broker}; the brokers are 0..{len(self._brokers) - 1}")
        return self.log_dir_path(broker)

    def topic_id(self, topic: str):
        return self._brokers[0].topic_id(topic)

    def _state(self, tp: TopicPartition) -> _Partition:
        try:
            return self._partitions[tp]
        except KeyError:
            raise ValueError(f"{tp} is not a partition of the simulated cluster") from None

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        return self._state(tp).replicas

    def isr(self, tp: TopicPartition) -> tuple[int, ...]:
        return self._state(tp).isr

    def leader(self, tp: TopicPartition) -> int:
        return self._state(tp).leader

    def leader_epoch(self, tp: TopicPartition) -> int:
        return self._state(tp).leader_epoch

    def partition_epoch(self, tp: TopicPartition) -> int:
        return self._state(tp).partition_epoch

    def followers(self, tp: TopicPartition) -> list[int]:
        state = self._state(tp)
        return [b for b in state.replicas if b != state.leader]

    def log(self, tp: TopicPartition, broker: int) -> PartitionLog:
        """Broker ``broker``'s replica of ``tp`` (to read; drive it through the simulation)."""
        if broker not in self._state(tp).replicas:
            raise ValueError(f"broker {broker} holds no replica of {tp} (its replicas: {self._state(tp).replicas})")
        return self._brokers[broker].partition(tp.topic, tp.partition)

    def logs(self, broker: int) -> dict[TopicPartition, PartitionLog]:
        return self._brokers[broker].logs

    def high_watermark(self, tp: TopicPartition, broker: int | None = None) -> int:
        return self.log(tp, self.leader(tp) if broker is None else broker).high_watermark

    def log_end_offset(self, tp: TopicPartition, broker: int | None = None) -> int:
        return self.log(tp, self.leader(tp) if broker is None else broker).log_end_offset

    def held_batches(self, tp: TopicPartition, broker: int) -> list[HeldBatch]:
        """The batches broker ``broker``'s replica holds, oldest first."""
        self.log(tp, broker)
        return list(self._held[tp][broker])

    # -- the leader --

    def append(self, tp: TopicPartition, batches: bytes | Iterable[bytes], *, log_append_time: int | None = None) -> list[AppendResult]:
        """Append batches on ``tp``'s leader, in its current leader epoch; each one's offsets come
        from the leader's log end offset (see :meth:`PartitionLog.append` for what it refuses)."""
        state = self._state(tp)
        if state.leader < 0:
            raise ValueError(f"{tp} has no leader")
        if isinstance(batches, (bytes, bytearray, memoryview)):
            batches = [batches]
        log = self.log(tp, state.leader)
        held = self._held[tp][state.leader]
        results = []
        for batch in batches:
            r = log.append(bytes(batch), leader_epoch=state.leader_epoch, log_append_time=log_append_time)
            data = self._read(tp, state.leader, r.segment_base_offset, r.position, r.size)
            held.append(HeldBatch(r.base_offset, r.last_offset, state.leader_epoch, r.segment_base_offset, r.position, r.size, _digest(data)))
            self.now_ms = max(self.now_ms, r.max_timestamp)
            results.append(r)
        # Partition.appendRecordsToLeader: with the ISR down to the leader, the HW follows at once.
        self._maybe_increment_leader_hw(tp)
        self._dirty.add(state.leader)
        self._after_step()
        return results

    def _maybe_increment_leader_hw(self, tp: TopicPartition) -> None:
        """Partition.maybeIncrementLeaderHW: the lowest log end offset of the leader and the ISR
        followers as the leader knows them (an unknown one holds it where it is); only upwards."""
        state = self._partitions[tp]
        log = self.log(tp, state.leader)
        candidate = log.log_end_offset
        for b in state.isr:
            if b != state.leader:
                known = state.follower_log_end.get(b)
                candidate = min(candidate, -1 if known is None else known)
        if candidate > log.high_watermark:
            log.update_high_watermark(candidate)
            self._dirty.add(state.leader)

    # -- followers --

    def replicate(self, tp: TopicPartition | None = None, broker: int | None = None, *, max_batches: int | None = None) -> int:
        """Followers fetch from their leader until caught up, or until each has taken ``max_batches``
        batches; returns the batches fetched. ``tp`` None: every partition; ``broker`` None: every
        follower of it (a broker that leads, or holds no replica, fetches nothing).

        A caught-up follower's last fetch returns nothing but tells the leader its log end offset;
        the high watermark it gets back is the one from before, so followers' lag the leader's
        until their next fetch.
        """
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"max_batches must be at least 1, not {max_batches}")
        if broker is not None:
            self.log_dir(broker)
        fetched = 0
        for t in ([tp] if tp is not None else self.topic_partitions):
            state = self._state(t)
            for b in ([broker] if broker is not None else list(state.replicas)):
                if b in state.replicas and b != state.leader:
                    fetched += self._catch_up(t, b, max_batches)
        self._after_step()
        return fetched

    def _catch_up(self, tp: TopicPartition, follower: int, max_batches: int | None) -> int:
        fetched = 0
        while True:
            budget = None if max_batches is None else max_batches - fetched
            n = self._fetch(tp, follower, budget)
            fetched += n
            if n == 0 or (max_batches is not None and fetched >= max_batches):
                return fetched

    def _fetch(self, tp: TopicPartition, follower: int, max_batches: int | None) -> int:
        """One fetch of ``follower`` from the leader; returns the batches it appended."""
        state = self._partitions[tp]
        if state.leader < 0:
            return 0
        leader_log, log = self.log(tp, state.leader), self.log(tp, follower)
        self._truncate_on_fetch(tp, follower, leader_log, log)
        fetch_offset = log.log_end_offset
        if fetch_offset < leader_log.log_start_offset:
            # OffsetOutOfRange: the leader deleted what the follower needs next
            # (AbstractFetcherThread.fetchOffsetAndTruncate starts the follower's log over there).
            self._record_truncation(tp, follower, fetch_offset, leader_log.log_start_offset)
            log.truncate_fully_and_start_at(leader_log.log_start_offset)
            self._held[tp][follower] = []
            fetch_offset = log.log_end_offset
        response_high_watermark = leader_log.high_watermark
        response_log_start_offset = leader_log.log_start_offset
        chunk = self._batches_from(tp, state.leader, fetch_offset, self.configs[follower].segment_bytes, max_batches)
        # The leader records where the follower is (Partition.updateFollowerFetchState), then
        # maybe takes it back into the ISR and moves its high watermark; the response was read before.
        state.follower_log_end[follower] = fetch_offset
        self._maybe_expand_isr(tp, follower)
        self._maybe_increment_leader_hw(tp)
        if chunk:
            data = b"".join(self._read(tp, state.leader, h.segment_base_offset, h.position, h.size) for h in chunk)
            for h, r in zip(chunk, log.append_as_follower(data)):
                self._held[tp][follower].append(
                    HeldBatch(r.base_offset, r.last_offset, h.leader_epoch, r.segment_base_offset, r.position, r.size, h.digest))
        # ReplicaFetcherThread.processPartitionData: the leader's HW, bounded by this log's end;
        # then the leader's log start offset.
        log.update_high_watermark(response_high_watermark)
        if log.log_start_offset < response_log_start_offset <= log.high_watermark:
            log.maybe_increment_log_start_offset(response_log_start_offset)
        self._dirty.update((follower, state.leader))
        return len(chunk)

    def _truncate_on_fetch(self, tp: TopicPartition, follower: int, leader_log: PartitionLog, log: PartitionLog) -> None:
        """Truncation on fetch: while the leader's answer for the follower's last epoch says the
        logs diverge (Partition's divergingEpoch), the follower truncates by
        AbstractFetcherThread.getOffsetTruncationState and asks again."""
        for _ in range(10_000):
            last_epoch = log.epochs.latest_epoch
            if last_epoch is None:
                return  # nothing to compare: the follower fetches from its log end (a fresh or emptied log)
            fetch_offset = log.log_end_offset
            epoch, end_offset = leader_log.epochs.end_offset_for(last_epoch, leader_log.log_end_offset)
            if epoch == UNDEFINED_EPOCH or end_offset == UNDEFINED_EPOCH_OFFSET:
                raise AssertionError(f"{tp}: leader has no epoch at or below {last_epoch}; the simulation's elections never leave that")
            if epoch >= last_epoch and end_offset >= fetch_offset:
                return
            own_epoch, own_end = log.epochs.end_offset_for(epoch, fetch_offset)
            if own_end == UNDEFINED_EPOCH_OFFSET:
                target = min(end_offset, fetch_offset)
            elif own_epoch != epoch:
                target = min(own_end, fetch_offset)  # an intermediate step: ask again with an older epoch
            else:
                target = min(own_end, end_offset, fetch_offset)
            self._truncate(tp, follower, target)
        raise AssertionError(f"{tp}: broker {follower} never agreed with its leader's lineage")

    def _truncate(self, tp: TopicPartition, broker: int, target: int) -> None:
        log = self.log(tp, broker)
        before = log.log_end_offset
        if log.truncate_to(target):
            self._held[tp][broker] = [h for h in self._held[tp][broker] if h.last_offset < target]
            self._record_truncation(tp, broker, before, target)
        self._dirty.add(broker)

    def _record_truncation(self, tp: TopicPartition, broker: int, log_end_offset: int, offset: int) -> None:
        self.truncations.append(Truncation(tp, broker, log_end_offset, offset))

    def _batches_from(self, tp: TopicPartition, leader: int, offset: int, limit: int, max_batches: int | None) -> list[HeldBatch]:
        """The leader's batches from ``offset``: at least one, then while the total stays within
        replica.fetch.max.bytes and the follower's segment.bytes (``limit``)."""
        held = self._held[tp][leader]
        i = bisect.bisect_left(held, offset, key=lambda h: h.base_offset)
        if i == len(held):
            return []
        if held[i].base_offset != offset:
            raise AssertionError(f"{tp}: offset {offset} is not a batch boundary in broker {leader}'s log")
        limit = min(limit, self.fetch_max_bytes)
        if held[i].size > limit:
            raise ValueError(f"{tp}: the {held[i].size}-byte batch at offset {offset} exceeds a follower's segment.bytes "
                             f"{limit}; lower segment_bytes_jitter or raise segment_bytes")
        chunk, size = [], 0
        for h in held[i:]:
            if size + h.size > limit or (max_batches is not None and len(chunk) >= max_batches):
                break
            chunk.append(h)
            size += h.size
        return chunk

    def _read(self, tp: TopicPartition, broker: int, segment_base_offset: int, position: int, size: int) -> bytes:
        path = self.log_dir_path(broker) / tp.dir_name / offset_file_name(segment_base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, size, position)
        finally:
            os.close(fd)
        if len(data) != size:
            raise AssertionError(f"{path}: {size} bytes expected at byte {position}, {len(data)} there")
        return data

    # -- the ISR and elections (what the controller writes) --

    def _maybe_expand_isr(self, tp: TopicPartition, follower: int) -> None:
        """Partition.isFollowerInSync: at or past the leader's HW and the start of its epoch."""
        state = self._partitions[tp]
        known = state.follower_log_end.get(follower)
        if follower in state.isr or known is None:
            return
        log = self.log(tp, state.leader)
        if known >= log.high_watermark and known >= state.epoch_start_offset:
            isr = tuple(b for b in state.replicas if b in state.isr or b == follower)
            self._change_partition(tp, isr=isr)

    def shrink_isr(self, tp: TopicPartition, brokers: int | Iterable[int]) -> tuple[int, ...]:
        """The leader drops followers from the ISR (after replica.lag.time.max.ms without catching
        up); returns the ISR. The leader itself cannot be dropped."""
        state = self._state(tp)
        drop = {brokers} if isinstance(brokers, int) else set(brokers)
        if state.leader in drop:
            raise ValueError(f"broker {state.leader} leads {tp}: a leader does not drop itself from the ISR")
        if not drop <= set(state.replicas):
            raise ValueError(f"{tp}'s replicas are {state.replicas}: no broker {sorted(drop - set(state.replicas))}")
        isr = tuple(b for b in state.isr if b not in drop)
        if isr != state.isr:
            self._change_partition(tp, isr=isr)
            self._maybe_increment_leader_hw(tp)
        self._after_step()
        return state.isr

    def elect(self, tp: TopicPartition, broker: int, *, unclean: bool = False) -> Election:
        """Make ``broker`` the leader of ``tp`` in the next leader epoch.

        Clean: ``broker`` must be in the ISR. Unclean: it must not be (were it, the election would
        be clean); it becomes the ISR alone, in leader recovery state RECOVERING, and starts its
        epoch at its own, shorter, log end offset: what the old lineage held above it is lost,
        and the other replicas truncate to the divergence point when they next fetch.
        """
        state = self._state(tp)
        if broker not in state.replicas:
            raise ValueError(f"broker {broker} holds no replica of {tp} (its replicas: {state.replicas})")
        if unclean and broker in state.isr:
            raise ValueError(f"broker {broker} is in {tp}'s ISR {state.isr}: its election would be clean")
        if not unclean and broker not in state.isr:
            raise ValueError(f"broker {broker} is not in {tp}'s ISR {state.isr}: only an unclean election can choose it")
        previous = state.leader
        if unclean:
            self._change_partition(tp, leader=broker, isr=(broker,), leader_recovery_state=LEADER_RECOVERY_RECOVERING)
        else:
            self._change_partition(tp, leader=broker)
        if broker != previous:
            # A new leader knows none of its followers' positions until they fetch (Replica.resetReplicaState).
            state.follower_log_end = {b: None for b in state.replicas if b != broker}
        self._become_leader(tp, state)
        self._maybe_increment_leader_hw(tp)
        election = Election(tp, previous, broker, state.leader_epoch, state.epoch_start_offset, unclean)
        self.elections.append(election)
        self._dirty.add(broker)
        self._after_step()
        return election

    def _change_partition(self, tp: TopicPartition, *, leader: int | None = None, isr: tuple[int, ...] | None = None,
                          leader_recovery_state: int | None = None) -> None:
        """A PartitionChangeRecord, replayed here as PartitionRegistration.merge replays it: a
        leader (even the same one) moves the epoch on; every change moves the partition epoch."""
        state = self._partitions[tp]
        if leader_recovery_state is None and state.recovering and leader is None:
            # The leader's first AlterPartition after an unclean election says it has recovered.
            leader_recovery_state = LEADER_RECOVERY_RECOVERED
        self._write_metadata([PartitionChangeRecord(
            partition_id=state.partition_id, topic_id=state.topic_id, isr=isr,
            leader=-2 if leader is None else leader,
            leader_recovery_state=-1 if leader_recovery_state is None else leader_recovery_state,
        )])
        if leader is not None:
            state.leader = leader
            state.leader_epoch += 1
        if isr is not None:
            state.isr = isr
        if leader_recovery_state is not None:
            state.recovering = leader_recovery_state == LEADER_RECOVERY_RECOVERING
        state.partition_epoch += 1

    # -- retention --

    def delete_old_segments(self, now_ms: int | None = None, *, retention_ms: int = -1, retention_bytes: int = -1,
                            tp: TopicPartition | None = None) -> dict[tuple[TopicPartition, int], list[int]]:
        """Every replica's own broker-side retention (:meth:`PartitionLog.delete_old_segments`),
        at ``now_ms`` (default: the simulation's clock, the newest timestamp appended); returns
        the base offsets each deleted. A follower also deletes below the log start offset it took
        from the leader."""
        now = self.now_ms if now_ms is None else now_ms
        deleted = {}
        for t in ([tp] if tp is not None else self.topic_partitions):
            for b in self._state(t).replicas:
                bases = self.log(t, b).delete_old_segments(now, retention_ms=retention_ms, retention_bytes=retention_bytes)
                if bases:
                    gone = set(bases)
                    self._held[t][b] = [h for h in self._held[t][b] if h.segment_base_offset not in gone]
                    deleted[(t, b)] = bases
                    self._dirty.add(b)
        self._after_step()
        return deleted

    # -- the oracle --

    def expected_batches(self, tp: TopicPartition, *, below: int | None = None) -> list[tuple[HeldBatch, bytes]]:
        """The current leader's batches below its high watermark (what a consumer may read), or
        below ``below`` (a new leader's high watermark lags what the old one committed until its
        followers fetch), with their bytes, each checked against the digest taken when it was
        appended or fetched."""
        state = self._state(tp)
        log = self.log(tp, state.leader)
        bound = log.high_watermark if below is None else below
        out = []
        for h in self._held[tp][state.leader]:
            if h.last_offset >= bound:
                break
            if h.last_offset < log.log_start_offset:
                continue
            data = self._read(tp, state.leader, h.segment_base_offset, h.position, h.size)
            if _digest(data) != h.digest:
                raise AssertionError(f"{tp}: broker {state.leader}'s batch at offset {h.base_offset} is not the bytes it appended")
            out.append((h, data))
        return out

    def expected_records(self, tp: TopicPartition, *, below: int | None = None) -> list[ExpectedRecord]:
        """For each offset of the current lineage from the leader's log start offset to its high
        watermark (or ``below``, see :meth:`expected_batches`): the record there, its batch's leader
        epoch and base offset (control records included, flagged), so a test can assert a reader
        returns exactly this lineage's record."""
        start = self.log(tp, self.leader(tp)).log_start_offset
        out = []
        for h, data in self.expected_batches(tp, below=below):
            [header] = scan_batches(data, verify_crc=True).batches
            for r in decode_batch(data, header):
                if r.offset >= start:
                    out.append(ExpectedRecord(r.offset, h.leader_epoch, h.base_offset, r.timestamp, r.key, r.value,
                                              tuple(r.headers), header.is_control))
        return out

    def lineage(self, tp: TopicPartition, broker: int | None = None) -> list[EpochEntry]:
        """A replica's leader-epoch lineage (default: the leader's)."""
        return self.log(tp, self.leader(tp) if broker is None else broker).epochs.entries

    # -- files --

    def _after_step(self) -> None:
        if self.auto_checkpoint:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Write the offset checkpoints of every broker changed since the last ones."""
        for b in sorted(self._dirty):
            self._brokers[b].checkpoint()
        self._dirty.clear()

    def close(self) -> None:
        self._dirty.update(self.brokers)
        self.checkpoint()
        for broker in self._brokers:
            broker.close()
        for writer in self._metadata:
            writer.close()

    def __enter__(self) -> ClusterSimulation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _validate(brokers: int, replication_factor: int, topics: tuple[str, ...], partitions: int, jitter: float,
              fetch_max_bytes: int) -> None:
    if not 1 <= brokers <= 1000:
        raise ValueError(f"brokers must be 1..1000, not {brokers}")
    if not 1 <= replication_factor <= brokers:
        raise ValueError(f"replication factor must be 1..{brokers} (the brokers), not {replication_factor}")
    if not topics:
        raise ValueError("topics: at least one topic is needed")
    for topic in topics:
        if (problem := topic_name_problem(topic)) is not None:
            raise ValueError(f"topics: {problem}")
    if len(set(topics)) != len(topics):
        raise ValueError("topics: a topic is listed twice")
    if not 1 <= partitions <= 10_000:
        raise ValueError(f"partitions must be 1..10000, not {partitions}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"segment_bytes_jitter must be at least 0 and below 1, not {jitter}")
    if fetch_max_bytes < 1:
        raise ValueError(f"fetch_max_bytes must be at least 1, not {fetch_max_bytes}")


__all__ = ["ClusterSimulation", "Election", "ExpectedRecord", "HeldBatch", "Truncation", "assign_replicas", "broker_log_dir"]
