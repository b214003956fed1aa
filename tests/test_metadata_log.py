"""KRaft's metadata log, as kts reads it beside a broker: the record bytes exactly as Kafka's JSON
schemas lay them out (written out by hand here, and by kio, a library generated from those schemas),
the replay of partition leadership (PartitionRegistration.merge: when the leader epoch moves), the
newest snapshot plus the log after it, metadata transactions, a torn active segment, and damage
reported as one line naming the file and byte."""


import datetime as dt
import io
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.kafka.simulator.broker_log import LogConfig
from kts_resources.kafka.errors import KafkaFormatError
from kts_resources.kafka.metadata_log import (
    LEADER_CHANGE,
    METADATA_PARTITION_DIR,
    NO_LEADER,
    NO_LEADER_CHANGE,
    SNAPSHOT_FOOTER,
    SNAPSHOT_HEADER,
    AbortTransactionRecord,
    BeginTransactionRecord,
    BrokerEndpoint,
    EndTransactionRecord,
    FeatureLevelRecord,
    Leadership,
    LeaderChangeMessage,
    MetadataLogError,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    TopicRecord,
    UnknownRecord,
    Voter,
    decode_message,
    decode_record,
    encode_message,
    encode_record,
    encode_snapshot,
    list_snapshots,
    merge_partition_change,
    read_cluster_metadata,
)
from kts_resources.kafka.simulator.metadata_log_writer import MetadataLogWriter
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import NewRecord, build_batch, scan_batches

ORDERS = uuid.UUID("0102030405060708090a0b0c0d0e0f10")
PAYMENTS = uuid.UUID("1112131415161718191a1b1c1d1e1f20")
# Small segments and indexes: rolls happen, and no test writes 10 MiB index files.
SMALL = LogConfig(segment_bytes=700, segment_index_bytes=4096)


def partition_dir(root: Path) -> Path:
    return root / METADATA_PARTITION_DIR


def segment_logs(root: Path) -> list[Path]:
    return sorted(partition_dir(root).glob("*.log"))


def create_orders(writer: MetadataLogWriter, partitions: int = 2, replicas=(1, 2, 3)) -> None:
    writer.append([FeatureLevelRecord("metadata.version", 21), TopicRecord("orders", ORDERS)])
    writer.append([PartitionRecord(partition_id=p, topic_id=ORDERS, replicas=replicas, isr=replicas,
                                   leader=replicas[p % len(replicas)], leader_epoch=0, partition_epoch=0)
                   for p in range(partitions)])


# --- the bytes, written out by hand from the JSON schemas -----------------------------------------


def test_a_topic_record_is_framed_and_laid_out_as_its_schema_says():
    value = (
        b"\x01"  # frame version 1 (unsigned varint)
        b"\x02"  # api key 2: TopicRecord
        b"\x00"  # version 0
        b"\x07orders"  # Name: compact string, length + 1
        + ORDERS.bytes  # TopicId: 16 bytes
        + b"\x00"  # no tagged fields
    )
    assert decode_record(value) == TopicRecord("orders", ORDERS)
    assert encode_record(TopicRecord("orders", ORDERS)) == value


def test_a_partition_record_v0_carries_its_fields_in_schema_order_and_recovery_state_as_tag_0():
    value = (
        b"\x01\x03\x00"  # frame 1, PartitionRecord, version 0
        + struct.pack(">i", 4)  # PartitionId
        + ORDERS.bytes  # TopicId
        + b"\x04" + struct.pack(">3i", 1, 2, 3)  # Replicas: compact array of 3
        + b"\x03" + struct.pack(">2i", 1, 2)  # Isr
        + b"\x01"  # RemovingReplicas: empty
        + b"\x01"  # AddingReplicas: empty
        + struct.pack(">i", 2)  # Leader
        + struct.pack(">i", 7)  # LeaderEpoch (LeaderRecoveryState is tagged, so not here)
        + struct.pack(">i", 9)  # PartitionEpoch
        + b"\x01"  # one tagged field
        + b"\x00\x01\x01"  # tag 0 (LeaderRecoveryState), 1 byte, RECOVERING
    )
    record = PartitionRecord(partition_id=4, topic_id=ORDERS, replicas=(1, 2, 3), isr=(1, 2), leader=2,
                             leader_recovery_state=1, leader_epoch=7, partition_epoch=9)
    assert decode_record(value) == record
    assert encode_record(record) == value


