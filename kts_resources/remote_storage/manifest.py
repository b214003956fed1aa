"""A remote segment's manifest: its RemoteLogSegmentMetadata as a small JSON object beside its
objects, so the remote tier alone describes every finished segment (``kts recover``).

Pure: values in, bytes out and back; no I/O, no Dagster. The copy writes the manifest after every
object of the segment is uploaded and before the store records COPY_SEGMENT_FINISHED, so a
finished segment always has one; the delete procedure removes it first, so a manifest never
outlives an object it names. Parsing is strict: anything but exactly this layout is one
``ManifestError`` naming the object.

Version 1, canonical JSON (sorted keys, no blanks, UTF-8, one trailing newline)::

    {"format": "kts-remote-segment-manifest", "version": 1,
     "topic": "orders", "topic_id": "<Kafka Uuid.toString>", "partition": 0,
     "segment_id": "<Kafka Uuid.toString>", "start_offset": 0, "end_offset": 99,
     "max_timestamp_ms": 1700000000000, "broker_id": 0, "event_timestamp_ms": 1700000000123,
     "segment_size_in_bytes": 16384, "segment_leader_epochs": [[0, 0], [3, 57]],
     "objects": {"log": {"key": "...", "size": 16384, "crc32c": "1a2b3c4d"}, ...},
     "topic_configs": {"retention.ms": "86400000"}, "log_start_offset": 0, "crc32c": "89abcdef"}

``crc32c`` is the CRC-32C of the canonical encoding of every other field: a flipped bit anywhere
(an object key, an offset) is a damaged manifest, never a plausible other segment.
``topic_configs`` are the topic's overrides (Kafka's names) and ``log_start_offset`` the
partition's log start offset in the metadata store, both as of the copy.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from kts_resources.kafka.checkpoints import topic_id_from_base64, topic_id_to_base64
from kts_resources.kafka.partition import MAX_PARTITION, TopicPartition, topic_name_problem
from kts_resources.kafka.crc import crc32c

from kts_resources.remote_log import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from kts_resources.remote_storage.base import (
    RemoteStorageManager,
    StoredObject,
    crc32c_hex,
    parse_crc32c_hex,
    segment_custom_metadata,
    stored_objects,
)
from kts_resources.remote_storage.keys import LOG_SUFFIX, MAX_OFFSET, REMOTE_INDEX_VERSION, SEGMENT_SUFFIXES, check_object_key

FORMAT = "kts-remote-segment-manifest"
VERSION = 1
# A manifest is a few hundred bytes; anything far larger is not one.
MAX_MANIFEST_BYTES = 1024 * 1024
# Objects every copied segment has (a .txnindex and a producer snapshot only when the segment had them).
REQUIRED_OBJECTS = frozenset({LOG_SUFFIX, "index", "timeindex", "leader-epoch-checkpoint"})

_FIELDS = frozenset({
    "format", "version", "topic", "topic_id", "partition", "segment_id", "start_offset", "end_offset",
    "max_timestamp_ms", "broker_id", "event_timestamp_ms", "segment_size_in_bytes", "segment_leader_epochs",
    "objects", "topic_configs", "log_start_offset", "crc32c",
})
_OBJECT_FIELDS = frozenset({"key", "size", "crc32c"})
_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)


class ManifestError(ValueError):
    """A manifest that is not one kts wrote (damaged, truncated, another version): the message
    starts with where it is."""


@dataclass(frozen=True)
class SegmentManifest:
    """What a manifest says: the segment (COPY_SEGMENT_FINISHED, custom metadata = its objects),
    its objects by suffix, and the topic's configs and partition's log start offset at copy time."""

    metadata: RemoteLogSegmentMetadata
    objects: Mapping[str, StoredObject]
    topic_configs: Mapping[str, str] = field(default_factory=dict)
    log_start_offset: int = 0

    @classmethod
    def of(cls, metadata: RemoteLogSegmentMetadata, objects: Mapping[str, StoredObject], *,
           topic_configs: Mapping[str, str] | None = None, log_start_offset: int = 0) -> "SegmentManifest":
        """The manifest of a segment whose objects are ``objects`` (as the copy uploaded them)."""
        finished = RemoteLogSegmentMetadata(
            segment_id=metadata.segment_id, start_offset=metadata.start_offset, end_offset=metadata.end_offset,
            max_timestamp_ms=metadata.max_timestamp_ms, broker_id=metadata.broker_id,
            event_timestamp_ms=metadata.event_timestamp_ms, segment_size_in_bytes=metadata.segment_size_in_bytes,
            segment_leader_epochs=dict(metadata.segment_leader_epochs), state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            custom_metadata=segment_custom_metadata(objects),
        )
        return cls(finished, dict(objects), dict(topic_configs or {}), log_start_offset)

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.metadata.topic_id_partition


def encode_manifest(manifest: SegmentManifest) -> bytes:
    """The manifest's bytes (canonical: the same manifest always encodes the same)."""
    md = manifest.metadata
    tip = md.topic_id_partition
    body = {
        "format": FORMAT,
        "version": VERSION,
        "topic": tip.topic,
        "topic_id": topic_id_to_base64(tip.topic_id),
        "partition": tip.partition,
        "segment_id": topic_id_to_base64(md.segment_id.id),
        "start_offset": md.start_offset,
        "end_offset": md.end_offset,
        "max_timestamp_ms": md.max_timestamp_ms,
        "broker_id": md.broker_id,
        "event_timestamp_ms": md.event_timestamp_ms,
        "segment_size_in_bytes": md.segment_size_in_bytes,
        "segment_leader_epochs": [[e, s] for e, s in sorted(md.segment_leader_epochs.items())],
        "objects": {suffix: {"key": o.key, "size": o.size, "crc32c": crc32c_hex(o.crc32c)}
                    for suffix, o in sorted(manifest.objects.items())},
        "topic_configs": {k: str(v) for k, v in sorted(manifest.topic_configs.items())},
        "log_start_offset": manifest.log_start_offset,
    }
    body["crc32c"] = crc32c_hex(crc32c(_canonical(body)))
    data = _canonical(body) + b"\n"
    # What is written must read back: a value the parser refuses is a bug here, not a damaged object later.
    decode_manifest(data, where="the manifest being written")
    return data


