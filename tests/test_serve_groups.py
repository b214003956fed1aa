"""Consumer groups through `kts serve` (issue 29's "Group consumption"): a group of two consumers
over four tiered partitions reads every record exactly once; it commits, `kts serve` is restarted,
and the group resumes from the committed offsets, no record twice and none skipped; `kts groups`
shows the offsets and the lag. The group is two confluent-kafka consumers before the restart, and
a kafka-python and an aiokafka consumer after it (whose only assignor in common, roundrobin, the
coordinator must choose), so the three clients' group protocols meet the one coordinator.

Each consumer counts a polled batch only once its commit succeeded: a batch whose commit a
rebalance refused is read again by the partition's next owner from the committed offset, so the
union of what was counted is exactly the log when the coordinator gets generations right."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .partition_steps import copy_each_partition
from .test_serve import Connection, delete_copied_segments, original_records, start_serve
from .test_sync_outcome import kts

TOPIC = "clicks"
PARTITIONS = 4
GROUP = "click-counters"
# No transactions: every offset below the end is a record, so committed offsets count records.
CONFIG = SimulationConfig(seed=2904, topics=(TOPIC,), partitions=PARTITIONS, total_bytes=160 * 1024, segment_bytes=16 * 1024,
                          batch_size=4 * 1024, codecs=("none", "lz4", "zstd"), transactional_producers=0)
# Members notice a rebalance at their next heartbeat: a short interval keeps the test short.
HEARTBEAT_MS, SESSION_MS = 300, 6000
DEADLINE_S = 90


@pytest.fixture
def clicks(tmp_path, pg_url, metadata_store):
    """Four partitions copied to a file tier, their copied segments then deleted locally."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, CONFIG)
    originals = tmp_path / "originals"
    shutil.copytree(log_dir, originals)
    remote = tmp_path / "remote"
    for result in copy_each_partition(LogDir(log_dir), metadata_store, remote_storage_from_uri(remote.as_uri())):
        assert result.copied, result
        delete_copied_segments(log_dir, result.topic_partition, max(md.end_offset for md in result.copied))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote.as_uri()}
    return env, originals


class Ledger:
    """The (partition, offset) of every record the group's members counted, shared by their threads;
    done once ``enough`` are counted and the two members have been seen sharing the partitions (a
    member that starts late joins a generation of its own, and the partitions split at the next)."""

    def __init__(self, enough: int):
        self.enough = enough
        self.read: list[tuple[int, int]] = []
        self.assignments: dict[int, set[frozenset[int]]] = {}  # every assignment each member polled with
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def assigned(self, member: int, partitions) -> None:
        with self.lock:
            self.assignments.setdefault(member, set()).add(frozenset(tp.partition for tp in partitions))

    def count(self, records: list[tuple[int, int]]) -> None:
        with self.lock:
            self.read += records

    def split(self) -> bool:
        """Whether the two members polled, in one generation, with the partitions split between them."""
        return any(a and b and not a & b and a | b == set(range(PARTITIONS))
                   for a in self.assignments.get(0, ()) for b in self.assignments.get(1, ()))

    def done(self) -> bool:
        with self.lock:
            return (len(self.read) >= self.enough and self.split()) or bool(self.errors)


def confluent_member(member: int, bootstrap: str, ledger: Ledger) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "heartbeat.interval.ms": HEARTBEAT_MS,
                         "session.timeout.ms": SESSION_MS})
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + DEADLINE_S
        while not ledger.done() and time.monotonic() < deadline:
            messages = consumer.consume(num_messages=50, timeout=0.3)
            ledger.assigned(member, consumer.assignment())
            for m in messages:
                if m.error():
                    raise KafkaException(m.error())
            if not messages:
                continue
            ends: dict[int, int] = {}
            for m in messages:
                ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
            try:
                consumer.commit(offsets=[TopicPartition(TOPIC, p, end) for p, end in ends.items()], asynchronous=False)
            except KafkaException:
                continue  # refused for a rebalance: the partitions' next owner reads these again
            ledger.count([(m.partition(), m.offset()) for m in messages])
    except BaseException as e:  # noqa: BLE001 - reported by the test
        ledger.errors.append(e)
    finally:
        consumer.close()


def kafka_python_member(member: int, bootstrap: str, ledger: Ledger) -> None:
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka.errors import CommitFailedError, KafkaError

    consumer = KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False,
                             auto_offset_reset="earliest", heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not ledger.done() and time.monotonic() < deadline:
            polled = consumer.poll(timeout_ms=300, max_records=50)
            ledger.assigned(member, consumer.assignment())
            records = [r for batch in polled.values() for r in batch]
            if not records:
                continue
            ends = {tp: OffsetAndMetadata(max(r.offset for r in batch) + 1, "", -1) for tp, batch in polled.items()}
            try:
                consumer.commit(ends)
            except (CommitFailedError, KafkaError):
                continue
            ledger.count([(r.partition, r.offset) for r in records])
    except BaseException as e:  # noqa: BLE001
        ledger.errors.append(e)
    finally:
        consumer.close()


def aiokafka_member(member: int, bootstrap: str, ledger: Ledger) -> None:
    asyncio.run(_aiokafka_member(member, bootstrap, ledger))