def test_a_partition_record_v2_adds_directories_in_place_and_the_elr_as_tags_1_and_2():
    directory = uuid.UUID(int=7)
    value = (
        b"\x01\x03\x02"
        + struct.pack(">i", 0) + ORDERS.bytes
        + b"\x02" + struct.pack(">i", 1) + b"\x02" + struct.pack(">i", 1) + b"\x01\x01"
        + struct.pack(">iii", 1, 3, 4)  # Leader, LeaderEpoch, PartitionEpoch
        + b"\x02" + directory.bytes  # Directories (version 1+): compact array of one uuid
        + b"\x02"  # two tagged fields, ascending
        + b"\x01\x05\x02" + struct.pack(">i", 1)  # tag 1 EligibleLeaderReplicas [1]
        + b"\x02\x01\x01"  # tag 2 LastKnownElr: an empty array
    )
    record = PartitionRecord(partition_id=0, topic_id=ORDERS, replicas=(1,), isr=(1,), leader=1, leader_epoch=3,
                             partition_epoch=4, directories=(directory,), eligible_leader_replicas=(1,),
                             last_known_elr=(), version=2)
    assert decode_record(value) == record
    assert encode_record(record) == value


def test_a_partition_change_record_carries_what_changed_as_tagged_fields():
    value = (
        b"\x01\x05\x00"  # frame 1, PartitionChangeRecord, version 0
        + struct.pack(">i", 3) + ORDERS.bytes  # PartitionId, TopicId: the only untagged fields
        + b"\x02"  # two tagged fields
        + b"\x00\x09\x03" + struct.pack(">2i", 2, 3)  # tag 0 Isr: 9 bytes, [2, 3]
        + b"\x01\x04" + struct.pack(">i", 2)  # tag 1 Leader: 4 bytes, 2
    )
    record = PartitionChangeRecord(partition_id=3, topic_id=ORDERS, isr=(2, 3), leader=2)
    assert decode_record(value) == record
    assert encode_record(record) == value
    # Nothing changed but the partition: Leader −2 and every null array are left out.
    assert encode_record(PartitionChangeRecord(partition_id=3, topic_id=ORDERS)) == (
        b"\x01\x05\x00" + struct.pack(">i", 3) + ORDERS.bytes + b"\x00")


def test_remove_topic_and_feature_level_records():
    assert decode_record(b"\x01\x09\x00" + ORDERS.bytes + b"\x00") == RemoveTopicRecord(ORDERS)
    value = b"\x01\x0c\x00" + b"\x11metadata.version" + struct.pack(">h", 21) + b"\x00"
    assert decode_record(value) == FeatureLevelRecord("metadata.version", 21)
    assert encode_record(FeatureLevelRecord("metadata.version", 21)) == value


def test_a_register_broker_record_with_endpoints_round_trips_and_a_replay_skips_it():
    record = RegisterBrokerRecord(broker_id=2, incarnation_id=uuid.UUID(int=9), broker_epoch=40,
                                  end_points=(BrokerEndpoint("PLAINTEXT", "localhost", 9092, 0),), rack=None,
                                  fenced=False, in_controlled_shutdown=False, log_dirs=(uuid.UUID(int=5),), version=3)
    assert decode_record(encode_record(record)) == record
    assert decode_record(encode_record(record), only=frozenset({2})) == UnknownRecord(0, 3)


def test_unknown_tagged_fields_are_skipped_and_unknown_record_types_are_returned_unread():
    with_tag_30 = b"\x01\x02\x00\x07orders" + ORDERS.bytes + b"\x01" + b"\x1e\x02ab"
    assert decode_record(with_tag_30) == TopicRecord("orders", ORDERS)
    assert decode_record(b"\x01\x63\x04whatever") == UnknownRecord(99, 4)


