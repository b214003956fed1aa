"""KRaft's metadata log as a broker keeps it: its records, its snapshots, and who leads each partition.

A KRaft broker (or controller) keeps the cluster's metadata in the partition ``__cluster_metadata-0``
under its ``metadata.log.dir`` (by default the first of ``log.dirs``): ordinary magic-2 segments, the
raft's own control batches among them, plus snapshots ``<20-digit end offset>-<10-digit epoch>.checkpoint``
beside them. This module reads and writes that directory. It imports no Dagster.

Formats, as Apache Kafka writes them (apache/kafka 3.9.0, and trunk of 2024-10-25, 4.0.0-SNAPSHOT, alike; the JSON
schemas under ``metadata/src/main/resources/common/metadata/`` and
``clients/src/main/resources/common/message/``):

- A metadata record is the value of a record in a data batch, with a null key, timestamp delta 0 and
  no headers (``raft/.../internals/RecordsIterator.java``, ``BatchBuilder``). The value is framed by
  ``AbstractApiMessageSerde`` (``server-common/.../serialization/``): unsigned varint frame version
  (1; 0 was KRaft's 2.8 preview and is refused, as Kafka refuses it), unsigned varint api key,
  unsigned varint record version, then the message body. The value's length comes from the batch's
  record framing, so a record of a type kts does not know is skipped whole.
- Every metadata record is a flexible-version message: compact strings and arrays (unsigned varint
  length + 1, 0 meaning null), 16-byte UUIDs, and after the fields a tagged-field section (count,
  then tag, size, bytes per field; kts writes them in ascending tag order, as Kafka's generated code
  does, and skips tags it does not know, as Kafka keeps them as unknown fields). The field order,
  defaults, versions and tags below are transcribed from the JSON schemas.
- Control batches (attribute bit 5) hold the raft's own records: LeaderChangeMessage, the snapshot
  header and footer, KRaftVersionRecord, VotersRecord (``ControlRecordType``). A replay skips them.
- A snapshot (``raft/.../snapshot/Snapshots.java``, ``RecordsSnapshotWriter``) is a file of batches
  whose offsets start at 0 and whose partition leader epoch is the snapshot's epoch: first a control
  batch whose first record is a SnapshotHeaderRecord (``RecordsSnapshotReader`` refuses anything
  else), then the image's records, then a control batch with the SnapshotFooterRecord. Its name is
  the offset the log continues from (exclusive end) and the epoch of the last record it holds.
  ``.checkpoint.part`` (being written) and ``.checkpoint.deleted`` files are not snapshots.

Replay (:func:`read_cluster_metadata`) follows a broker's MetadataLoader: the newest snapshot, then
every log record from its end offset on. TopicRecord, PartitionRecord, PartitionChangeRecord and
RemoveTopicRecord change topics and partitions as ``TopicsDelta`` / ``TopicDelta`` and
``PartitionRegistration.merge`` do (see :func:`merge_partition_change` for exactly when the leader
epoch moves). Records between a BeginTransactionRecord and an AbortTransactionRecord are dropped,
and a transaction still open at the end of the log is not applied (``MetadataBatchLoader``).

What a reader of the files cannot know: the raft high watermark. KafkaMetadataLog keeps it in
memory only (``KafkaMetadataLog.updateHighWatermark``); ``quorum-state`` holds the quorum's leader,
epoch and vote, not the high watermark; the metadata log is in no offset checkpoint. So the replay
reads to the end of the valid batches: records a broker has fetched but the quorum has not yet
committed are applied too. Kafka truncates such records only when its log diverged from the raft
leader's (an election that lost them); the next read then sees the truncated log. Every snapshot is
below the high watermark (KafkaMetadataLog.createNewSnapshot refuses one above it).

Damage: a file that does not follow the format raises :class:`MetadataLogError` naming the file and
byte. The one exception is the tail of the active segment: bytes after the last whole batch (a
batch being appended right now, or a crash's partial or zero-filled write), and a CRC failure of
the very last batch there, end the replay before them, as Kafka's recovery truncates there; what is
read is then the metadata as of a moment earlier (:attr:`ClusterMetadata.torn_tail` says where).
"""

from __future__ import annotations

import os
import re
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from .errors import FileChangedError, KafkaFormatError
from .files import read_whole, write_atomically
from .logdir import (
    CLUSTER_METADATA_TOPIC,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PRODUCER_SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    UnreadableSegmentError,
    list_segments,
    offset_file_name,
)
from .partition import TopicPartition
from .records import (
    BatchHeader,
    NewRecord,
    build_batch,
    decode_batch,
    parse_control_record,
    scan_batches,
)

METADATA_PARTITION_DIR = f"{CLUSTER_METADATA_TOPIC}-0"
# Uuid.METADATA_TOPIC_ID: the metadata partition's partition.metadata names this id.
METADATA_TOPIC_ID = uuid.UUID(int=1)
SNAPSHOT_SUFFIX = ".checkpoint"  # Snapshots.SUFFIX
_SNAPSHOT_NAME = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")

FRAME_VERSION = 1  # AbstractApiMessageSerde.DEFAULT_FRAME_VERSION
NO_LEADER = -1  # LeaderConstants.NO_LEADER
NO_LEADER_CHANGE = -2  # LeaderConstants.NO_LEADER_CHANGE

