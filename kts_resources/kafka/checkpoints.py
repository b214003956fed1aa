"""Kafka's text checkpoint files and ``partition.metadata``, read strictly and written atomically.

``CheckpointFile`` format: line 1 the version (0), line 2 the entry count, then one entry per line,
fields separated by whitespace. Used by the log dir's ``replication-offset-checkpoint``,
``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint`` (``topic partition
offset``) and by each partition's ``leader-epoch-checkpoint`` (``epoch startOffset``).

Reading accepts what Kafka's reader accepts and nothing else; a malformed file raises
:class:`CheckpointError` naming the file, the byte position of the bad line and its line number.
A missing file raises :class:`MissingCheckpointError` (a ``FileNotFoundError``) so each caller can
decide whether missing is fatal. Writers follow Kafka: write ``<name>.tmp``, fsync, rename over
the target, fsync the directory.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

from .files import fsync_directory, write_atomically  # noqa: F401  (re-exported)
from .errors import CheckpointError
from .partition import TopicPartition, topic_name_problem

T = TypeVar("T")

CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
TMP_SUFFIX = ".tmp"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """The checkpoint file does not exist (not the same as malformed: callers may treat it as empty)."""


# --- atomic writes ------------------------------------------------------------------------------


def read_checkpoint_bytes(path: str | os.PathLike, what: str | None = None) -> bytes:
    """The file's bytes; :class:`MissingCheckpointError` when it does not exist."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise MissingCheckpointError(f"missing {what or Path(path).name} (no such file)", path=path) from None


# --- the CheckpointFile text format -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointLine:
    """One line of a checkpoint file: 1-based number, byte position of its first byte, text."""

    number: int
    position: int
    text: str


_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_WHITESPACE = re.compile(r"\s+")


def parse_java_int(text: str, bits: int, what: str) -> int:
    """Integer.parseInt / Long.parseLong: optional sign, ASCII digits, in range; ValueError otherwise."""
    if not _JAVA_INT.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not an integer")
    value = int(text)
    low, high = (INT32_MIN, INT32_MAX) if bits == 32 else (INT64_MIN, INT64_MAX)
    if not low <= value <= high:
        raise ValueError(f"{what} {text} does not fit an int{bits}")
    return value


def split_fields(text: str) -> list[str]:
    """Kafka splits entries on ``\\s+`` with Java's split: a leading empty field stays, trailing ones go."""
    fields = _WHITESPACE.split(text)
    while fields and fields[-1] == "":
        fields.pop()
    return fields


def checkpoint_lines(data: bytes, *, path: str | os.PathLike | None = None) -> list[CheckpointLine]:
    """Split into lines the way Java's readLine does (``\\n`` or ``\\r\\n``), keeping byte positions."""
    lines: list[CheckpointLine] = []
    position = 0
    number = 1
    while position < len(data):
        end = data.find(b"\n", position)
        stop = len(data) if end < 0 else end
        raw = data[position:stop]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"line {number}: not UTF-8", path=path, position=position) from None
        lines.append(CheckpointLine(number, position, text))
        if end < 0:
            break
        position = end + 1
        number += 1
    return lines


def parse_checkpoint(
    data: bytes,
    parse_entry: Callable[[list[str]], T],
    *,
    path: str | os.PathLike | None = None,
    version: int = CHECKPOINT_VERSION,
) -> list[T]:
    """Entries of a ``CheckpointFile``; ``parse_entry`` gets one line's fields and raises ValueError if bad.

    Like Kafka, an empty file (and a file holding only the version line) has no entries: Kafka
    creates checkpoint files empty before the first write.
    """
    lines = checkpoint_lines(data, path=path)
    if not lines:
        return []

    def error(line: CheckpointLine, message: str) -> CheckpointError:
        return CheckpointError(f"line {line.number}: {message}", path=path, position=line.position)

    version_line = lines[0]
    try:
        found_version = parse_java_int(version_line.text, 32, "version")
    except ValueError as e:
        raise error(version_line, f"malformed version line: {e}") from None
    if found_version != version:
        raise error(version_line, f"unrecognised version {found_version}, expected {version}")
    if len(lines) == 1:
        return []

    count_line = lines[1]
    try:
        expected = parse_java_int(count_line.text, 32, "entry count")
    except ValueError as e:
        raise error(count_line, f"malformed entry count line: {e}") from None
    if expected < 0:
        raise error(count_line, f"negative entry count {expected}")

    entries: list[T] = []
    for line in lines[2:]:
        try:
            entries.append(parse_entry(split_fields(line.text)))
        except ValueError as e:
            raise error(line, f"malformed entry {line.text!r}: {e}") from None
    if len(entries) != expected:
        raise error(count_line, f"entry count says {expected} but {len(entries)} entry lines follow")
    return entries