@pytest.mark.parametrize("value, words", [
    (b"\x00\x02\x00", "frame version 0"),
    (b"\x02\x02\x00", "unknown frame version 2"),
    (b"\x01\x03\x03" + b"\x00" * 40, "PartitionRecord version 3 is newer than kts reads (0-2)"),
    (b"\x01\x02\x00\x07ord", "runs past"),
    (b"\x01\x02\x00\x07orders" + ORDERS.bytes + b"\x00\x00", "1 bytes of garbage after the TopicRecord"),
    (b"\x01\x05\x00" + b"\x00" * 20 + b"\x01\x00\x09\x05", "runs past"),
    (b"\x01\x02\x00\x00" + ORDERS.bytes + b"\x00", "name is null"),
])
def test_malformed_records_are_refused_saying_why(value, words):
    with pytest.raises(MetadataLogError, match=words.replace("(", r"\(").replace(")", r"\)")):
        decode_record(value)


# --- an independent writer: kio, generated from Kafka's JSON schemas --------------------------------


def kio_bytes(entity) -> bytes:
    from kio.serial import entity_writer

    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def test_kafkas_control_records_as_kio_writes_them_decode_and_encode_alike():
    from kio.schema.leader_change_message.v0.data import LeaderChangeMessage as KioLeaderChange
    from kio.schema.leader_change_message.v0.data import Voter as KioVoter
    from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord as KioFooter
    from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord as KioHeader
    from kio.static.primitive import i16, i32, i64

    header = kio_bytes(KioHeader(version=i16(0), last_contained_log_timestamp=i64(1_700_000_000_123)))
    assert decode_message(SnapshotHeaderRecord, header, 0) == SnapshotHeaderRecord(0, 1_700_000_000_123)
    assert encode_message(SnapshotHeaderRecord(0, 1_700_000_000_123)) == header
    footer = kio_bytes(KioFooter(version=i16(0)))
    assert encode_message(SnapshotFooterRecord(0)) == footer
    voters = tuple(KioVoter(voter_id=i32(v)) for v in (3000, 3001))
    change = kio_bytes(KioLeaderChange(version=i16(0), leader_id=i32(3001), voters=voters, granting_voters=voters[1:]))
    ours = LeaderChangeMessage(0, 3001, (Voter(3000), Voter(3001)), (Voter(3001),))
    assert decode_message(LeaderChangeMessage, change, 0) == ours
    assert encode_message(ours) == change


# The metadata records kio does not ship, declared as kio declares its generated types, so that
# kio's own serializer (compact arrays, uuids, tagged fields in tag order) writes their bodies.
def _kio_metadata_types():  # (no `from __future__ import annotations` in this file: kio reads real types)
    from kio.static.constants import EntityType
    from kio.static.primitive import i8, i16, i32

    class KioData:
        __type__: ClassVar = EntityType.data
        __version__: ClassVar = i16(0)
        __flexible__: ClassVar[bool] = True

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KioTopicRecord(KioData):
        name: str = field(metadata={"kafka_type": "string"})
        topic_id: uuid.UUID = field(metadata={"kafka_type": "uuid"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KioPartitionKey(KioData):
        partition_id: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
        topic_id: uuid.UUID = field(metadata={"kafka_type": "uuid"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KioPartitionRecord(KioPartitionKey):
        replicas: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())
        isr: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())
        removing_replicas: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())
        adding_replicas: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())
        leader: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
        leader_recovery_state: i8 = field(metadata={"kafka_type": "int8", "tag": 0}, default=i8(0))
        leader_epoch: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
        partition_epoch: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KioPartitionChangeRecord(KioPartitionKey):
        isr: tuple[i32, ...] | None = field(metadata={"kafka_type": "int32", "tag": 0}, default=None)
        leader: i32 = field(metadata={"kafka_type": "int32", "tag": 1}, default=i32(-2))
        replicas: tuple[i32, ...] | None = field(metadata={"kafka_type": "int32", "tag": 2}, default=None)
        removing_replicas: tuple[i32, ...] | None = field(metadata={"kafka_type": "int32", "tag": 3}, default=None)
        adding_replicas: tuple[i32, ...] | None = field(metadata={"kafka_type": "int32", "tag": 4}, default=None)
        leader_recovery_state: i8 = field(metadata={"kafka_type": "int8", "tag": 5}, default=i8(-1))

    return KioTopicRecord, KioPartitionRecord, KioPartitionChangeRecord