# ControlRecordType ids of KRaft's control records (records.CONTROL_TYPE_NAMES names them all).
LEADER_CHANGE = 2
SNAPSHOT_HEADER = 3
SNAPSHOT_FOOTER = 4
KRAFT_VERSION = 5
_CONTROL_KEY = struct.Struct(">hh")  # ControlRecordType's key: version 0, type


class MetadataLogError(KafkaFormatError):
    """A metadata log segment or snapshot that does not follow KRaft's format, or whose records
    do not replay (a change to a partition or topic that does not exist)."""


# --- the flexible-version message encoding ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    """One field of a message schema, as its JSON declares it (taggedVersions always equal versions here)."""

    attr: str
    type: str | type  # int8 int16 int32 int64 uint16 bool string uuid []int32 []uuid, or a struct class for []Struct
    default: Any = None
    since: int = 0  # the first version that has it
    nullable_since: int | None = None
    tag: int | None = None


_INTS = {"int8": struct.Struct(">b"), "int16": struct.Struct(">h"), "int32": struct.Struct(">i"),
         "int64": struct.Struct(">q"), "uint16": struct.Struct(">H")}


def encode_uvarint(value: int) -> bytes:
    """ByteUtils.writeUnsignedVarint: base-128, low group first, no zigzag."""
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{value} does not fit an unsigned varint")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Reader:
    """Reads a message body; running off its end is a MetadataLogError at the byte it happened."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise MetadataLogError(f"a {n}-byte field at byte {self.pos} of the record runs past its end ({self.end} bytes)")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def uvarint(self) -> int:
        """ByteUtils.readUnsignedVarint: at most 5 bytes."""
        value = 0
        for i in range(5):
            if self.pos >= self.end:
                raise MetadataLogError(f"an unsigned varint at byte {self.pos} of the record runs past its end")
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                return value
        raise MetadataLogError(f"an unsigned varint ending at byte {self.pos} of the record is longer than 5 bytes")

    def length(self, what: str, nullable: bool) -> int | None:
        """A compact length: the unsigned varint less one; −1 is null."""
        n = self.uvarint() - 1
        if n < 0:
            if not nullable:
                raise MetadataLogError(f"{what} is null at byte {self.pos} of the record, which its schema does not allow")
            return None
        return n


def _read_value(r: _Reader, f: _Field, version: int) -> Any:
    nullable = f.nullable_since is not None and version >= f.nullable_since
    t = f.type
    if isinstance(t, str):
        if t in _INTS:
            s = _INTS[t]
            return s.unpack(r.take(s.size))[0]
        if t == "bool":
            return r.take(1)[0] != 0
        if t == "uuid":
            return uuid.UUID(bytes=r.take(16))
        if t == "string":
            n = r.length(f.attr, nullable)
            if n is None:
                return None
            raw = r.take(n)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise MetadataLogError(f"{f.attr} is not UTF-8") from None
        if t.startswith("[]"):
            n = r.length(f.attr, nullable)
            if n is None:
                return None
            if t == "[]int32":
                return struct.unpack(f">{n}i", r.take(4 * n))
            if t == "[]uuid":
                return tuple(uuid.UUID(bytes=r.take(16)) for _ in range(n))
        raise AssertionError(f"no reader for {t}")
    n = r.length(f.attr, nullable)
    if n is None:
        return None
    if n > r.end - r.pos:  # every element takes a byte at least: a corrupt count cannot make us loop long
        raise MetadataLogError(f"{f.attr} claims {n} elements with {r.end - r.pos} bytes left")
    return tuple(_read_struct(r, t, version) for _ in range(n))


def _write_value(out: bytearray, f: _Field, value: Any, version: int) -> None:
    nullable = f.nullable_since is not None and version >= f.nullable_since
    t = f.type
    if value is None and not (isinstance(t, str) and t in _INTS):
        if not nullable:
            raise ValueError(f"{f.attr} may not be null in version {version}")
        out += b"\x00"
        return
    if isinstance(t, str):
        if t in _INTS:
            out += _INTS[t].pack(value)
        elif t == "bool":
            out.append(1 if value else 0)
        elif t == "uuid":
            out += value.bytes
        elif t == "string":
            raw = value.encode("utf-8")
            out += encode_uvarint(len(raw) + 1) + raw
        elif t == "[]int32":
            out += encode_uvarint(len(value) + 1) + struct.pack(f">{len(value)}i", *value)
        elif t == "[]uuid":
            out += encode_uvarint(len(value) + 1) + b"".join(u.bytes for u in value)
        else:
            raise AssertionError(f"no writer for {t}")
        return
    out += encode_uvarint(len(value) + 1)
    for element in value:
        _write_struct(out, element, version)


def _read_struct(r: _Reader, cls: type, version: int) -> Any:
    values: dict[str, Any] = {}
    tagged: dict[int, _Field] = {}
    for f in cls._SCHEMA:
        if version < f.since:
            continue
        if f.tag is not None:
            tagged[f.tag] = f
        else:
            values[f.attr] = _read_value(r, f, version)
    for _ in range(r.uvarint()):
        tag = r.uvarint()
        size = r.uvarint()
        f = tagged.get(tag)
        if f is None:
            r.take(size)  # an unknown tagged field: Kafka keeps it as unknown, kts skips it
            continue
        end = r.pos + size
        if end > r.end:
            raise MetadataLogError(f"tagged field {tag} of {size} bytes runs past the end of the record")
        sub = _Reader(r.data, r.pos, end)
        values[f.attr] = _read_value(sub, f, version)
        if sub.pos != end:
            raise MetadataLogError(f"tagged field {tag} ({f.attr}) declares {size} bytes but holds {sub.pos - r.pos}")
        r.pos = end
    if "version" in cls.__dataclass_fields__ and "version" not in values:
        values["version"] = version  # a metadata record's schema version (control records have a Version field)
    return cls(**values)


def _write_struct(out: bytearray, obj: Any, version: int) -> None:
    tagged: list[tuple[int, bytes]] = []
    for f in type(obj)._SCHEMA:
        value = getattr(obj, f.attr)
        if version < f.since:
            if value != f.default:
                raise ValueError(f"{type(obj).__name__} version {version} has no {f.attr} (set to {value!r})")
            continue
        if f.tag is not None:
            if value != f.default:
                body = bytearray()
                _write_value(body, f, value, version)
                tagged.append((f.tag, bytes(body)))
        else:
            _write_value(out, f, value, version)
    out += encode_uvarint(len(tagged))
    for tag, body in sorted(tagged):
        out += encode_uvarint(tag) + encode_uvarint(len(body)) + body


def encode_message(message: Any, version: int | None = None) -> bytes:
    """A message's body alone (what a control record's value holds: MessageUtil.toByteBuffer), at
    ``version``: by default a metadata record's own, and 0 for a control record."""
    if version is None:
        version = message.version if hasattr(message, "API_KEY") else 0
    out = bytearray()
    _write_struct(out, message, version)
    return bytes(out)


