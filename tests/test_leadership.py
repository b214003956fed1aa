"""Who this broker is and who leads each partition, from the broker's own files: meta.properties
(a real ZooKeeper-mode broker's, and a KRaft node's as `kafka-storage format` writes it), the
metadata log found in the log dirs or at KTS_METADATA_LOG_DIR, and None where a broker keeps no
metadata log (ZooKeeper mode, a plain log dir), so that every replica may copy."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kts_resources import settings
from kts_resources.kafka.simulator.broker_log import BrokerLogDir
from kts_resources.kafka.checkpoints import MetaProperties, decode_meta_properties, read_meta_properties
from kts_resources.kafka.errors import CheckpointError
from kts_resources.kafka.logdir import discover_partitions
from kts_resources.kafka.metadata_log import (
    METADATA_PARTITION_DIR,
    MetadataLogError,
    PartitionChangeRecord,
    PartitionRecord,
    TopicRecord,
)
from kts_resources.kafka.simulator.metadata_log_writer import MetadataLogWriter
from kts_resources.kafka.partition import TopicPartition
from kts_resources.tiering.leadership import (
    Leadership,
    MetadataLogLocationError,
    find_metadata_log,
    partition_leadership,
    this_broker_id,
)
from tests.conftest import shared_dir

REAL_BROKER = shared_dir() / "fixtures" / "real_broker" / "kafka-3.7.1-logs"
ORDERS = uuid.UUID(int=0xABC)


def kraft_log_dir(path: Path, node_id: int) -> Path:
    """A KRaft broker's log dir: meta.properties with node.id, and one topic partition."""
    with BrokerLogDir(path, node_id=node_id) as log_dir:
        log_dir.partition("orders", 0)
    return path


def write_metadata(directory: Path, leader: int = 2) -> None:
    with MetadataLogWriter(directory) as w:
        w.append_leader_change(3000, [3000])
        w.append([TopicRecord("orders", ORDERS)] + [
            PartitionRecord(partition_id=p, topic_id=ORDERS, replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_epoch=0,
                            partition_epoch=0) for p in range(2)])
        w.append([PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=leader)], epoch=2)


# --- the broker's id ------------------------------------------------------------------------------


def test_a_real_zookeeper_mode_brokers_meta_properties_gives_its_broker_id():
    meta = read_meta_properties(REAL_BROKER / "meta.properties")
    assert meta == MetaProperties(version=0, node_id=0, cluster_id="XB4QhweWTe-kZwMNW25y1A")
    assert this_broker_id([REAL_BROKER]) == 0


def test_a_kraft_nodes_meta_properties_gives_its_node_id(tmp_path):
    assert this_broker_id([kraft_log_dir(tmp_path / "a", 7), kraft_log_dir(tmp_path / "b", 7)]) == 7
    meta = read_meta_properties(tmp_path / "a" / "meta.properties")
    assert meta.version == 1 and meta.node_id == 7 and meta.directory_id is not None


def test_log_dirs_without_meta_properties_know_no_id_and_dirs_that_disagree_are_an_error(tmp_path):
    (tmp_path / "plain").mkdir()
    assert this_broker_id([tmp_path / "plain"]) is None
    assert this_broker_id([tmp_path / "plain", kraft_log_dir(tmp_path / "a", 4)]) == 4
    kraft_log_dir(tmp_path / "b", 5)
    with pytest.raises(ValueError, match=r"the log dirs disagree on the broker id: .*a/meta.properties says 4, .*b/meta.properties says 5"):
        this_broker_id([tmp_path / "a", tmp_path / "b"])


def test_meta_properties_is_read_as_java_properties():
    text = (b"#Thu Jul 18 18:09:58 IST 2024\n! another comment\n  node.id : 12\ncluster.id   abc\\\n    def\n"
            b"version=1\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAQ\n")
    assert decode_meta_properties(text) == MetaProperties(1, 12, "abcdef", uuid.UUID(int=1))
    assert decode_meta_properties(b"version=0\ncluster.id=x\n") == MetaProperties(0, None, "x")  # broker.id may be absent