def decode_manifest(data: bytes | bytearray | memoryview, *, where: str) -> SegmentManifest:
    """The manifest in ``data``; ManifestError (its message starting with ``where``) for anything
    that is not exactly a version-1 manifest with consistent values."""
    try:
        return _decode(bytes(data))
    except ManifestError as e:
        raise ManifestError(f"{where}: damaged manifest: {e}") from None


def _decode(data: bytes) -> SegmentManifest:
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{len(data)} bytes, more than a manifest's {MAX_MANIFEST_BYTES}")
    try:
        text = data.decode("utf-8")
        body = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ManifestError(f"not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"not JSON: {e.msg} at byte {e.pos}") from None
    if not isinstance(body, dict):
        raise ManifestError("not a JSON object")
    if body.get("format") != FORMAT:
        raise ManifestError(f"format is {body.get('format')!r}, not {FORMAT!r}")
    if body.get("version") != VERSION or type(body.get("version")) is not int:
        raise ManifestError(f"version {body.get('version')!r} is not {VERSION} (the only version this kts reads)")
    missing, extra = _FIELDS - body.keys(), body.keys() - _FIELDS
    if missing:
        raise ManifestError(f"missing field(s) {', '.join(sorted(missing))}")
    if extra:
        raise ManifestError(f"unknown field(s) {', '.join(sorted(extra))}")
    recorded = body.pop("crc32c")
    actual = crc32c_hex(crc32c(_canonical(body)))
    if recorded != actual:
        raise ManifestError(f"its CRC-32C is {actual}, the manifest records {recorded!r}: it was altered or corrupted")

    topic = _str(body, "topic")
    problem = topic_name_problem(topic)
    if problem is not None:
        raise ManifestError(f"topic: {problem}")
    topic_id = _uuid(body, "topic_id")
    partition = _int(body, "partition", 0, MAX_PARTITION)
    segment_id = _uuid(body, "segment_id")
    start = _int(body, "start_offset", 0, MAX_OFFSET)
    end = _int(body, "end_offset", start, MAX_OFFSET)
    size = _int(body, "segment_size_in_bytes", 0, _INT64[1])
    epochs = _epochs(body.get("segment_leader_epochs"), start, end)
    objects = _objects(body.get("objects"))
    if objects[LOG_SUFFIX].size != size:
        raise ManifestError(f"the log object has {objects[LOG_SUFFIX].size} bytes, segment_size_in_bytes says {size}")
    configs = body.get("topic_configs")
    if not isinstance(configs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
        raise ManifestError("topic_configs is not an object of strings")
    tip = TopicIdPartition(topic_id, TopicPartition(topic, partition))
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, segment_id),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=_int(body, "max_timestamp_ms", *_INT64),
        broker_id=_int(body, "broker_id", *_INT32),
        event_timestamp_ms=_int(body, "event_timestamp_ms", *_INT64),
        segment_size_in_bytes=size,
        segment_leader_epochs=epochs,
        state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        custom_metadata=segment_custom_metadata(objects),
    )
    return SegmentManifest(metadata, objects, dict(configs), _int(body, "log_start_offset", 0, MAX_OFFSET))