def decode_message(cls: type, data: bytes, version: int) -> Any:
    """The body of a ``cls`` message of ``version``; every byte must belong to it."""
    r = _Reader(bytes(data))
    message = _read_struct(r, cls, version)
    if r.pos != r.end:
        raise MetadataLogError(f"{r.end - r.pos} bytes after the {cls.__name__}")
    return message


# --- the records (metadata/src/main/resources/common/metadata/*.json) -----------------------------


def _metadata_record(api_key: int, versions: int = 1):
    """Declares a metadata record type: a frozen dataclass with ``API_KEY`` and ``VERSIONS`` (0..versions−1)."""
    def make(cls: type) -> type:
        cls = dataclass(frozen=True, slots=True)(cls)
        cls.API_KEY = api_key
        cls.VERSIONS = range(versions)
        return cls
    return make


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    name: str = ""
    host: str = ""
    port: int = 0
    security_protocol: int = 0
    _SCHEMA: ClassVar = (_Field("name", "string"), _Field("host", "string"), _Field("port", "uint16"),
                         _Field("security_protocol", "int16"))


@dataclass(frozen=True, slots=True)
class BrokerFeature:
    name: str = ""
    min_supported_version: int = 0
    max_supported_version: int = 0
    _SCHEMA: ClassVar = (_Field("name", "string"), _Field("min_supported_version", "int16"),
                         _Field("max_supported_version", "int16"))


@_metadata_record(0, versions=4)
class RegisterBrokerRecord:
    """apiKey 0, versions 0–3. Decoded for tools; a replay of leadership skips it."""

    broker_id: int = 0
    is_migrating_zk_broker: bool = False
    incarnation_id: uuid.UUID = uuid.UUID(int=0)
    broker_epoch: int = 0
    end_points: tuple[BrokerEndpoint, ...] = ()
    features: tuple[BrokerFeature, ...] = ()
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    log_dirs: tuple[uuid.UUID, ...] = ()
    version: int = 0
    _SCHEMA: ClassVar = (
        _Field("broker_id", "int32"), _Field("is_migrating_zk_broker", "bool", False, since=2),
        _Field("incarnation_id", "uuid", uuid.UUID(int=0)), _Field("broker_epoch", "int64"),
        _Field("end_points", BrokerEndpoint, ()), _Field("features", BrokerFeature, ()),
        _Field("rack", "string", nullable_since=0), _Field("fenced", "bool", True),
        _Field("in_controlled_shutdown", "bool", False, since=1), _Field("log_dirs", "[]uuid", (), since=3, tag=0),
    )


@_metadata_record(2)
class TopicRecord:
    """apiKey 2: a topic is created, named, and given its id."""

    name: str = ""
    topic_id: uuid.UUID = uuid.UUID(int=0)
    version: int = 0
    _SCHEMA: ClassVar = (_Field("name", "string"), _Field("topic_id", "uuid", uuid.UUID(int=0)))