@pytest.mark.parametrize("text, words", [
    (b"version=1\ncluster.id=x\n", "version 1 requires node.id, which is missing"),
    (b"version=1\nnode.id=3\n", "version 1 requires cluster.id, which is missing"),
    (b"version=2\nnode.id=3\ncluster.id=x\n", "unknown meta.properties version 2"),
    (b"version=0\nbroker.id=one\n", "broker.id 'one' is not an integer"),
])
def test_a_malformed_meta_properties_is_one_error_naming_the_file(tmp_path, text, words):
    path = tmp_path / "meta.properties"
    path.write_bytes(text)
    with pytest.raises(CheckpointError, match=rf"^{path}: byte \d+: {words}"):
        this_broker_id([tmp_path])


# --- who leads --------------------------------------------------------------------------------------


def test_a_zookeeper_mode_broker_or_a_plain_log_dir_has_no_metadata_log_so_leadership_is_none(tmp_path):
    assert partition_leadership([REAL_BROKER]) is None
    assert partition_leadership([tmp_path]) is None


def test_leadership_comes_from_the_metadata_log_in_the_log_dirs(tmp_path):
    log_dir = kraft_log_dir(tmp_path / "logs", 2)
    other = kraft_log_dir(tmp_path / "more-logs", 2)
    write_metadata(log_dir)
    leadership = partition_leadership([other, log_dir])
    assert leadership == {
        TopicPartition("orders", 0): Leadership(ORDERS, 2, 1, 1, (1, 2, 3), (1, 2, 3)),
        TopicPartition("orders", 1): Leadership(ORDERS, 1, 0, 0, (1, 2, 3), (1, 2, 3)),
    }
    me = this_broker_id([other, log_dir])
    assert [tp.partition for tp, l in leadership.items() if l.is_leader(me)] == [0]
    assert not leadership[TopicPartition("orders", 1)].is_leader(None)
    # The metadata log is never taken for a topic partition.
    assert METADATA_PARTITION_DIR not in {p.path.name for p in discover_partitions(log_dir)}


def test_a_separate_metadata_log_dir_is_found_where_kts_metadata_log_dir_points(tmp_path, monkeypatch):
    log_dir = kraft_log_dir(tmp_path / "logs", 3)
    metadata_dir = tmp_path / "kraft-metadata"
    write_metadata(metadata_dir, leader=3)
    monkeypatch.setenv("KTS_METADATA_LOG_DIR", str(metadata_dir))
    assert settings.metadata_log_dir() == metadata_dir
    leadership = partition_leadership([log_dir], settings.metadata_log_dir())
    assert leadership[TopicPartition("orders", 0)].is_leader(this_broker_id([log_dir], settings.metadata_log_dir()))
    # The partition directory itself is accepted too.
    assert partition_leadership([log_dir], metadata_dir / METADATA_PARTITION_DIR) == leadership
    monkeypatch.delenv("KTS_METADATA_LOG_DIR")
    assert settings.metadata_log_dir() is None
    assert partition_leadership([log_dir], settings.metadata_log_dir()) is None


def test_a_configured_metadata_log_dir_without_one_or_two_log_dirs_with_one_are_errors(tmp_path):
    with pytest.raises(MetadataLogLocationError, match=rf"{tmp_path} holds no {METADATA_PARTITION_DIR}"):
        partition_leadership([], tmp_path)
    for name in ("a", "b"):
        write_metadata(tmp_path / name)
    with pytest.raises(MetadataLogLocationError, match="more than one log dir holds a __cluster_metadata-0: .*set KTS_METADATA_LOG_DIR"):
        find_metadata_log([tmp_path / "a", tmp_path / "b"])
    assert find_metadata_log([tmp_path / "a", tmp_path / "b"], tmp_path / "b") == tmp_path / "b" / METADATA_PARTITION_DIR


def test_a_damaged_metadata_log_is_one_error_naming_the_file_and_byte(tmp_path):
    write_metadata(tmp_path)
    log = next((tmp_path / METADATA_PARTITION_DIR).glob("*.log"))
    data = bytearray(log.read_bytes())
    data[80] ^= 0xFF  # inside the first batch, which more follow
    log.write_bytes(bytes(data))
    with pytest.raises(MetadataLogError, match=rf"^{log}: byte 0: batch at offset 0 fails its CRC"):
        partition_leadership([tmp_path])