def manifest_differences(manifest: SegmentManifest, recorded: RemoteLogSegmentMetadata) -> list[str]:
    """What ``manifest`` says that the store's row ``recorded`` does not, one phrase per field
    (``end_offset 106 (store 99)``); empty when they describe the same segment. The topic's
    configs, the log start offset and the event time are as of the write and may move since."""
    md = manifest.metadata
    pairs = {
        "segment": (str(md.segment_id.id), str(recorded.segment_id.id)),
        "partition": (str(md.topic_id_partition), str(recorded.topic_id_partition)),
        "start_offset": (md.start_offset, recorded.start_offset),
        "end_offset": (md.end_offset, recorded.end_offset),
        "max_timestamp_ms": (md.max_timestamp_ms, recorded.max_timestamp_ms),
        "broker_id": (md.broker_id, recorded.broker_id),
        "segment_size_in_bytes": (md.segment_size_in_bytes, recorded.segment_size_in_bytes),
        "segment_leader_epochs": (sorted(md.segment_leader_epochs.items()), sorted(recorded.segment_leader_epochs.items())),
    }
    out = [f"{name} {ours} (store {theirs})" for name, (ours, theirs) in pairs.items() if ours != theirs]
    objects = {s: (o.key, o.size, o.checksum) for s, o in manifest.objects.items()}
    stored = {s: (o.key, o.size, o.checksum) for s, o in stored_objects(recorded.custom_metadata).items()}
    for suffix in sorted(objects.keys() | stored.keys()):
        if objects.get(suffix) != stored.get(suffix):
            ours, theirs = objects.get(suffix), stored.get(suffix)
            out.append(f"{suffix} object {_object_text(ours)} (store {_object_text(theirs)})")
    return out