@_metadata_record(3, versions=3)
class PartitionRecord:
    """apiKey 3, versions 0–2: a partition's whole registration (creation, or an image in a snapshot)."""

    partition_id: int = -1
    topic_id: uuid.UUID = uuid.UUID(int=0)
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    leader: int = NO_LEADER
    leader_recovery_state: int = 0
    leader_epoch: int = -1
    partition_epoch: int = -1
    directories: tuple[uuid.UUID, ...] = ()
    eligible_leader_replicas: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None
    version: int = 0
    _SCHEMA: ClassVar = (
        _Field("partition_id", "int32", -1), _Field("topic_id", "uuid", uuid.UUID(int=0)),
        _Field("replicas", "[]int32", ()), _Field("isr", "[]int32", ()),
        _Field("removing_replicas", "[]int32", ()), _Field("adding_replicas", "[]int32", ()),
        _Field("leader", "int32", NO_LEADER), _Field("leader_recovery_state", "int8", 0, tag=0),
        _Field("leader_epoch", "int32", -1), _Field("partition_epoch", "int32", -1),
        _Field("directories", "[]uuid", (), since=1),
        _Field("eligible_leader_replicas", "[]int32", None, since=2, nullable_since=2, tag=1),
        _Field("last_known_elr", "[]int32", None, since=2, nullable_since=2, tag=2),
    )


@_metadata_record(5, versions=3)
class PartitionChangeRecord:
    """apiKey 5, versions 0–2: what changed in a partition; None (and Leader −2) mean unchanged."""

    partition_id: int = -1
    topic_id: uuid.UUID = uuid.UUID(int=0)
    isr: tuple[int, ...] | None = None
    leader: int = NO_LEADER_CHANGE
    replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    leader_recovery_state: int = -1
    directories: tuple[uuid.UUID, ...] | None = None
    eligible_leader_replicas: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None
    version: int = 0
    _SCHEMA: ClassVar = (
        _Field("partition_id", "int32", -1), _Field("topic_id", "uuid", uuid.UUID(int=0)),
        _Field("isr", "[]int32", None, nullable_since=0, tag=0),
        _Field("leader", "int32", NO_LEADER_CHANGE, tag=1),
        _Field("replicas", "[]int32", None, nullable_since=0, tag=2),
        _Field("removing_replicas", "[]int32", None, nullable_since=0, tag=3),
        _Field("adding_replicas", "[]int32", None, nullable_since=0, tag=4),
        _Field("leader_recovery_state", "int8", -1, tag=5),
        _Field("directories", "[]uuid", None, since=1, nullable_since=1, tag=8),
        _Field("eligible_leader_replicas", "[]int32", None, since=2, nullable_since=2, tag=6),
        _Field("last_known_elr", "[]int32", None, since=2, nullable_since=2, tag=7),
    )


@_metadata_record(9)
class RemoveTopicRecord:
    """apiKey 9: the topic and all its partitions are gone."""

    topic_id: uuid.UUID = uuid.UUID(int=0)
    version: int = 0
    _SCHEMA: ClassVar = (_Field("topic_id", "uuid", uuid.UUID(int=0)),)


@_metadata_record(12)
class FeatureLevelRecord:
    """apiKey 12 (version 0 forever, the schema says): a finalized feature level, e.g. metadata.version."""

    name: str = ""
    feature_level: int = 0
    version: int = 0
    _SCHEMA: ClassVar = (_Field("name", "string"), _Field("feature_level", "int16"))


@_metadata_record(20)
class NoOpRecord:
    """apiKey 20: written by the controller to advance the log; no fields."""

    version: int = 0
    _SCHEMA: ClassVar = ()


@_metadata_record(23)
class BeginTransactionRecord:
    """apiKey 23 (KIP-868): the records up to the matching End/Abort apply together or not at all."""

    name: str | None = None
    version: int = 0
    _SCHEMA: ClassVar = (_Field("name", "string", None, nullable_since=0, tag=0),)


@_metadata_record(24)
class EndTransactionRecord:
    """apiKey 24: the open metadata transaction applies."""

    version: int = 0
    _SCHEMA: ClassVar = ()


@_metadata_record(25)
class AbortTransactionRecord:
    """apiKey 25: the open metadata transaction's records are dropped."""

    reason: str | None = None
    version: int = 0
    _SCHEMA: ClassVar = (_Field("reason", "string", None, nullable_since=0, tag=0),)


@dataclass(frozen=True, slots=True)
class UnknownRecord:
    """A record of a type kts does not decode (its frame says which); replays skip it."""

    api_key: int
    version: int


METADATA_RECORD_TYPES: Mapping[int, type] = {cls.API_KEY: cls for cls in (
    RegisterBrokerRecord, TopicRecord, PartitionRecord, PartitionChangeRecord, RemoveTopicRecord,
    FeatureLevelRecord, NoOpRecord, BeginTransactionRecord, EndTransactionRecord, AbortTransactionRecord,
)}
# What a leadership replay decodes; every other record is skipped without decoding its body, so a
# newer version of a record that does not bear on leadership never stops the replay.
_REPLAYED = frozenset({2, 3, 5, 9, 12, 23, 24, 25})


def encode_record(record: Any) -> bytes:
    """A metadata record's value: frame version 1, api key, version, body (AbstractApiMessageSerde.write)."""
    if record.version not in record.VERSIONS:
        raise ValueError(f"{type(record).__name__} has no version {record.version} (valid: {record.VERSIONS.start}-{record.VERSIONS.stop - 1})")
    return encode_uvarint(FRAME_VERSION) + encode_uvarint(record.API_KEY) + encode_uvarint(record.version) + encode_message(record)