def format_checkpoint(lines: Sequence[str], *, version: int = CHECKPOINT_VERSION) -> bytes:
    """The bytes Kafka writes: version, count, one entry per line, each line ending in a newline."""
    return "".join(f"{line}\n" for line in [str(version), str(len(lines)), *lines]).encode("utf-8")


def read_checkpoint(
    path: str | os.PathLike,
    parse_entry: Callable[[list[str]], T],
    *,
    version: int = CHECKPOINT_VERSION,
) -> list[T]:
    return parse_checkpoint(read_checkpoint_bytes(path), parse_entry, path=path, version=version)


def write_checkpoint(path: str | os.PathLike, lines: Sequence[str], *, version: int = CHECKPOINT_VERSION) -> None:
    write_atomically(path, format_checkpoint(lines, version=version))


def _expect_fields(fields: list[str], count: int, layout: str) -> None:
    if len(fields) != count:
        raise ValueError(f"expected {count} fields ({layout}), found {len(fields)}")


# --- offset checkpoints (log dir root) ----------------------------------------------------------


def _offset_entry(fields: list[str]) -> tuple[TopicPartition, int]:
    _expect_fields(fields, 3, "topic partition offset")
    topic, partition, offset = fields
    return TopicPartition(topic, parse_java_int(partition, 32, "partition")), parse_java_int(offset, 64, "offset")


def parse_offset_checkpoint(data: bytes, *, path: str | os.PathLike | None = None) -> dict[TopicPartition, int]:
    """``topic partition offset`` entries; a repeated partition keeps its last offset, as Kafka's map does."""
    return dict(parse_checkpoint(data, _offset_entry, path=path))


def format_offset_checkpoint(offsets: Mapping[TopicPartition, int]) -> bytes:
    lines = []
    for tp in sorted(offsets):
        offset = offsets[tp]
        _check_writable_partition(tp)
        _check_range(offset, 64, "offset")
        lines.append(f"{tp.topic} {tp.partition} {offset}")
    return format_checkpoint(lines)


def read_offset_checkpoint(path: str | os.PathLike) -> dict[TopicPartition, int]:
    return parse_offset_checkpoint(read_checkpoint_bytes(path), path=path)


def write_offset_checkpoint(path: str | os.PathLike, offsets: Mapping[TopicPartition, int]) -> None:
    write_atomically(path, format_offset_checkpoint(offsets))


def _check_writable_partition(tp: TopicPartition) -> None:
    # Whitespace in a topic would split the line differently when read back.
    problem = topic_name_problem(tp.topic)
    if problem is not None:
        raise ValueError(problem)
    if not 0 <= tp.partition <= INT32_MAX:
        raise ValueError(f"partition {tp.partition} is not a non-negative int32")


def _check_range(value: int, bits: int, what: str) -> None:
    low, high = (INT32_MIN, INT32_MAX) if bits == 32 else (INT64_MIN, INT64_MAX)
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {value!r} does not fit an int{bits}")


# --- leader-epoch-checkpoint (partition dir) ----------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class EpochEntry:
    """From ``start_offset`` on, the partition's records were written under leader ``epoch``."""

    epoch: int
    start_offset: int


def _epoch_entry(fields: list[str]) -> EpochEntry:
    _expect_fields(fields, 2, "epoch startOffset")
    return EpochEntry(parse_java_int(fields[0], 32, "epoch"), parse_java_int(fields[1], 64, "start offset"))


def parse_leader_epoch_checkpoint(data: bytes, *, path: str | os.PathLike | None = None) -> list[EpochEntry]:
    return parse_checkpoint(data, _epoch_entry, path=path)


def format_leader_epoch_checkpoint(entries: Iterable[EpochEntry]) -> bytes:
    lines = []
    for entry in entries:
        _check_range(entry.epoch, 32, "epoch")
        _check_range(entry.start_offset, 64, "start offset")
        lines.append(f"{entry.epoch} {entry.start_offset}")
    return format_checkpoint(lines)