def kio_frame(api_key: int, body: bytes) -> bytes:
    return bytes([1, api_key, 0]) + body  # frame version 1, api key, version 0 (each one varint byte)


def kio_batch(base_offset: int, epoch: int, values: list[tuple[bytes | None, bytes]], *, control: bool = False) -> bytes:
    """A batch written by kio's record-batch writer: KRaft's shape (one timestamp, no producer)."""
    from kio.records.schema import NewRecordBatch, Record
    from kio.records.writers import write_new_batch
    from kio.static.primitive import i8, i16, i32, i64

    when = dt.datetime(2024, 10, 25, tzinfo=dt.timezone.utc)
    records = tuple(Record(attributes=i8(0), timestamp=when, offset=i64(base_offset + i), key=key, value=value, headers=())
                    for i, (key, value) in enumerate(values))
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(producer_id=i64(-1), producer_epoch=i16(-1), partition_leader_epoch=i32(epoch),
                                        base_sequence=i32(-1), records=records, attributes=i16(0x20 if control else 0)))
    return buf.getvalue()


def test_a_snapshot_and_log_written_wholly_by_kio_replay_to_the_leadership_they_record(tmp_path):
    from kio.schema.leader_change_message.v0.data import LeaderChangeMessage as KioLeaderChange
    from kio.schema.leader_change_message.v0.data import Voter as KioVoter
    from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord as KioFooter
    from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord as KioHeader
    from kio.static.primitive import i16, i32, i64

    KioTopic, KioPartition, KioChange = _kio_metadata_types()
    control_key = lambda kind: struct.pack(">hh", 0, kind)  # noqa: E731
    snapshot = b"".join([
        kio_batch(0, 4, [(control_key(SNAPSHOT_HEADER), kio_bytes(KioHeader(version=i16(0), last_contained_log_timestamp=i64(0))))],
                  control=True),
        kio_batch(1, 4, [
            (None, kio_frame(2, kio_bytes(KioTopic(name="orders", topic_id=ORDERS)))),
            (None, kio_frame(3, kio_bytes(KioPartition(partition_id=i32(0), topic_id=ORDERS, replicas=(i32(1), i32(2)),
                                                       isr=(i32(1), i32(2)), leader=i32(1), leader_epoch=i32(6),
                                                       partition_epoch=i32(8))))),
        ]),
        kio_batch(3, 4, [(control_key(SNAPSHOT_FOOTER), kio_bytes(KioFooter(version=i16(0))))], control=True),
    ])
    directory = partition_dir(tmp_path)
    directory.mkdir()
    (directory / "00000000000000000050-0000000004.checkpoint").write_bytes(snapshot)
    voters = (KioVoter(voter_id=i32(3000)),)
    log = b"".join([
        kio_batch(50, 5, [(control_key(LEADER_CHANGE), kio_bytes(KioLeaderChange(version=i16(0), leader_id=i32(3000),
                                                                                  voters=voters, granting_voters=voters)))],
                  control=True),
        kio_batch(51, 5, [(None, kio_frame(5, kio_bytes(KioChange(partition_id=i32(0), topic_id=ORDERS, leader=i32(2)))))]),
        kio_batch(52, 5, [(None, kio_frame(5, kio_bytes(KioChange(partition_id=i32(0), topic_id=ORDERS, isr=(i32(2),)))))]),
    ])
    (directory / "00000000000000000050.log").write_bytes(log)

    metadata = read_cluster_metadata(tmp_path)
    assert metadata.partitions == {TopicPartition("orders", 0): Leadership(ORDERS, 2, 7, 10, (1, 2), (2,))}
    assert metadata.snapshot.end_offset == 50 and metadata.next_offset == 53


# --- the replay: when the leader epoch moves ------------------------------------------------------