def _record_frame(value: bytes) -> tuple[int, int, _Reader]:
    r = _Reader(value)
    frame = r.uvarint()
    if frame == 0:
        raise MetadataLogError("frame version 0 (KRaft's 2.8 preview), which Kafka no longer reads")
    if frame != FRAME_VERSION:
        raise MetadataLogError(f"unknown frame version {frame} (only {FRAME_VERSION} exists)")
    api_key, version = r.uvarint(), r.uvarint()
    if api_key > 0x7FFF or version > 0x7FFF:
        raise MetadataLogError(f"api key {api_key} / version {version} do not fit an int16")
    return api_key, version, r


def decode_record(value: bytes, *, only: frozenset[int] | None = None) -> Any:
    """A metadata record from its value (AbstractApiMessageSerde.read). A type kts does not know,
    or one not in ``only``, comes back as :class:`UnknownRecord`; a known type of a version newer than
    kts knows, or bytes that do not parse, raise :class:`MetadataLogError`."""
    api_key, version, r = _record_frame(bytes(value))
    cls = METADATA_RECORD_TYPES.get(api_key)
    if cls is None or (only is not None and api_key not in only):
        return UnknownRecord(api_key, version)
    if version not in cls.VERSIONS:
        raise MetadataLogError(f"{cls.__name__} version {version} is newer than kts reads "
                               f"({cls.VERSIONS.start}-{cls.VERSIONS.stop - 1})")
    record = _read_struct(r, cls, version)
    if r.pos != r.end:
        raise MetadataLogError(f"{r.end - r.pos} bytes of garbage after the {cls.__name__}")
    return record


# --- KRaft's control records (clients/src/main/resources/common/message/*.json) ----------------


@dataclass(frozen=True, slots=True)
class SnapshotHeaderRecord:
    version: int = 0  # the field Version, not a schema version (the schema has only version 0)
    last_contained_log_timestamp: int = 0
    _SCHEMA: ClassVar = (_Field("version", "int16"), _Field("last_contained_log_timestamp", "int64"))


@dataclass(frozen=True, slots=True)
class SnapshotFooterRecord:
    version: int = 0
    _SCHEMA: ClassVar = (_Field("version", "int16"),)


@dataclass(frozen=True, slots=True)
class Voter:
    voter_id: int = 0
    voter_directory_id: uuid.UUID = uuid.UUID(int=0)
    _SCHEMA: ClassVar = (_Field("voter_id", "int32"), _Field("voter_directory_id", "uuid", uuid.UUID(int=0), since=1))


@dataclass(frozen=True, slots=True)
class LeaderChangeMessage:
    """The control record a raft leader writes at the start of its epoch (schema version 0 here)."""

    version: int = 0
    leader_id: int = 0
    voters: tuple[Voter, ...] = ()
    granting_voters: tuple[Voter, ...] = ()
    _SCHEMA: ClassVar = (_Field("version", "int16"), _Field("leader_id", "int32"),
                         _Field("voters", Voter, ()), _Field("granting_voters", Voter, ()))


def control_batch(control_type: int, message: Any, *, base_offset: int = 0, epoch: int = 0, timestamp: int = 0) -> bytes:
    """One control batch holding one KRaft control record (MemoryRecordsBuilder.appendControlRecord):
    key version 0 + type, value the message body at schema version 0, no producer id."""
    key = _CONTROL_KEY.pack(0, control_type)
    return build_batch([NewRecord(timestamp, key, encode_message(message, 0))], base_offset=base_offset,
                       partition_leader_epoch=epoch, is_control=True)


# --- the state a replay builds --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Leadership:
    """One partition as the metadata says it is now: its topic id, leader (−1: none), leader epoch,
    partition epoch, replicas and in-sync replicas (Kafka's PartitionRegistration, the fields kts uses)."""

    topic_id: uuid.UUID
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def has_leader(self) -> bool:
        return self.leader >= 0

    def is_leader(self, broker_id: int | None) -> bool:
        """Whether ``broker_id`` leads the partition now (never when it has no leader)."""
        return broker_id is not None and self.leader >= 0 and self.leader == broker_id


def merge_partition_change(partition: Leadership, change: PartitionChangeRecord) -> Leadership:
    """Kafka's ``PartitionRegistration.merge`` (metadata/.../metadata/PartitionRegistration.java).

    Replicas and ISR are replaced when the record carries them (null: unchanged). The leader
    epoch moves by exactly one when, and only when, the record's Leader is not −2
    (NO_LEADER_CHANGE) — also when it names the current leader again, or −1 (no leader). The
    partition epoch moves by one on every change record. The reader needs no other rule: the
    controller decides every other epoch bump when it writes the record
    (controller/PartitionChangeBuilder.java): a reassignment that removes a replica
    (``triggerLeaderEpochBumpForReplicaReassignmentIfNeeded``), and an ISR shrink
    (``triggerLeaderEpochBumpForIsrShrinkIfNeeded``) below metadata.version 3.6-IV0
    (``MetadataVersion.isLeaderEpochBumpRequiredOnIsrShrink``, KAFKA-15021) or, in 3.9.0, while a
    ZooKeeper migration is enabled — each by setting Leader to the current leader rather than −2.
    ISR expansions, and other ISR shrinks, leave Leader at −2 and the epoch where it is. The merge
    rule is the same in 3.7.0, 3.9.0 and trunk of 2024-10-25.
    """
    if change.leader == NO_LEADER_CHANGE:
        leader, leader_epoch = partition.leader, partition.leader_epoch
    else:
        leader, leader_epoch = change.leader, partition.leader_epoch + 1
    return Leadership(
        topic_id=partition.topic_id,
        leader=leader,
        leader_epoch=leader_epoch,
        partition_epoch=partition.partition_epoch + 1,
        replicas=partition.replicas if change.replicas is None else tuple(change.replicas),
        isr=partition.isr if change.isr is None else tuple(change.isr),
    )


