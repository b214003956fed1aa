"""Object keys of the remote tier, built only from validated pieces and parsed back for orphan checks.

Layout (ARCHITECTURE.md; the same shape Aiven's plugin uses, so an operator reads it at a glance)::

    <prefix>/<topic>-<topic id>/<partition>/<20-digit start offset>-<segment id>.<suffix>

with one ``.manifest`` per finished segment beside its objects (``manifest_key``).

Topic id and segment id are Kafka's ``Uuid.toString`` (22 characters of URL-safe base64). The topic
must be a legal Kafka topic name, so no key can hold a ``..`` segment or climb out of the prefix;
the topic id in the key keeps a deleted and re-created topic's objects apart.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from kts_resources.kafka.checkpoints import topic_id_from_base64, topic_id_to_base64
from kts_resources.kafka.partition import MAX_PARTITION, TopicPartition, topic_name_problem
from kts_resources.remote_log import IndexType, RemoteLogSegmentId, TopicIdPartition

# One suffix per object a segment is made of: the .log plus one per IndexType.
LOG_SUFFIX: Final = "log"
INDEX_SUFFIXES: Final[dict[IndexType, str]] = {t: t.value.lstrip(".") for t in IndexType}
SEGMENT_SUFFIXES: Final[tuple[str, ...]] = (LOG_SUFFIX, *INDEX_SUFFIXES.values())
# The segment's manifest (kts_resources.remote_storage.manifest): its RemoteLogSegmentMetadata as
# JSON beside its objects, written last, so the tier alone describes every finished segment.
MANIFEST_SUFFIX: Final = "manifest"
# The partition's log start offset as DeleteRecords last set it (manifest.py), beside its segments.
LOG_START_OFFSET_NAME: Final = "log-start-offset"
# Consumer groups' committed offsets as `kts serve` last wrote them (group_offsets_record.py), one
# object per group, so `kts recover` restores them with the segments: ``consumer-groups/<id hash>``.
# A group id is any string; its SHA-256 names the object (the record holds the id itself). No
# partition prefix can take this name: those end in "-<22-character topic id>".
GROUP_OFFSETS_DIR: Final = "consumer-groups"
_GROUP_OFFSETS_NAME = re.compile(r"[0-9a-f]{64}")

MAX_OFFSET: Final = 2**63 - 1  # an offset is a Java long
MAX_KEY_BYTES: Final = 1024  # S3's limit on a key's UTF-8 length
MAX_TOPIC_IN_KEY: Final = 255 - 1 - 22  # "<topic>-<22-character topic id>" within one file name

_ID = r"[A-Za-z0-9_-]{22}"
_SEGMENT_KEY = re.compile(
    rf"(?P<topic>[a-zA-Z0-9._-]{{1,249}})-(?P<topic_id>{_ID})"
    rf"/(?P<partition>0|[1-9][0-9]{{0,9}})"
    rf"/(?P<start_offset>[0-9]{{20}})-(?P<segment_id>{_ID})"
    rf"\.(?P<suffix>{'|'.join(re.escape(s) for s in (*SEGMENT_SUFFIXES, MANIFEST_SUFFIX))})"
)
REMOTE_INDEX_DIR: Final = "remote-log-index"
_REMOTE_INDEX_FILE = re.compile(r"[0-9]{20}\.remote(Log|Offset|Time)Index")
# The partition's remote log index in the tier: versioned file sets under
# ``remote-log-index/<version>/`` and the pointer naming the current ones (remote_index_tier.py).
# Earlier versions wrote the files straight under ``remote-log-index/`` (the flat layout).
REMOTE_INDEX_POINTER: Final = "current"
REMOTE_INDEX_VERSION = re.compile(r"[0-9]{12}-[0-9a-f]{8}")
_REMOTE_INDEX_KEY = re.compile(
    rf"(?P<topic>[a-zA-Z0-9._-]{{1,249}})-(?P<topic_id>{_ID})/(?P<partition>0|[1-9][0-9]{{0,9}})/{REMOTE_INDEX_DIR}/"
    rf"(?:(?P<pointer>{REMOTE_INDEX_POINTER})|(?:(?P<version>{REMOTE_INDEX_VERSION.pattern})/)?"
    rf"(?P<file>{_REMOTE_INDEX_FILE.pattern}))"
)
# Characters that mean something to a file system or a shell rather than to S3: never in a key.
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")


def suffix_for_index(index_type: IndexType) -> str:
    return INDEX_SUFFIXES[index_type]


def normalise_prefix(prefix: str) -> str:
    """``prefix`` without leading, trailing or doubled ``/`` and ``.`` segments; ValueError for a
    ``..`` segment or a control character, which could make keys land outside it."""
    if _FORBIDDEN.search(prefix):
        raise ValueError(f"object key prefix {prefix!r} contains a control character or a backslash")
    parts = [p for p in prefix.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"object key prefix {prefix!r} contains a '..' segment")
    normalised = "/".join(parts)
    if len(normalised.encode("utf-8")) > MAX_KEY_BYTES // 2:
        raise ValueError(f"object key prefix {prefix!r} is too long")
    return normalised


def check_object_key(key: str) -> str:
    """``key`` itself when it is safe to hand to a store: relative, no empty, ``.`` or ``..`` segment,
    no control character or backslash, at most 1024 bytes. ValueError otherwise."""
    if not key or key.startswith("/"):
        raise ValueError(f"object key {key!r} is empty or absolute")
    if _FORBIDDEN.search(key):
        raise ValueError(f"object key {key!r} contains a control character or a backslash")
    if any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"object key {key!r} has an empty, '.' or '..' segment")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"object key {key[:64]!r}… is longer than {MAX_KEY_BYTES} bytes")
    return key


def uuid_to_base64(value: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString`` (22 characters of URL-safe base64), for topic and segment ids alike."""
    return topic_id_to_base64(value)