def test_the_leader_epoch_moves_exactly_when_leader_is_not_minus_2():
    start = Leadership(ORDERS, leader=1, leader_epoch=5, partition_epoch=9, replicas=(1, 2, 3), isr=(1, 2, 3))
    change = lambda **kw: merge_partition_change(start, PartitionChangeRecord(partition_id=0, topic_id=ORDERS, **kw))  # noqa: E731

    assert change(isr=(1, 2)) == Leadership(ORDERS, 1, 5, 10, (1, 2, 3), (1, 2))  # ISR shrink, Leader −2: no bump
    assert change(isr=(1, 2, 3, 4)).leader_epoch == 5  # ISR expansion
    assert change(leader=2) == Leadership(ORDERS, 2, 6, 10, (1, 2, 3), (1, 2, 3))  # a new leader
    # The controller forces a bump (reassignment removing a replica, an ISR shrink before 3.6)
    # by naming the current leader again.
    assert change(leader=1, isr=(1, 2)) == Leadership(ORDERS, 1, 6, 10, (1, 2, 3), (1, 2))
    assert change(leader=NO_LEADER, isr=()) == Leadership(ORDERS, NO_LEADER, 6, 10, (1, 2, 3), ())
    assert change(replicas=(1, 2, 4), leader=NO_LEADER_CHANGE).replicas == (1, 2, 4)
    assert not change(leader=NO_LEADER).has_leader and not change(leader=NO_LEADER).is_leader(-1)


def test_a_log_without_a_snapshot_replays_topics_partitions_changes_and_removals(tmp_path):
    with MetadataLogWriter(tmp_path, SMALL) as w:
        w.append_leader_change(3000, [3000])
        create_orders(w)
        w.append([TopicRecord("payments", PAYMENTS),
                  PartitionRecord(partition_id=0, topic_id=PAYMENTS, replicas=(3, 1), isr=(3, 1), leader=3, leader_epoch=0,
                                  partition_epoch=0)])
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=3, isr=(3,))], epoch=2)
        w.append([RemoveTopicRecord(PAYMENTS)])
    metadata = read_cluster_metadata(tmp_path)
    assert metadata.partitions == {
        TopicPartition("orders", 0): Leadership(ORDERS, 3, 1, 1, (1, 2, 3), (3,)),
        TopicPartition("orders", 1): Leadership(ORDERS, 2, 0, 0, (1, 2, 3), (1, 2, 3)),
    }
    assert metadata.topic_ids == {"orders": ORDERS}
    assert metadata.features == {"metadata.version": 21}
    assert metadata.snapshot is None and metadata.torn_tail is None
    assert len(segment_logs(tmp_path)) > 1  # the replay crossed segments


def test_a_metadata_transaction_applies_at_its_end_never_when_aborted_nor_while_open(tmp_path):
    with MetadataLogWriter(tmp_path, SMALL) as w:
        create_orders(w)
        w.append([BeginTransactionRecord("reassign"), PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2)])
        w.append([EndTransactionRecord()])
        w.append([BeginTransactionRecord(), TopicRecord("payments", PAYMENTS)])
        w.append([RemoveTopicRecord(ORDERS), AbortTransactionRecord("timed out")])
        w.append([BeginTransactionRecord(), PartitionChangeRecord(partition_id=1, topic_id=ORDERS, leader=3)])
    metadata = read_cluster_metadata(tmp_path)
    assert metadata.topic_ids == {"orders": ORDERS}
    assert metadata.partitions[TopicPartition("orders", 0)].leader == 2
    assert metadata.partitions[TopicPartition("orders", 1)].leader == 2  # the open transaction is not applied


# --- snapshots ----------------------------------------------------------------------------------------