def _object_text(obj: tuple[str, int, str] | None) -> str:
    return "none" if obj is None else f"{obj[0]} {obj[1]} bytes CRC-32C {obj[2]}"


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ManifestError(f"field {key!r} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ManifestError(f"{name} is not a JSON number")


def _str(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise ManifestError(f"{name} is {value!r}, not a string")
    return value


def _int(body: Mapping[str, Any], name: str, lo: int, hi: int) -> int:
    value = body.get(name)
    if type(value) is not int or not lo <= value <= hi:
        raise ManifestError(f"{name} is {value!r}, not a whole number in [{lo}, {hi}]")
    return value


def _uuid(body: Mapping[str, Any], name: str) -> uuid.UUID:
    text = _str(body, name)
    try:
        value = topic_id_from_base64(text)
    except ValueError:
        value = None
    if value is None or topic_id_to_base64(value) != text:
        raise ManifestError(f"{name} {text!r} is not a Kafka Uuid (22 characters of URL-safe base64)")
    return value


def _epochs(value: Any, start: int, end: int) -> dict[int, int]:
    """epoch → first offset: non-empty, epochs ≥ 0 in increasing order, first offsets rising within
    the segment (what the metadata store accepts)."""
    if not isinstance(value, list) or not value:
        raise ManifestError("segment_leader_epochs is not a non-empty list of [epoch, start offset] pairs")
    epochs: dict[int, int] = {}
    previous: tuple[int, int] | None = None
    for pair in value:
        if (not isinstance(pair, list) or len(pair) != 2 or any(type(x) is not int for x in pair)
                or not 0 <= pair[0] <= _INT32[1] or not start <= pair[1] <= end):
            raise ManifestError(f"segment_leader_epochs entry {pair!r} is not [epoch ≥ 0, start offset in [{start}, {end}]]")
        if previous is not None and (pair[0] <= previous[0] or pair[1] <= previous[1]):
            raise ManifestError(f"segment_leader_epochs {value!r} do not rise in both epoch and start offset")
        epochs[pair[0]] = pair[1]
        previous = (pair[0], pair[1])
    return epochs


def _objects(value: Any) -> dict[str, StoredObject]:
    if not isinstance(value, dict):
        raise ManifestError("objects is not an object")
    unknown = value.keys() - set(SEGMENT_SUFFIXES)
    if unknown:
        raise ManifestError(f"objects has unknown suffix(es) {', '.join(sorted(unknown))}")
    missing = REQUIRED_OBJECTS - value.keys()
    if missing:
        raise ManifestError(f"objects lacks {', '.join(sorted(missing))}")
    out = {}
    for suffix in SEGMENT_SUFFIXES:
        if suffix not in value:
            continue
        entry = value[suffix]
        if not isinstance(entry, dict) or entry.keys() != _OBJECT_FIELDS:
            raise ManifestError(f"objects.{suffix} is not {{key, size, crc32c}}")
        try:
            key = check_object_key(entry["key"]) if isinstance(entry["key"], str) else None
            crc = parse_crc32c_hex(entry["crc32c"]) if isinstance(entry["crc32c"], str) else None
        except ValueError as e:
            raise ManifestError(f"objects.{suffix}: {e}") from None
        if key is None or crc is None:
            raise ManifestError(f"objects.{suffix}: key and crc32c must be strings")
        size = entry["size"]
        if type(size) is not int or not 0 <= size <= _INT64[1]:
            raise ManifestError(f"objects.{suffix}.size is {size!r}, not a whole number ≥ 0")
        out[suffix] = StoredObject(key, size, crc)
    return out


# --- the partition's log start offset ------------------------------------------------------------
#
# A DeleteRecords moves the log start offset inside a segment; the segments' manifests carry the
# offset as of their copy only, so DeleteRecords also writes it beside the partition's segments:
# {"format": "kts-log-start-offset", "version": 1, "topic", "topic_id", "partition",
#  "log_start_offset", "crc32c"} (canonical JSON, the CRC-32C of the rest, as a manifest).

LOG_START_FORMAT = "kts-log-start-offset"
_LOG_START_FIELDS = frozenset({"format", "version", "topic", "topic_id", "partition", "log_start_offset", "crc32c"})


def encode_log_start_offset(tip: TopicIdPartition, log_start_offset: int) -> bytes:
    data = _sealed({"format": LOG_START_FORMAT, "version": VERSION, "topic": tip.topic,
                    "topic_id": topic_id_to_base64(tip.topic_id), "partition": tip.partition,
                    "log_start_offset": log_start_offset})
    decode_log_start_offset(data, where="the log start offset being written")
    return data


def put_log_start_offset(storage: RemoteStorageManager, tip: TopicIdPartition, log_start_offset: int) -> StoredObject:
    """The partition's log start offset as kts moved it (retention, DeleteRecords), written beside
    its segments: `kts recover` restores it, also once every segment below it is gone."""
    return storage.put_object(storage.keys.log_start_offset_key(tip), encode_log_start_offset(tip, log_start_offset))


def decode_log_start_offset(data: bytes | bytearray | memoryview, *, where: str) -> tuple[TopicIdPartition, int]:
    """(partition, log start offset); ManifestError (starting with ``where``) for anything else."""
    try:
        body = _checked_record(data, LOG_START_FORMAT, _LOG_START_FIELDS, "a log start offset record")
        return _record_partition(body), _int(body, "log_start_offset", 0, MAX_OFFSET)
    except ManifestError as e:
        raise ManifestError(f"{where}: damaged log start offset record: {e}") from None


def _checked_record(data: bytes | bytearray | memoryview, fmt: str, fields: frozenset[str], what: str, *,
                    max_bytes: int = MAX_MANIFEST_BYTES) -> dict[str, Any]:
    """The fields of a small record of ``fmt`` (canonical JSON whose ``crc32c`` is the CRC-32C of
    the rest; the CRC removed), exactly ``fields``; ManifestError for anything else."""
    if len(data) > max_bytes:
        raise ManifestError(f"{len(data)} bytes, far more than {what}")
    try:
        body = json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ManifestError(f"not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"not JSON: {e.msg} at byte {e.pos}") from None
    if not isinstance(body, dict) or body.get("format") != fmt:
        raise ManifestError(f"not a {fmt} record")
    if body.get("version") != VERSION or type(body.get("version")) is not int:
        raise ManifestError(f"version {body.get('version')!r} is not {VERSION}")
    if body.keys() != fields:
        raise ManifestError(f"fields {', '.join(sorted(body))} are not {', '.join(sorted(fields))}")
    recorded = body.pop("crc32c")
    if recorded != crc32c_hex(crc32c(_canonical(body))):
        raise ManifestError(f"its CRC-32C does not match the recorded {recorded!r}: it was altered or corrupted")
    return body


def _record_partition(body: Mapping[str, Any]) -> TopicIdPartition:
    topic = _str(body, "topic")
    problem = topic_name_problem(topic)
    if problem is not None:
        raise ManifestError(f"topic: {problem}")
    return TopicIdPartition(_uuid(body, "topic_id"), TopicPartition(topic, _int(body, "partition", 0, MAX_PARTITION)))


def _sealed(body: dict[str, Any]) -> bytes:
    """``body`` with its ``crc32c``, as canonical JSON and a newline."""
    body["crc32c"] = crc32c_hex(crc32c(_canonical(body)))
    return _canonical(body) + b"\n"


# --- a consumer group's committed offsets ----------------------------------------------------------
#
# `kts serve` keeps a group's committed offsets in the store, and after each commit writes the
# group's whole set here too, so the tier alone still holds them when the store is lost:
# {"format": "kts-consumer-group-offsets", "version": 1, "group_id",
#  "offsets": [[topic, partition, offset, leader epoch, metadata or null], …] in (topic, partition)
#  order, "crc32c"} (canonical JSON, the CRC-32C of the rest, as a manifest).

GROUP_OFFSETS_FORMAT = "kts-consumer-group-offsets"
_GROUP_OFFSETS_FIELDS = frozenset({"format", "version", "group_id", "offsets", "crc32c"})
# A group committing for every partition of a big broker (4,000 × ~80 bytes) stays far below this.
MAX_GROUP_OFFSETS_BYTES = 64 * 1024 * 1024
MAX_INT32 = 2**31 - 1
# (topic, partition, committed offset, leader epoch, metadata)
GroupOffset = tuple[str, int, int, int, "str | None"]


def encode_group_offsets(group_id: str, offsets: list[GroupOffset]) -> bytes:
    data = _sealed({"format": GROUP_OFFSETS_FORMAT, "version": VERSION, "group_id": group_id,
                    "offsets": [list(o) for o in sorted(offsets, key=lambda o: (o[0], o[1]))]})
    decode_group_offsets(data, where="the consumer group offsets being written")
    return data


def put_group_offsets(storage: RemoteStorageManager, group_id: str, offsets: list[GroupOffset]) -> StoredObject:
    """The group's committed offsets, as the store has them, written over its record in the tier."""
    return storage.put_object(storage.keys.group_offsets_key(group_id), encode_group_offsets(group_id, offsets))


def decode_group_offsets(data: bytes | bytearray | memoryview, *, where: str) -> tuple[str, list[GroupOffset]]:
    """(group id, its offsets); ManifestError (starting with ``where``) for anything else."""
    try:
        body = _checked_record(data, GROUP_OFFSETS_FORMAT, _GROUP_OFFSETS_FIELDS, "a consumer group's offsets",
                               max_bytes=MAX_GROUP_OFFSETS_BYTES)
        group_id = _str(body, "group_id")
        rows = body["offsets"]
        if not isinstance(rows, list):
            raise ManifestError(f"offsets is {rows!r}, not a list")
        offsets: list[GroupOffset] = []
        for i, row in enumerate(rows):
            if not (isinstance(row, list) and len(row) == 5):
                raise ManifestError(f"offsets[{i}] is not [topic, partition, offset, leader epoch, metadata]")
            fields = dict(zip(("topic", "partition", "offset", "leader_epoch", "metadata"), row))
            topic = _str(fields, "topic")
            problem = topic_name_problem(topic)
            if problem is not None:
                raise ManifestError(f"offsets[{i}]: topic: {problem}")
            metadata = fields["metadata"]
            if metadata is not None and not isinstance(metadata, str):
                raise ManifestError(f"offsets[{i}]: metadata is {metadata!r}, not a string or null")
            offsets.append((topic, _int(fields, "partition", 0, MAX_PARTITION), _int(fields, "offset", -1, MAX_OFFSET),
                            _int(fields, "leader_epoch", -1, MAX_INT32), metadata))
        if len({(o[0], o[1]) for o in offsets}) != len(offsets):
            raise ManifestError("a partition is listed twice")
        return group_id, offsets
    except ManifestError as e:
        raise ManifestError(f"{where}: damaged consumer group offsets record: {e}") from None


# --- the partition's remote log index pointer -----------------------------------------------------
#
# Names the file sets that make up the partition's current remote log index (remote_index_tier.py):
# {"format": "kts-remote-log-index", "version": 1, "topic", "topic_id", "partition", "generation",
#  "file_sets": [{"base_offset": 0, "version": "<12-digit generation>-<8 hex>",
#                 "files": {"remoteLogIndex": {"size": 123, "crc32c": "1a2b3c4d"}, "remoteOffsetIndex": …,
#                           "remoteTimeIndex": …}}, …],
#  "crc32c"} (canonical JSON, the CRC-32C of the rest, as a manifest). ``generation`` counts the
# pointers written; a file set's ``version`` is the generation that wrote it and a random tag, so
# two builders never write the same key.

INDEX_POINTER_FORMAT = "kts-remote-log-index"
INDEX_FILE_KINDS = ("remoteLogIndex", "remoteOffsetIndex", "remoteTimeIndex")  # the files' suffixes without the dot
_INDEX_POINTER_FIELDS = frozenset({"format", "version", "topic", "topic_id", "partition", "generation", "file_sets", "crc32c"})
MAX_INDEX_GENERATION = 10**12 - 1


@dataclass(frozen=True)
class IndexFileSetRef:
    """One file set a pointer names: its base offset, the version its objects are under, and each
    file's (size, CRC-32C) by kind (``INDEX_FILE_KINDS``)."""

    base_offset: int
    version: str
    files: Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class IndexPointer:
    """The partition's current remote log index: ``file_sets`` ascending by base offset."""

    topic_id_partition: TopicIdPartition
    generation: int
    file_sets: tuple[IndexFileSetRef, ...]

    def named(self) -> set[tuple[int, str]]:
        """(base offset, version) of every file set it names."""
        return {(fs.base_offset, fs.version) for fs in self.file_sets}


def encode_index_pointer(pointer: IndexPointer) -> bytes:
    tip = pointer.topic_id_partition
    data = _sealed({
        "format": INDEX_POINTER_FORMAT, "version": VERSION, "topic": tip.topic, "topic_id": topic_id_to_base64(tip.topic_id),
        "partition": tip.partition, "generation": pointer.generation,
        "file_sets": [{"base_offset": fs.base_offset, "version": fs.version,
                       "files": {kind: {"size": size, "crc32c": crc32c_hex(crc)} for kind, (size, crc) in sorted(fs.files.items())}}
                      for fs in pointer.file_sets],
    })
    decode_index_pointer(data, where="the remote log index pointer being written")
    return data


def decode_index_pointer(data: bytes | bytearray | memoryview, *, where: str) -> IndexPointer:
    """The pointer in ``data``; ManifestError (starting with ``where``) for anything else."""
    try:
        body = _checked_record(data, INDEX_POINTER_FORMAT, _INDEX_POINTER_FIELDS, "a remote log index pointer")
        tip = _record_partition(body)
        generation = _int(body, "generation", 0, MAX_INDEX_GENERATION)
        value = body["file_sets"]
        if not isinstance(value, list):
            raise ManifestError("file_sets is not a list")
        file_sets: list[IndexFileSetRef] = []
        for i, item in enumerate(value):
            if not isinstance(item, dict) or item.keys() != {"base_offset", "version", "files"}:
                raise ManifestError(f"file_sets[{i}] is not {{base_offset, version, files}}")
            base = _int(item, "base_offset", 0, MAX_OFFSET)
            if file_sets and base <= file_sets[-1].base_offset:
                raise ManifestError(f"file_sets[{i}]: base offset {base} does not follow {file_sets[-1].base_offset}")
            version = _str(item, "version")
            if REMOTE_INDEX_VERSION.fullmatch(version) is None:
                raise ManifestError(f"file_sets[{i}]: version {version!r} is not <12-digit generation>-<8 hex digits>")
            files = item["files"]
            if not isinstance(files, dict) or files.keys() != set(INDEX_FILE_KINDS):
                raise ManifestError(f"file_sets[{i}]: files are not {', '.join(INDEX_FILE_KINDS)}")
            sizes: dict[str, tuple[int, int]] = {}
            for kind, entry in files.items():
                if not isinstance(entry, dict) or entry.keys() != {"size", "crc32c"} or not isinstance(entry["crc32c"], str):
                    raise ManifestError(f"file_sets[{i}].files.{kind} is not {{size, crc32c}}")
                try:
                    crc = parse_crc32c_hex(entry["crc32c"])
                except ValueError as e:
                    raise ManifestError(f"file_sets[{i}].files.{kind}: {e}") from None
                sizes[kind] = (_int(entry, "size", 0, _INT32[1]), crc)
            file_sets.append(IndexFileSetRef(base, version, sizes))
        return IndexPointer(tip, generation, tuple(file_sets))
    except ManifestError as e:
        raise ManifestError(f"{where}: damaged remote log index pointer: {e}") from None