@dataclass(frozen=True, slots=True)
class ParsedObjectKey:
    """The pieces a segment object's key was built from."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    start_offset: int
    segment_id: uuid.UUID
    suffix: str

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, TopicPartition(self.topic, self.partition))

    @property
    def remote_log_segment_id(self) -> RemoteLogSegmentId:
        return RemoteLogSegmentId(self.topic_id_partition, self.segment_id)


@dataclass(frozen=True, slots=True)
class ParsedIndexKey:
    """A remote log index object's key: the pointer, or one file (``file_name``) of file set
    ``version`` (None: the flat layout of earlier kts versions)."""

    topic_id_partition: TopicIdPartition
    version: str | None
    file_name: str | None
    pointer: bool

    @property
    def base_offset(self) -> int | None:
        return int(self.file_name[:20]) if self.file_name is not None else None


@dataclass(frozen=True, slots=True)
class ObjectKeys:
    """Builds and parses the keys under one prefix (``""`` for the root of a bucket or directory)."""

    prefix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalise_prefix(self.prefix))

    @property
    def root(self) -> str:
        """What every key of this layout starts with: ``"<prefix>/"``, or ``""`` without a prefix."""
        return f"{self.prefix}/" if self.prefix else ""

    def partition_prefix(self, topic_id_partition: TopicIdPartition) -> str:
        """``<prefix>/<topic>-<topic id>/<partition>/``: every object of one partition."""
        topic = topic_id_partition.topic
        problem = topic_name_problem(topic) if isinstance(topic, str) else "topic name is not a string"
        if problem is not None:
            raise ValueError(f"no object key for this partition: {problem}")
        partition = topic_id_partition.partition
        if type(partition) is not int or not 0 <= partition <= MAX_PARTITION:
            raise ValueError(f"no object key for partition {partition!r}: not an int32 ≥ 0")
        if not isinstance(topic_id_partition.topic_id, uuid.UUID):
            raise ValueError(f"no object key for topic id {topic_id_partition.topic_id!r}: not a UUID")
        # The topic id names the topic; its name is cut so the directory fits a file name (255
        # bytes) on a file-system tier: Kafka allows 249 characters, 23 more for "-<id>" do not fit.
        return f"{self.root}{topic[:MAX_TOPIC_IN_KEY]}-{uuid_to_base64(topic_id_partition.topic_id)}/{partition}/"

    def segment_stem(self, segment_id: RemoteLogSegmentId, start_offset: int) -> str:
        """The key of a segment's objects without the ``.<suffix>``."""
        if type(start_offset) is not int or not 0 <= start_offset <= MAX_OFFSET:
            raise ValueError(f"no object key for start offset {start_offset!r}: not an int64 ≥ 0")
        if not isinstance(segment_id.id, uuid.UUID):
            raise ValueError(f"no object key for segment id {segment_id.id!r}: not a UUID")
        return f"{self.partition_prefix(segment_id.topic_id_partition)}{start_offset:020d}-{uuid_to_base64(segment_id.id)}"

    def segment_key(self, segment_id: RemoteLogSegmentId, start_offset: int, suffix: str) -> str:
        """The key of one object of a segment (``suffix`` is one of ``SEGMENT_SUFFIXES``, or
        ``MANIFEST_SUFFIX`` for its manifest)."""
        if suffix not in SEGMENT_SUFFIXES and suffix != MANIFEST_SUFFIX:
            raise ValueError(f"no object key for suffix {suffix!r}: not one of {', '.join((*SEGMENT_SUFFIXES, MANIFEST_SUFFIX))}")
        return f"{self.segment_stem(segment_id, start_offset)}.{suffix}"

    def segment_keys(self, segment_id: RemoteLogSegmentId, start_offset: int, suffixes: Iterable[str]) -> dict[str, str]:
        """suffix → key, for several objects of one segment (``segment_key`` of each, the stem built once)."""
        stem = self.segment_stem(segment_id, start_offset)
        keys = {}
        for suffix in suffixes:
            if suffix not in SEGMENT_SUFFIXES and suffix != MANIFEST_SUFFIX:
                self.segment_key(segment_id, start_offset, suffix)  # raises: one message for a bad suffix
            keys[suffix] = f"{stem}.{suffix}"
        return keys

    def manifest_key(self, segment_id: RemoteLogSegmentId, start_offset: int) -> str:
        """``<partition prefix><20-digit start offset>-<segment id>.manifest``: the segment's manifest."""
        return self.segment_key(segment_id, start_offset, MANIFEST_SUFFIX)

    def log_start_offset_key(self, topic_id_partition: TopicIdPartition) -> str:
        """``<partition prefix>log-start-offset``: the partition's log start offset record."""
        return self.partition_prefix(topic_id_partition) + LOG_START_OFFSET_NAME

    def group_offsets_prefix(self) -> str:
        """``<prefix>/consumer-groups/``: every consumer group's committed offsets record."""
        return f"{self.root}{GROUP_OFFSETS_DIR}/"

    def group_offsets_key(self, group_id: str) -> str:
        """``<prefix>/consumer-groups/<SHA-256 of the group id's UTF-8>``: one group's record."""
        if not isinstance(group_id, str):
            raise ValueError(f"no object key for group id {group_id!r}: not a string")
        return self.group_offsets_prefix() + hashlib.sha256(group_id.encode("utf-8")).hexdigest()

    def is_group_offsets_key(self, key: str) -> bool:
        prefix = self.group_offsets_prefix()
        return key.startswith(prefix) and _GROUP_OFFSETS_NAME.fullmatch(key[len(prefix):]) is not None

    def remote_index_prefix(self, topic_id_partition: TopicIdPartition) -> str:
        """``<partition prefix>remote-log-index/``: the partition's shipped remote log index files."""
        return f"{self.partition_prefix(topic_id_partition)}{REMOTE_INDEX_DIR}/"

    def remote_index_key(self, topic_id_partition: TopicIdPartition, file_name: str, version: str | None = None) -> str:
        """The key of one remote log index file (``<20-digit base offset>.remoteLogIndex`` etc.) of
        file set ``version`` (``remote-log-index/<version>/<file>``); without a version, its key in
        the flat layout of earlier kts versions (``remote-log-index/<file>``)."""
        if _REMOTE_INDEX_FILE.fullmatch(file_name) is None:
            raise ValueError(f"no object key for remote index file {file_name!r}: not a remote log index file name")
        if version is None:
            return self.remote_index_prefix(topic_id_partition) + file_name
        if REMOTE_INDEX_VERSION.fullmatch(version) is None:
            raise ValueError(f"no object key for remote index version {version!r}: not <12-digit generation>-<8 hex digits>")
        return f"{self.remote_index_prefix(topic_id_partition)}{version}/{file_name}"

    def remote_index_pointer_key(self, topic_id_partition: TopicIdPartition) -> str:
        """``<partition prefix>remote-log-index/current``: names the partition's current index file sets."""
        return self.remote_index_prefix(topic_id_partition) + REMOTE_INDEX_POINTER

    def parse_remote_index_key(self, key: str) -> "ParsedIndexKey | None":
        """The pieces of a remote log index object's key (a file of a versioned set, a file of the
        flat layout, or the pointer) under this prefix, or None for any other key."""
        if not key.startswith(self.root):
            return None
        m = _REMOTE_INDEX_KEY.fullmatch(key, len(self.root))
        if m is None or topic_name_problem(m["topic"]) is not None or int(m["partition"]) > MAX_PARTITION:
            return None
        try:
            topic_id = topic_id_from_base64(m["topic_id"])
        except ValueError:
            return None
        if uuid_to_base64(topic_id) != m["topic_id"]:
            return None
        tip = TopicIdPartition(topic_id, TopicPartition(m["topic"], int(m["partition"])))
        return ParsedIndexKey(tip, m["version"], m["file"], m["pointer"] is not None)

    def parse(self, key: str) -> ParsedObjectKey | None:
        """The pieces of a segment object's key under this prefix, or None for any other key (a
        stray upload, another tool's object, a key outside the prefix)."""
        if not key.startswith(self.root):
            return None
        m = _SEGMENT_KEY.fullmatch(key, len(self.root))
        if m is None or topic_name_problem(m["topic"]) is not None:
            return None
        partition, start_offset = int(m["partition"]), int(m["start_offset"])
        if partition > MAX_PARTITION or start_offset > MAX_OFFSET:
            return None
        try:
            topic_id, segment_id = topic_id_from_base64(m["topic_id"]), topic_id_from_base64(m["segment_id"])
        except ValueError:
            return None
        # Non-canonical base64 (stray low bits in the last character) decodes but is not a key kts wrote.
        if uuid_to_base64(topic_id) != m["topic_id"] or uuid_to_base64(segment_id) != m["segment_id"]:
            return None
        return ParsedObjectKey(m["topic"], topic_id, partition, start_offset, segment_id, m["suffix"])