async def _aiokafka_member(member: int, bootstrap: str, ledger: Ledger) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import CommitFailedError, KafkaError
    from aiokafka.structs import OffsetAndMetadata

    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False,
                                auto_offset_reset="earliest", heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS)
    try:
        await consumer.start()
        deadline = time.monotonic() + DEADLINE_S
        while not ledger.done() and time.monotonic() < deadline:
            polled = await consumer.getmany(timeout_ms=300, max_records=50)
            ledger.assigned(member, consumer.assignment())
            records = [r for batch in polled.values() for r in batch]
            if not records:
                continue
            try:
                await consumer.commit({tp: OffsetAndMetadata(max(r.offset for r in batch) + 1, "") for tp, batch in polled.items()})
            except (CommitFailedError, KafkaError):
                continue
            ledger.count([(r.partition, r.offset) for r in records])
    except BaseException as e:  # noqa: BLE001
        ledger.errors.append(e)
    finally:
        await consumer.stop()


def run_group(members, bootstrap: str, ledger: Ledger) -> None:
    threads = [threading.Thread(target=member, args=(i, bootstrap, ledger)) for i, member in enumerate(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE_S + 30)
    assert not ledger.errors, ledger.errors
    assert len(ledger.read) >= ledger.enough, f"{len(ledger.read)} of {ledger.enough} records read before the deadline"
    assert ledger.split(), ledger.assignments  # a group of two: each member its share of the partitions


def stop(server) -> None:
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=20) == 0


def groups_json(env) -> list[dict]:
    result = kts(env, "groups", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def find_coordinator(conn: Connection, version: int, key_type: int = 0):
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

    if version < 4:
        return conn.request(FindCoordinatorRequest[version](key=GROUP, key_type=key_type), FindCoordinatorResponse)
    answer = conn.request(FindCoordinatorRequest[version](key_type=key_type, coordinator_keys=[GROUP]), FindCoordinatorResponse)
    [coordinator] = answer.coordinators
    return coordinator


def test_a_group_of_two_reads_four_partitions_exactly_once_across_a_restart_of_kts_serve(clicks, tmp_path):
    env, originals = clicks
    server = start_serve(env, tmp_path)
    try:
        from kafka import KafkaConsumer, TopicPartition

        probe = KafkaConsumer(bootstrap_servers=server.bootstrap)
        ends = {tp.partition: end for tp, end in probe.end_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)]).items()}
        probe.close()
        expected = {(p, r[0]) for p in range(PARTITIONS)
                    for r in original_records(originals / f"{TOPIC}-{p}", read_committed=False) if r[0] < ends[p]}
        assert len(expected) == sum(ends.values()) > 200  # dense offsets: each one a record

        conn = Connection(server.port)
        try:  # kts serve coordinates every group itself; transactions it refuses (it takes no writes)
            for version in (1, 4):
                answer = find_coordinator(conn, version)
                assert (answer.error_code, answer.node_id, answer.host, answer.port) == (0, 0, "127.0.0.1", server.port)
            assert find_coordinator(conn, 4, key_type=1).error_code == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        finally:
            conn.close()

        before = Ledger(enough=len(expected) // 2)
        run_group((confluent_member, confluent_member), server.bootstrap, before)
        assert len(set(before.read)) == len(before.read)  # none twice within the first group either
    finally:
        stop(server)

    # The coordinator is gone with its process; the offsets are in the store.
    committed = groups_json(env)
    assert {row["partition"] for row in committed} <= set(range(PARTITIONS)) and committed
    assert all(row["group"] == GROUP and row["topic"] == TOPIC and row["log_end_offset"] == ends[row["partition"]]
               for row in committed)
    assert sum(row["lag"] for row in committed) + sum(ends[p] for p in set(range(PARTITIONS)) - {r["partition"] for r in committed}) \
        == len(expected) - len(before.read)

    server = start_serve(env, tmp_path)
    try:
        after = Ledger(enough=len(expected) - len(before.read))
        run_group((kafka_python_member, aiokafka_member), server.bootstrap, after)
        from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse

        conn = Connection(server.port)
        try:  # ListGroups and DescribeGroups: the group is there, Empty once its members left
            listed = conn.request(ListGroupsRequest[4](states_filter=[]), ListGroupsResponse).groups
            assert [(g.group_id, g.protocol_type, g.group_state) for g in listed] == [(GROUP, "consumer", "Empty")]
            [described] = conn.request(DescribeGroupsRequest[5](groups=[GROUP], include_authorized_operations=False),
                                       DescribeGroupsResponse).groups
            assert (described.error_code, described.group_state, described.members) == (0, "Empty", [])
        finally:
            conn.close()
    finally:
        stop(server)

    everything = Counter(before.read + after.read)
    assert [key for key, n in everything.items() if n > 1] == []  # no record twice
    assert set(everything) == expected  # none skipped
    final = groups_json(env)
    assert [(row["partition"], row["committed_offset"], row["lag"]) for row in final] == \
        [(p, ends[p], 0) for p in range(PARTITIONS)]
    table = kts(env, "groups").stdout.splitlines()
    assert table[0].split() == ["group", "topic", "partition", "committed_offset", "log_end_offset", "lag"]
    assert table[1].split() == [GROUP, TOPIC, "0", str(ends[0]), str(ends[0]), "0"]


def test_a_commit_replaces_the_partitions_earlier_commit_and_leaves_the_others(metadata_store):
    from kts_resources.metadata.group_offsets import CommittedOffset, GroupOffsets

    offsets = GroupOffsets(metadata_store.engine)
    offsets.commit("g", [CommittedOffset("t", 0, 10, 3, "first"), CommittedOffset("t", 1, 20)])
    offsets.commit("g", [CommittedOffset("t", 0, 15, 4, None)])
    offsets.commit("other", [CommittedOffset("t", 0, 1)])
    assert offsets.committed("g") == {("t", 0): CommittedOffset("t", 0, 15, 4, None), ("t", 1): CommittedOffset("t", 1, 20)}
    assert list(offsets.all_groups()) == ["g", "other"]