def read_leader_epoch_checkpoint(path: str | os.PathLike) -> list[EpochEntry]:
    return parse_leader_epoch_checkpoint(read_checkpoint_bytes(path), path=path)


def write_leader_epoch_checkpoint(path: str | os.PathLike, entries: Iterable[EpochEntry]) -> None:
    write_atomically(path, format_leader_epoch_checkpoint(entries))


def epochs_up_to(entries: Iterable[EpochEntry], end_offset: int) -> list[EpochEntry]:
    """The lineage a tiered segment carries: entries that start at or before the segment's end offset.

    Kafka truncates the epoch cache from the end at the next segment's base offset (end + 1).
    """
    return [entry for entry in entries if entry.start_offset <= end_offset]


def epoch_for_offset(entries: Sequence[EpochEntry], offset: int) -> int | None:
    """The leader epoch ``offset`` was written under: the last entry starting at or before it."""
    found = None
    for entry in entries:
        if entry.start_offset > offset:
            break
        found = entry.epoch
    return found


# --- partition.metadata -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """``partition.metadata``: the topic id a partition directory belongs to."""

    version: int
    topic_id: uuid.UUID


_BASE64URL = re.compile(r"[A-Za-z0-9_-]{22}(==)?")
_KEY_VALUE = re.compile(r":\s+")