def test_the_newest_snapshot_is_the_start_and_log_records_it_holds_are_not_replayed_twice(tmp_path):
    with MetadataLogWriter(tmp_path, SMALL) as w:
        create_orders(w)
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2)], epoch=2)
        old = w.snapshot()
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=3)], epoch=3)
        newest = w.snapshot()
        w.append([PartitionChangeRecord(partition_id=1, topic_id=ORDERS, leader=1)])
    old.write_bytes(b"\x00" * 100)  # only the newest is read
    (partition_dir(tmp_path) / (newest.name + ".part")).write_bytes(b"garbage")  # a snapshot being written
    (partition_dir(tmp_path) / "00000000000000099999-0000000009.checkpoint.deleted").write_bytes(b"garbage")

    metadata = read_cluster_metadata(tmp_path)
    assert [s.end_offset for s, _ in list_snapshots(partition_dir(tmp_path))] == [5, 6]
    assert metadata.snapshot.end_offset == 6 and metadata.snapshot.epoch == 3
    assert metadata.partitions[TopicPartition("orders", 0)] == Leadership(ORDERS, 3, 2, 2, (1, 2, 3), (1, 2, 3))
    assert metadata.partitions[TopicPartition("orders", 1)] == Leadership(ORDERS, 1, 1, 1, (1, 2, 3), (1, 2, 3))
    assert metadata.next_offset == 7


def test_a_log_whose_segments_below_the_snapshot_are_deleted_replays_from_the_snapshot(tmp_path):
    with MetadataLogWriter(tmp_path, SMALL) as w:
        create_orders(w, partitions=6)
        for epoch in range(2, 8):
            w.append([PartitionChangeRecord(partition_id=epoch % 6, topic_id=ORDERS, leader=epoch % 3 + 1)], epoch=epoch)
        w.snapshot(delete_log_before=True)
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, isr=(1,))])
    first = segment_logs(tmp_path)[0]
    assert int(first.stem) == 14  # everything below the snapshot (offsets 0..13) is gone
    metadata = read_cluster_metadata(tmp_path)
    assert metadata.partitions[TopicPartition("orders", 0)] == Leadership(ORDERS, 1, 1, 2, (1, 2, 3), (1,))
    assert metadata.partitions[TopicPartition("orders", 5)].leader_epoch == 1


def test_a_snapshot_file_lays_out_header_records_and_footer_as_kafka_freezes_one():
    data = encode_snapshot([TopicRecord("orders", ORDERS)], epoch=4, timestamp=11)
    header = build_batch([NewRecord(11, struct.pack(">hh", 0, SNAPSHOT_HEADER), encode_message(SnapshotHeaderRecord(0, 0)))],
                         base_offset=0, partition_leader_epoch=4, is_control=True)
    records = build_batch([NewRecord(11, None, encode_record(TopicRecord("orders", ORDERS)))], base_offset=1,
                          partition_leader_epoch=4)
    footer = build_batch([NewRecord(11, struct.pack(">hh", 0, SNAPSHOT_FOOTER), encode_message(SnapshotFooterRecord(0)))],
                         base_offset=2, partition_leader_epoch=4, is_control=True)
    assert data == header + records + footer


# --- damage, and the torn tail of the active segment ----------------------------------------------------


def test_a_torn_active_segment_ends_the_replay_at_its_last_whole_batch(tmp_path):
    with MetadataLogWriter(tmp_path) as w:
        create_orders(w)
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2)])
        torn_at = w.log_end_offset
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=3)])
    log = segment_logs(tmp_path)[-1]
    data = log.read_bytes()
    whole = data[: len(data) - 10]
    position = data.rindex(struct.pack(">q", torn_at))  # the last batch starts with its base offset
    for tail in (whole, data[:position] + b"\x00" * 4096):  # cut short; zero-filled after a crash
        log.write_bytes(tail)
        metadata = read_cluster_metadata(tmp_path)
        assert metadata.partitions[TopicPartition("orders", 0)].leader == 2
        assert metadata.next_offset == torn_at
        assert metadata.torn_tail[:2] == (log, position)


def test_a_crc_failure_in_the_last_batch_of_the_active_segment_is_a_torn_tail_elsewhere_an_error(tmp_path):
    with MetadataLogWriter(tmp_path) as w:
        create_orders(w)
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2)])
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=3)])
    log = segment_logs(tmp_path)[-1]
    data = bytearray(log.read_bytes())
    data[-3] ^= 0xFF  # inside the last batch
    log.write_bytes(bytes(data))
    assert read_cluster_metadata(tmp_path).partitions[TopicPartition("orders", 0)].leader == 2

    data[-3] ^= 0xFF
    second = scan_batches(bytes(data)).batches[1]  # offsets 2..3, followed by two more batches
    data[second.position + 70] ^= 0xFF
    log.write_bytes(bytes(data))
    with pytest.raises(MetadataLogError) as caught:
        read_cluster_metadata(tmp_path)
    message = str(caught.value)
    assert message == f"{log}: byte {second.position}: batch at offset 2 fails its CRC (stored {second.crc:#010x})"
    assert "\n" not in message and isinstance(caught.value, KafkaFormatError)