@dataclass(frozen=True, slots=True)
class SnapshotId:
    """A snapshot's name: the offset the log continues from, and the epoch of its last record."""

    end_offset: int
    epoch: int

    @property
    def file_name(self) -> str:
        """Snapshots.filenameFromSnapshotId + SUFFIX."""
        return f"{self.end_offset:020d}-{self.epoch:010d}{SNAPSHOT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """What a broker's metadata log says: every partition's leadership, topic ids by name,
    finalized feature levels, where the replay started (the snapshot) and where it ended."""

    partitions: Mapping[TopicPartition, Leadership]
    topic_ids: Mapping[str, uuid.UUID]
    features: Mapping[str, int]
    snapshot: SnapshotId | None
    next_offset: int  # the offset after the last one replayed
    # The end of the active segment that was not replayed (file, byte, why), or None.
    torn_tail: tuple[Path, int, str] | None = None


class MetadataReplay:
    """Applies metadata records as a broker's MetadataLoader does (TopicsDelta, TopicDelta,
    PartitionRegistration.merge, MetadataBatchLoader's transactions)."""

    def __init__(self) -> None:
        self.topics: dict[uuid.UUID, str] = {}
        self.partitions: dict[uuid.UUID, dict[int, Leadership]] = {}
        self.features: dict[str, int] = {}
        self._saved: tuple[dict, dict, dict] | None = None  # the state before an open transaction

    def apply(self, record: Any) -> None:
        """Apply one record; ValueError when it contradicts the state (Kafka's replay throws too)."""
        if isinstance(record, PartitionChangeRecord):
            partitions = self.partitions.get(record.topic_id)
            current = None if partitions is None else partitions.get(record.partition_id)
            if current is None:
                raise ValueError(f"PartitionChangeRecord for partition {record.partition_id} of topic id "
                                 f"{record.topic_id}, which does not exist")
            partitions[record.partition_id] = merge_partition_change(current, record)
        elif isinstance(record, PartitionRecord):
            partitions = self.partitions.get(record.topic_id)
            if partitions is None:
                raise ValueError(f"PartitionRecord for partition {record.partition_id} of topic id {record.topic_id}, "
                                 "which does not exist")
            partitions[record.partition_id] = Leadership(
                record.topic_id, record.leader, record.leader_epoch, record.partition_epoch,
                tuple(record.replicas), tuple(record.isr),
            )
        elif isinstance(record, TopicRecord):
            self.topics[record.topic_id] = record.name
            self.partitions[record.topic_id] = {}  # TopicsDelta.replay: a fresh topic image
        elif isinstance(record, RemoveTopicRecord):
            if record.topic_id not in self.topics:
                raise ValueError(f"RemoveTopicRecord for topic id {record.topic_id}, which does not exist")
            del self.topics[record.topic_id]
            del self.partitions[record.topic_id]
        elif isinstance(record, FeatureLevelRecord):
            if record.feature_level == 0:
                self.features.pop(record.name, None)  # level 0: the feature is off (FeaturesDelta)
            else:
                self.features[record.name] = record.feature_level
        elif isinstance(record, BeginTransactionRecord):
            if self._saved is not None:
                raise ValueError("BeginTransactionRecord inside an open transaction")
            self._saved = self._copy()
        elif isinstance(record, (EndTransactionRecord, AbortTransactionRecord)):
            if self._saved is None:
                raise ValueError(f"{type(record).__name__} without a BeginTransactionRecord")
            if isinstance(record, AbortTransactionRecord):
                self.topics, self.partitions, self.features = self._saved
            self._saved = None

    def _copy(self) -> tuple[dict, dict, dict]:
        return dict(self.topics), {t: dict(p) for t, p in self.partitions.items()}, dict(self.features)

    def finish(self) -> None:
        """The end of what is readable: a transaction still open there is not applied (yet)."""
        if self._saved is not None:
            self.topics, self.partitions, self.features = self._saved
            self._saved = None

    def metadata(self, snapshot: SnapshotId | None, next_offset: int, torn_tail=None) -> ClusterMetadata:
        partitions: dict[TopicPartition, Leadership] = {}
        topic_ids: dict[str, uuid.UUID] = {}
        for topic_id, name in self.topics.items():
            topic_ids[name] = topic_id
            for number, leadership in self.partitions[topic_id].items():
                partitions[TopicPartition(name, number)] = leadership
        return ClusterMetadata(dict(sorted(partitions.items())), topic_ids, dict(self.features), snapshot,
                               next_offset, torn_tail)

    @classmethod
    def of(cls, metadata: ClusterMetadata) -> MetadataReplay:
        """The state a replay that ended in ``metadata`` holds."""
        replay = cls()
        replay.features = dict(metadata.features)
        for name, topic_id in metadata.topic_ids.items():
            replay.topics[topic_id] = name
            replay.partitions[topic_id] = {}
        for tp, leadership in metadata.partitions.items():
            replay.partitions[leadership.topic_id][tp.partition] = leadership
        return replay

    def image_records(self) -> list[Any]:
        """The records a snapshot of this state holds (features, then each topic and its partitions)."""
        records: list[Any] = [FeatureLevelRecord(name, level) for name, level in sorted(self.features.items())]
        for topic_id, name in self.topics.items():
            records.append(TopicRecord(name, topic_id))
            for number, p in sorted(self.partitions[topic_id].items()):
                records.append(PartitionRecord(partition_id=number, topic_id=topic_id, replicas=p.replicas, isr=p.isr,
                                               leader=p.leader, leader_epoch=p.leader_epoch,
                                               partition_epoch=p.partition_epoch))
        return records