def topic_id_to_base64(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: the 16 bytes in URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")


def topic_id_from_base64(text: str) -> uuid.UUID:
    """Kafka's ``Uuid.fromString``; ValueError unless ``text`` is 16 bytes of URL-safe base64."""
    if not _BASE64URL.fullmatch(text):
        raise ValueError(f"topic id {text!r} is not 22 characters of URL-safe base64")
    try:
        raw = base64.b64decode(text[:22] + "==", altchars=b"-_", validate=True)
    except binascii.Error as e:
        raise ValueError(f"topic id {text!r}: {e}") from None
    return uuid.UUID(bytes=raw)


def encode_partition_metadata(metadata: PartitionMetadata) -> bytes:
    """Exactly Kafka's bytes: two lines, no trailing newline."""
    if metadata.version < 0:
        raise ValueError(f"version {metadata.version} is negative")
    return f"version: {metadata.version}\ntopic_id: {topic_id_to_base64(metadata.topic_id)}".encode("utf-8")


def decode_partition_metadata(data: bytes, *, path: str | os.PathLike | None = None) -> PartitionMetadata:
    """Read ``version: N`` / ``topic_id: <id>``; lines after the second are ignored, as Kafka does.

    Versions above 0 are accepted (Kafka keeps downgrades readable); the zero UUID is not a topic id.
    """
    lines = checkpoint_lines(data, path=path)

    def field(index: int, key: str) -> tuple[CheckpointLine, str]:
        if index >= len(lines):
            position = len(data)
            raise CheckpointError(f"line {index + 1}: missing the {key!r} line", path=path, position=position)
        line = lines[index]
        parts = _KEY_VALUE.split(line.text)
        if len(parts) != 2 or parts[0] != key:
            raise CheckpointError(
                f"line {line.number}: malformed line {line.text!r}, expected '{key}: <value>'",
                path=path, position=line.position,
            )
        return line, parts[1]

    version_line, version_text = field(0, "version")
    try:
        version = parse_java_int(version_text, 32, "version")
    except ValueError as e:
        raise CheckpointError(f"line 1: {e}", path=path, position=version_line.position) from None
    if version < PARTITION_METADATA_VERSION:
        raise CheckpointError(f"line 1: unrecognised version {version}", path=path, position=version_line.position)

    id_line, id_text = field(1, "topic_id")
    try:
        topic_id = topic_id_from_base64(id_text)
    except ValueError as e:
        raise CheckpointError(f"line 2: {e}", path=path, position=id_line.position) from None
    if topic_id.int == 0:
        raise CheckpointError("line 2: the zero UUID is not a valid topic id", path=path, position=id_line.position)
    return PartitionMetadata(version, topic_id)


def read_partition_metadata(path: str | os.PathLike) -> PartitionMetadata:
    return decode_partition_metadata(read_checkpoint_bytes(path, PARTITION_METADATA), path=path)


def write_partition_metadata(path: str | os.PathLike, metadata: PartitionMetadata) -> None:
    write_atomically(path, encode_partition_metadata(metadata))


# --- meta.properties ----------------------------------------------------------------------------

META_PROPERTIES = "meta.properties"


@dataclass(frozen=True, slots=True)
class MetaProperties:
    """A log dir's ``meta.properties`` (Kafka's MetaProperties): ``version=0`` is a ZooKeeper-mode
    broker's (``broker.id``, which may be absent), ``version=1`` a KRaft node's (``node.id`` and
    ``cluster.id`` required, ``directory.id`` optional)."""

    version: int
    node_id: int | None  # node.id (version 1) or broker.id (version 0)
    cluster_id: str | None
    directory_id: uuid.UUID | None = None


def parse_java_properties(data: bytes, *, path: str | os.PathLike | None = None) -> dict[str, tuple[str, int]]:
    """java.util.Properties.load of ISO-8859-1 bytes: key → (value, byte position of its line).

    Comment lines start with ``#`` or ``!``; the key ends at the first unescaped ``=``, ``:`` or
    blank, with blanks and one separator skipped; a line ending in an odd number of backslashes
    continues on the next (its leading blanks dropped); ``\\t \\n \\r \\f \\uXXXX`` are escapes, any
    other escaped character stands for itself. A later key replaces an earlier one, as in Java.
    """
    text = data.decode("latin-1")
    props: dict[str, tuple[str, int]] = {}
    lines = text.splitlines(keepends=True)
    position = 0
    i = 0
    while i < len(lines):
        start = position
        line = lines[i].rstrip("\r\n").lstrip(" \t\f")
        position += len(lines[i])
        i += 1
        if not line or line[0] in "#!":
            continue
        while _ends_in_continuation(line) and i < len(lines):
            line = line[:-1] + lines[i].rstrip("\r\n").lstrip(" \t\f")
            position += len(lines[i])
            i += 1
        if _ends_in_continuation(line):
            line = line[:-1]  # a continuation at the end of the file continues onto nothing
        key_end = 0
        while key_end < len(line) and line[key_end] not in "=: \t\f":
            key_end += 2 if line[key_end] == "\\" else 1
        key_end = min(key_end, len(line))
        rest = line[key_end:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        try:
            props[_unescape(line[:key_end])] = (_unescape(rest), start)
        except ValueError as e:
            raise CheckpointError(f"{e}", path=path, position=start) from None
    return props


def _ends_in_continuation(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        c = text[i + 1]
        if c == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"malformed \\uxxxx escape {text[i:i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(c, c))
            i += 2
    return "".join(out)


def decode_meta_properties(data: bytes, *, path: str | os.PathLike | None = None) -> MetaProperties:
    """Read ``meta.properties`` as Kafka's MetaProperties.Builder does; CheckpointError (file and
    byte of the bad line) for an unknown version, a missing required property or a bad number."""
    props = parse_java_properties(data, path=path)

    def value(key: str) -> tuple[str, int] | None:
        return props.get(key)

    def java_int(key: str) -> int | None:
        found = value(key)
        if found is None:
            return None
        try:
            return parse_java_int(found[0].strip(), 32, key)
        except ValueError as e:
            raise CheckpointError(f"{e}", path=path, position=found[1]) from None

    version_entry = value("version")
    version = java_int("version") if version_entry is not None else 0
    if version not in (0, 1):
        raise CheckpointError(f"unknown meta.properties version {version} (Kafka knows 0 and 1)",
                              path=path, position=version_entry[1] if version_entry else 0)
    cluster = value("cluster.id")
    cluster_id = cluster[0] if cluster is not None else None
    if version == 0:
        node_id = java_int("broker.id")  # a ZooKeeper broker's file may lack it (broker.id.generation)
    else:
        node_id = java_int("node.id")
        for key, present in (("node.id", node_id is not None), ("cluster.id", cluster_id is not None)):
            if not present:
                raise CheckpointError(f"version 1 requires {key}, which is missing", path=path, position=len(data))
    directory_id = None
    directory = value("directory.id")
    if directory is not None:
        try:
            directory_id = topic_id_from_base64(directory[0])
        except ValueError as e:
            raise CheckpointError(f"directory.id: {e}", path=path, position=directory[1]) from None
    return MetaProperties(version, node_id, cluster_id, directory_id)


def read_meta_properties(path: str | os.PathLike) -> MetaProperties:
    """``meta.properties`` at ``path``; :class:`MissingCheckpointError` when there is none."""
    return decode_meta_properties(read_checkpoint_bytes(path, META_PROPERTIES), path=path)