def test_invalid_bytes_in_a_closed_segment_or_a_snapshot_are_errors_naming_file_and_byte(tmp_path):
    with MetadataLogWriter(tmp_path, SMALL) as w:
        create_orders(w, partitions=5)
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2)])
        snapshot = w.snapshot()
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=3)])
    snapshot.write_bytes(snapshot.read_bytes()[:-5])
    with pytest.raises(MetadataLogError, match=rf"^{snapshot}: byte \d+: 5\d* invalid bytes in a snapshot|^{snapshot}: byte \d+: \d+ invalid bytes in a snapshot"):
        read_cluster_metadata(tmp_path)
    snapshot.unlink()
    closed = segment_logs(tmp_path)[0]
    closed.write_bytes(closed.read_bytes()[:-7])
    with pytest.raises(MetadataLogError, match=rf"^{closed}: byte \d+: \d+ invalid bytes in a closed segment \(partial batch"):
        read_cluster_metadata(tmp_path)


def test_a_snapshot_must_begin_with_its_header(tmp_path):
    directory = partition_dir(tmp_path)
    directory.mkdir()
    bad = directory / "00000000000000000003-0000000001.checkpoint"
    bad.write_bytes(build_batch([NewRecord(0, None, encode_record(TopicRecord("orders", ORDERS)))], base_offset=0))
    with pytest.raises(MetadataLogError, match=rf"^{bad}: byte 0: the snapshot does not start with a SnapshotHeaderRecord"):
        read_cluster_metadata(tmp_path)


def test_records_that_do_not_replay_or_offsets_the_log_lacks_are_errors(tmp_path):
    with MetadataLogWriter(tmp_path / "a") as w:
        create_orders(w)
        w.append([PartitionChangeRecord(partition_id=7, topic_id=ORDERS, leader=2)])
    with pytest.raises(MetadataLogError, match=r"byte \d+: record at offset 4 does not replay: PartitionChangeRecord for "
                                               r"partition 7 of topic id .* which does not exist"):
        read_cluster_metadata(tmp_path / "a")

    with MetadataLogWriter(tmp_path / "b", SMALL) as w:
        create_orders(w, partitions=6)
        w.snapshot(delete_log_before=True)
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2)])
    for snapshot in partition_dir(tmp_path / "b").glob("*.checkpoint"):
        snapshot.unlink()
    first = segment_logs(tmp_path / "b")[0]
    with pytest.raises(MetadataLogError, match=rf"^{first}: byte 0: the log starts at offset 8 and there is no snapshot: "
                                               r"offsets 0\.\.7 are in neither"):
        read_cluster_metadata(tmp_path / "b")


def test_no_metadata_log_is_none_and_an_empty_one_knows_no_partitions(tmp_path):
    assert read_cluster_metadata(tmp_path) is None
    partition_dir(tmp_path).mkdir()
    empty = read_cluster_metadata(tmp_path)
    assert empty.partitions == {} and empty.snapshot is None and empty.next_offset == 0
    assert read_cluster_metadata(partition_dir(tmp_path)) == empty  # the partition dir itself works too


# --- encode → decode: the replay equals a simple model ---------------------------------------------------

BROKERS = (1, 2, 3, 4)
_names = st.sampled_from(["orders", "payments", "page.views", "user-events"])