# --- reading a metadata log dir ---------------------------------------------------------------------


def metadata_partition_dir(path: str | os.PathLike) -> Path | None:
    """``path`` itself when it is ``__cluster_metadata-0``, else ``path/__cluster_metadata-0``
    when that directory exists (``path`` is a log dir or a metadata.log.dir); None otherwise."""
    p = Path(path)
    if p.name == METADATA_PARTITION_DIR and p.is_dir():
        return p
    candidate = p / METADATA_PARTITION_DIR
    return candidate if candidate.is_dir() else None


def list_snapshots(partition_dir: str | os.PathLike) -> list[tuple[SnapshotId, Path]]:
    """The partition's snapshots, oldest first (Kafka orders OffsetAndEpoch by offset, then epoch)."""
    found = []
    with os.scandir(partition_dir) as entries:
        for entry in entries:
            m = _SNAPSHOT_NAME.fullmatch(entry.name)
            if m and entry.is_file():
                found.append((SnapshotId(int(m.group(1)), int(m.group(2))), Path(entry.path)))
    return sorted(found, key=lambda item: (item[0].end_offset, item[0].epoch))


def read_cluster_metadata(path: str | os.PathLike) -> ClusterMetadata | None:
    """Replay the metadata log under ``path`` (a log dir, a metadata.log.dir, or the
    ``__cluster_metadata-0`` directory): the newest snapshot, then the log after it, to the end of
    the valid batches (see the module's notes on the high watermark). None when there is no
    metadata log there. :class:`MetadataLogError` names the file and byte of anything unreadable.

    A broker deletes old segments and snapshots and truncates its log while kts reads: a file that
    vanishes or shrinks underneath makes the read start again (three tries).
    """
    partition_dir = metadata_partition_dir(path)
    if partition_dir is None:
        return None
    for attempt in range(3):
        try:
            return replay_partition_dir(partition_dir)
        except (FileNotFoundError, FileChangedError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def replay_partition_dir(partition_dir: Path) -> ClusterMetadata:
    replay = MetadataReplay()
    snapshots = list_snapshots(partition_dir)
    snapshot = snapshots[-1][0] if snapshots else None
    if snapshots:
        _replay_snapshot(snapshots[-1][1], replay)
    start = snapshot.end_offset if snapshot else 0
    try:
        segments = list_segments(partition_dir)
    except UnreadableSegmentError as e:
        raise MetadataLogError(str(e)) from None
    if segments and segments[0].base_offset > start:
        # KafkaMetadataLog.recoverSnapshots: "Inconsistent snapshot state" (no snapshot reaches the log start).
        held = f"the newest snapshot, {snapshot.file_name}, ends at offset {start}" if snapshot else "there is no snapshot"
        raise MetadataLogError(f"the log starts at offset {segments[0].base_offset} and {held}: offsets "
                               f"{start}..{segments[0].base_offset - 1} are in neither", path=segments[0].log, position=0)
    expected = start  # the next offset the replay needs
    torn_tail = None
    for segment in segments:
        if segment.next_base_offset is not None and segment.next_base_offset <= start:
            continue  # wholly inside the snapshot
        data = bytes(read_whole(segment.log, what="metadata log segment"))
        scan = scan_batches(data, verify_crc=True)
        for i, header in enumerate(scan.batches):
            where = {"path": segment.log, "position": header.position}
            if header.magic != 2:
                raise MetadataLogError(f"a magic-{header.magic} message in the metadata log (KRaft writes magic 2 only)", **where)
            if header.last_offset < expected:
                if header.last_offset < start and expected == start:
                    continue  # a batch the snapshot already holds
                raise MetadataLogError(f"batch at offset {header.base_offset} goes back before offset {expected}", **where)
            if header.base_offset > expected:
                raise MetadataLogError(f"offsets {expected}..{header.base_offset - 1} are missing before this batch", **where)
            if header.crc_ok is False:
                if segment.active and i == len(scan.batches) - 1:
                    torn_tail = (segment.log, header.position, "the last batch fails its CRC")
                    break
                raise MetadataLogError(f"batch at offset {header.base_offset} fails its CRC (stored {header.crc:#010x})", **where)
            if not header.is_control:
                _replay_batch(data, header, replay, expected, where)
            expected = header.last_offset + 1
        if torn_tail is None and scan.invalid is not None:
            where = {"path": segment.log, "position": scan.invalid.position}
            if not segment.active:
                raise MetadataLogError(f"{scan.invalid.length} invalid bytes in a closed segment ({scan.invalid.reason})", **where)
            torn_tail = (segment.log, scan.invalid.position, scan.invalid.reason)
        if torn_tail is not None:
            break
    replay.finish()
    return replay.metadata(snapshot, expected, torn_tail)


def _replay_batch(data: bytes, header: BatchHeader, replay: MetadataReplay, first_offset: int, where: dict) -> None:
    try:
        records = decode_batch(data, header, verify_crc=False)
    except KafkaFormatError as e:
        raise MetadataLogError(e.message, **where) from None
    for record in records:
        if record.offset < first_offset:
            continue  # in a batch the snapshot ends inside: that part is in the snapshot
        if record.value is None:
            raise MetadataLogError(f"record at offset {record.offset} has no value", **where)
        try:
            replay.apply(decode_record(record.value, only=_REPLAYED))
        except MetadataLogError as e:
            raise MetadataLogError(f"record at offset {record.offset}: {e.message}", **where) from None
        except ValueError as e:
            raise MetadataLogError(f"record at offset {record.offset} does not replay: {e}", **where) from None


def _replay_snapshot(path: Path, replay: MetadataReplay) -> None:
    data = bytes(read_whole(path, what="metadata snapshot"))
    scan = scan_batches(data, verify_crc=True)
    if scan.invalid is not None:
        # A snapshot is written as .checkpoint.part and renamed when whole: a short one is damage.
        raise MetadataLogError(f"{scan.invalid.length} invalid bytes in a snapshot ({scan.invalid.reason})",
                               path=path, position=scan.invalid.position)
    if not scan.batches:
        raise MetadataLogError("the snapshot is empty: no SnapshotHeaderRecord", path=path, position=0)
    for i, header in enumerate(scan.batches):
        where = {"path": path, "position": header.position}
        if header.magic != 2:
            raise MetadataLogError(f"a magic-{header.magic} message in a snapshot", **where)
        if header.crc_ok is False:
            raise MetadataLogError(f"batch at offset {header.base_offset} fails its CRC (stored {header.crc:#010x})", **where)
        if i == 0:
            _check_snapshot_header(data, header, where)
        if not header.is_control:
            _replay_batch(data, header, replay, 0, where)
    # RecordsSnapshotReader checks the header only; a missing footer is not an error there either.


def _check_snapshot_header(data: bytes, header: BatchHeader, where: dict) -> None:
    """RecordsSnapshotReader: the first batch is a control batch whose first record is the header."""
    records = decode_batch(data, header, verify_crc=False) if header.is_control else []
    kind = parse_control_record(records[0]).type if records else None
    if kind != SNAPSHOT_HEADER:
        raise MetadataLogError("the snapshot does not start with a SnapshotHeaderRecord control batch", **where)


def encode_snapshot(records: Sequence[Any], *, epoch: int, timestamp: int = 0, records_per_batch: int = 100,
                    last_contained_log_timestamp: int = 0) -> bytes:
    """A snapshot file's bytes (RecordsSnapshotWriter): a header control batch at offset 0, the
    records in batches, a footer control batch; every batch's partition leader epoch is ``epoch``."""
    out = [control_batch(SNAPSHOT_HEADER, SnapshotHeaderRecord(0, last_contained_log_timestamp), base_offset=0,
                         epoch=epoch, timestamp=timestamp)]
    offset = 1
    for i in range(0, len(records), records_per_batch):
        chunk = records[i : i + records_per_batch]
        out.append(build_batch([NewRecord(timestamp, None, encode_record(r)) for r in chunk], base_offset=offset,
                               partition_leader_epoch=epoch))
        offset += len(chunk)
    out.append(control_batch(SNAPSHOT_FOOTER, SnapshotFooterRecord(0), base_offset=offset, epoch=epoch, timestamp=timestamp))
    return b"".join(out)


__all__ = [
    "AbortTransactionRecord", "BeginTransactionRecord", "ClusterMetadata", "EndTransactionRecord", "FeatureLevelRecord",
    "Leadership", "LeaderChangeMessage", "MetadataLogError", "MetadataReplay", "NoOpRecord", "PartitionChangeRecord",
    "PartitionRecord", "RegisterBrokerRecord", "RemoveTopicRecord", "SnapshotFooterRecord", "SnapshotHeaderRecord",
    "SnapshotId", "TopicRecord", "UnknownRecord", "Voter", "control_batch", "decode_message", "decode_record",
    "encode_message", "encode_record", "encode_snapshot", "encode_uvarint", "list_snapshots", "merge_partition_change",
    "metadata_partition_dir", "read_cluster_metadata", "replay_partition_dir",
]
