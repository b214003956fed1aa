"""A replicated cluster with a kts beside each broker, one store and one tier (issue 30's acceptance):
the driver the cluster scenario and the property test share.

A broker's kts pass is what `kts sync` does to the tier, without Dagster and Spark around it: the
copy procedure over the broker's partitions (refused where the broker's KRaft metadata log says
another broker leads, when ``leaders_from_metadata_log``), then expiry. The oracle is the
simulator's: the current leader's records up to its high watermark.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from kts_resources.tiering.copier import copy_partition
from kts_resources.tiering.expiry import expire_partition, plan_partition
from kts_resources.kafka.simulator.cluster_simulation import ClusterSimulation
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.tiering.leadership import broker_replicas
from kts_resources.tiering.lineage import epoch_ranges
from kts_resources.tiering.lost_ranges import uncovered
from kts_resources.tiering.quotas import ManualClock
from kts_resources.reading.reader import OffsetOutOfRangeError, PartitionReader
from kts_resources.tiering.retention import BY_SIZE
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.tiering.tiers import LocatedPartition, topic_id_partition

T0 = 1_700_000_000_000
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@dataclass
class KtsBesideEachBroker:
    cluster: ClusterSimulation
    store: object
    storage: object
    leaders_from_metadata_log: bool = True
    clock: ManualClock = field(default_factory=lambda: ManualClock(T0))
    produced: int = 0
    copied_bytes: int = 0
    # After each leader's expiry under retention.bytes: (partition, limit, unique bytes kept in the
    # tier, the leader's bytes not in the tier, the largest segment serving, whether it deleted by size).
    retained: list = field(default_factory=list)
    _high: dict = field(default_factory=dict)  # partition → the committed end so far (see _committed)
    _elections_seen: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- the cluster ---

    def produce(self, tp: TopicPartition, batches: int, rng: random.Random) -> None:
        out = []
        for _ in range(batches):
            self.produced += 1
            n = rng.randint(1, 4)
            # Timestamps grow with every batch produced, so along any lineage they ascend.
            stamp = T0 + self.produced * 1000
            out.append(build_batch([NewRecord(stamp + i, f"{tp}-{self.produced}-{i}".encode(),
                                              f"{tp} batch {self.produced} record {i} ".encode() * rng.randint(2, 8))
                                    for i in range(n)], base_offset=0))
        self.cluster.append(tp, out)
        self.clock.sleep(1000)

    # --- kts ---

    def sync(self, broker: int) -> None:
        """One pass of the kts beside ``broker``: copy, then expiry (the remote part on the leader
        only, where leadership is known), as `kts sync` runs them."""
        log_dir = LogDir(self.cluster.log_dir(broker))
        replicas = broker_replicas([log_dir.path]) if self.leaders_from_metadata_log else None
        for partition in log_dir.partitions():
            tp = partition.topic_partition
            refusal = replicas.copy_refusal(tp) if replicas is not None else None
            result = copy_partition(partition, log_dir, self.store, self.storage, broker_id=broker, clock=self.clock,
                                    not_leader=refusal)
            assert result.stopped is None, result.stopped
            self.copied_bytes += result.copied_bytes
        for partition in log_dir.partitions():
            tp = partition.topic_partition
            located = LocatedPartition(partition.path.name, log_dir, partition, owned=False)
            leads = replicas is None or replicas.copy_refusal(tp) is None
            tip = topic_id_partition(partition, self.store)
            plan = plan_partition(located, tip, self.store, now_ms=self.clock.now_ms())
            by_size = any(e.reason == BY_SIZE for e in plan.remote.expired)
            expire_partition(plan, located, self.store, self.storage, clock=self.clock, remote=leads)
            limit = self.store.topic_configs(tp.topic).retention_bytes
            if replicas is not None and leads and limit >= 0:
                # What the leader's retention left, with what it counted as local only then.
                spans = self.spans(tp)
                with self._lock:
                    self.retained.append((tp, limit, sum(span.size_bytes for span in spans), self.only_local_bytes(tp, broker, spans),
                                          max((span.segment.segment_size_in_bytes for span in spans), default=0), by_size))

    def sync_two_at_once(self, a: int, b: int) -> None:
        errors: list[BaseException] = []

        def run(broker: int) -> None:
            try:
                self.sync(broker)
            except BaseException as e:  # noqa: BLE001 — surfaced below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(x,)) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def reader(self, tp: TopicPartition) -> PartitionReader:
        """A remote-only reader: no log dir, the shared store and tier."""
        return PartitionReader(tp.topic, tp.partition, located=None, store=self.store, rsm=self.storage, index_dir=None)

    # --- the invariant ---

    def check_reads(self, tp: TopicPartition) -> int:
        """Every offset from the log start offset to the latest tiered one reads exactly the current
        leader lineage's record; ListOffsets by timestamp and latest-tiered agree. Returns how
        many offsets were read."""
        leader = self.cluster.leader(tp)
        expected = {r.offset: r for r in self.cluster.expected_records(tp, below=min(self._committed(tp), self.cluster.log_end_offset(tp, leader)))}
        tip = self.store_tip(tp)
        if tip is None or not self.store.list_remote_log_segments(tip, states={FINISHED}):
            return 0  # nothing of the partition tiered yet
        reader = self.reader(tp)
        if reader.highest_remote_offset < 0:
            return 0
        latest = reader.offsets("latest-tiered")
        assert latest.offset in expected, f"{tp}: latest tiered {latest.offset} is not a committed offset of the lineage"
        assert latest.leader_epoch == expected[latest.offset].leader_epoch, f"{tp}: latest tiered's epoch"
        offset, read = reader.log_start_offset, 0
        while offset <= reader.highest_remote_offset:
            try:
                result = reader.fetch(offset, 8192)
            except OffsetOutOfRangeError as e:
                raise AssertionError(f"{tp}: offset {offset} is committed and tiered, yet: {e}") from None
            assert result.records, f"{tp}: an empty fetch at {offset}"
            for record in result.records:
                if record.offset > reader.highest_remote_offset:
                    break
                want = expected.get(record.offset)
                assert want is not None, f"{tp}: offset {record.offset} read from the tier is not a committed offset"
                assert (record.key, record.value, record.leader_epoch) == (want.key, want.value, want.leader_epoch), (
                    f"{tp}: offset {record.offset} read {record.value!r} in epoch {record.leader_epoch}, "
                    f"the lineage holds {want.value!r} in epoch {want.leader_epoch}")
                read += 1
            offset = result.next_offset
        tiered = [r for o, r in sorted(expected.items()) if reader.log_start_offset <= o <= reader.highest_remote_offset]
        for r in tiered[:: max(1, len(tiered) // 5)]:
            found = reader.offsets(r.timestamp)
            first = next(x for x in tiered if x.timestamp >= r.timestamp)
            assert found.offset == first.offset, f"{tp}: ListOffsets({r.timestamp}) gave {found.offset}, the lineage's is {first.offset}"
        return read

    def _committed(self, tp: TopicPartition) -> int:
        """The partition's committed end: the highest high watermark any replica of the current
        lineage ever reached. A new leader's own lags until its followers fetch, and every replica's
        can be below what an earlier leader committed, which a clean election keeps; an unclean
        election keeps only what the new leader had."""
        for election in self.cluster.elections[self._elections_seen.get(tp, 0):]:
            if election.topic_partition == tp and election.unclean:
                self._high[tp] = min(self._high.get(tp, 0), election.start_offset)
        self._elections_seen[tp] = len(self.cluster.elections)
        now = max(self.cluster.high_watermark(tp, b) for b in self.cluster.replicas(tp) if self._agrees_with_leader(tp, b))
        self._high[tp] = max(self._high.get(tp, 0), now)
        return self._high[tp]

    def _agrees_with_leader(self, tp: TopicPartition, broker: int) -> bool:
        """Whether ``broker``'s lineage is a prefix of the leader's, up to its high watermark."""
        from kts_resources.tiering.lineage import diverges_at

        point = diverges_at(self.cluster.lineage(tp, broker), self.cluster.lineage(tp))
        return point is None or point >= self.cluster.high_watermark(tp, broker)

    def answers(self) -> dict:
        """What a remote-only reader answers for each partition: its log start offset, latest
        tiered offset and epoch, and every tiered record."""
        out = {}
        for tp in self.cluster.topic_partitions:
            if not self.spans(tp):
                out[str(tp)] = None
                continue
            reader = self.reader(tp)
            records, offset = {}, reader.log_start_offset
            while offset <= reader.highest_remote_offset:
                result = reader.fetch(offset, 65536)
                records.update((r.offset, (r.leader_epoch, r.key, r.value)) for r in result.records)
                offset = result.next_offset
            latest = reader.offsets("latest-tiered")
            out[str(tp)] = (reader.log_start_offset, latest.offset, latest.leader_epoch, records)
        return out

    def scrub_is_clean(self) -> None:
        from kts_resources.maintenance.scrub import scrub

        report = scrub(self.store, self.storage, deep=True)
        assert report.clean, report.problems

    def store_tip(self, tp: TopicPartition) -> TopicIdPartition | None:
        topic_id = self.store.topic_id(tp.topic)
        return None if topic_id is None else TopicIdPartition(topic_id, tp)

    def unique_tiered_bytes(self) -> int:
        """Every record ever tiered, once: the bytes of each (leader epoch, offset) the first segment
        to hold it brought (the old leader's records tiered before an unclean election included:
        they were its to copy), by offsets within each segment."""
        total = 0
        every = set(RemoteLogSegmentState) - {RemoteLogSegmentState.COPY_SEGMENT_STARTED}  # uploads that finished
        for tp in self.cluster.topic_partitions:
            tip = self.store_tip(tp)
            if tip is None:
                continue
            seen: dict[int, list[tuple[int, int]]] = {}
            for md in sorted(self.store.list_remote_log_segments(tip, states=every), key=lambda md: md.event_timestamp_ms):
                per_offset = md.segment_size_in_bytes / (md.end_offset - md.start_offset + 1)
                for epoch, first, last in epoch_ranges(md):
                    new = sum(b - a + 1 for a, b in uncovered(first, last, seen.setdefault(epoch, [])))
                    total += round(new * per_offset)
                    seen[epoch].append((first, last))
        return total

    def only_local_bytes(self, tp: TopicPartition, broker: int, spans: list) -> int:
        """``broker``'s bytes past what the tier holds (``spans``), its active segment included."""
        highest = spans[-1].end_offset if spans else -1
        return sum(s.size for s in self.cluster.log(tp, broker).segments() if s.base_offset > highest)

    def spans(self, tp: TopicPartition) -> list:
        tip = self.store_tip(tp)
        if tip is None or not self.store.list_remote_log_segments(tip, states={FINISHED}):
            return []
        return self.reader(tp).spans