@st.composite
def operations(draw):
    """Random topic creations, leader changes (clean, to none, forced bumps), ISR and replica
    changes and topic removals, in random batches, with metadata transactions and snapshots."""
    ops = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["create", "create", "change", "change", "change", "remove", "snapshot", "txn"]))
        if kind == "create":
            replicas = tuple(draw(st.permutations(BROKERS))[: draw(st.integers(1, 3))])
            ops.append(("create", draw(_names), draw(st.integers(1, 3)), replicas))
        elif kind == "change":
            ops.append(("change", draw(st.integers(0, 50)), draw(st.sampled_from([NO_LEADER_CHANGE, NO_LEADER_CHANGE, NO_LEADER, 1, 2, 3, 4])),
                        draw(st.none() | st.lists(st.sampled_from(BROKERS), max_size=3, unique=True).map(tuple)),
                        draw(st.none() | st.permutations(BROKERS).map(lambda p: tuple(p[:3])))))
        elif kind == "remove":
            ops.append(("remove", draw(st.integers(0, 50))))
        elif kind == "txn":
            ops.append(("txn", draw(st.booleans())))
        else:
            ops.append(("snapshot", draw(st.booleans())))
    return ops, draw(st.integers(1, 4)), draw(st.sampled_from([1000, 3000, 1 << 20]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations())
def test_any_sequence_of_changes_replays_to_what_a_simple_model_says(tmp_path_factory, case):
    ops, per_batch, segment_bytes = case
    root = tmp_path_factory.mktemp("metadata")
    model: dict[str, tuple[uuid.UUID, dict[int, list]]] = {}  # name → (id, partition → [leader, epoch, replicas, isr])
    pending: list = []
    epoch = 1
    with MetadataLogWriter(root, LogConfig(segment_bytes=segment_bytes, segment_index_bytes=4096)) as w:
        def flush():
            for i in range(0, len(pending), per_batch):
                w.append(pending[i : i + per_batch], epoch=epoch)
            pending.clear()

        for n, op in enumerate(ops):
            if op[0] == "create" and op[1] not in model:
                _, name, count, replicas = op
                topic_id = uuid.UUID(int=n + 100)
                model[name] = (topic_id, {p: [replicas[0], 0, replicas, replicas] for p in range(count)})
                pending.append(TopicRecord(name, topic_id))
                pending.extend(PartitionRecord(partition_id=p, topic_id=topic_id, replicas=replicas, isr=replicas,
                                               leader=replicas[0], leader_epoch=0, partition_epoch=0) for p in range(count))
            elif op[0] == "change" and model:
                _, pick, leader, isr, replicas = op
                all_partitions = [(name, p) for name in sorted(model) for p in sorted(model[name][1])]
                name, p = all_partitions[pick % len(all_partitions)]
                state = model[name][1][p]
                if leader != NO_LEADER_CHANGE:
                    state[0], state[1] = leader, state[1] + 1  # the rule under test, stated independently
                if replicas is not None:
                    state[2] = replicas
                if isr is not None:
                    state[3] = isr
                pending.append(PartitionChangeRecord(partition_id=p, topic_id=model[name][0], leader=leader, isr=isr,
                                                     replicas=replicas))
            elif op[0] == "remove" and model:
                name = sorted(model)[op[1] % len(model)]
                pending.append(RemoveTopicRecord(model.pop(name)[0]))
            elif op[0] == "txn":
                # A transaction of one leader change on a partition that exists, committed or aborted.
                if model:
                    name = sorted(model)[0]
                    flush()
                    change = PartitionChangeRecord(partition_id=0, topic_id=model[name][0], leader=4)
                    w.append([BeginTransactionRecord(), change], epoch=epoch)
                    w.append([EndTransactionRecord() if op[1] else AbortTransactionRecord()], epoch=epoch)
                    if op[1]:
                        state = model[name][1][0]
                        state[0], state[1] = 4, state[1] + 1
            elif op[0] == "snapshot":
                flush()
                epoch += 1
                w.append_leader_change(3000, [3000], epoch=epoch)
                w.snapshot(delete_log_before=op[1])
        flush()

    metadata = read_cluster_metadata(root)
    expected = {TopicPartition(name, p): (s[0], s[1], tuple(s[2]), tuple(s[3]))
                for name, (_, partitions) in model.items() for p, s in partitions.items()}
    assert {tp: (l.leader, l.leader_epoch, l.replicas, l.isr) for tp, l in metadata.partitions.items()} == expected
    assert metadata.topic_ids == {name: topic_id for name, (topic_id, _) in model.items()}
